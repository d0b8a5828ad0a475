"""The `Entity` base class: the programming model users subclass."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, ClassVar

from ._context import EntityContext, Mailbox
from ._definition import EntityDefinition, define_entity
from ._policy import IdReusePolicy, SnapshotPolicy

__all__ = ["Entity"]


class Entity:
    """A long-lived, addressable object identified by a business key.

    Subclass it, declare handlers with `@corral.signal`, `@corral.update` and
    `@corral.query`, and optionally an `async def run(self)` main loop. The host calls
    `__init__(start_input)` (taking one pydantic model, or nothing) before any handler,
    then replays the entity's journal, then starts `run()`.

    `run()` is restartable: after a crash it is called again from the top with the
    rebuilt state, so loop over state (`self.inbox`), never over local variables.

    Example:
        class Cart(corral.Entity):
            def __init__(self, init: CartInput) -> None:
                self.items: list[Item] = []

            @corral.signal
            def add(self, item: Item) -> None:
                self.items.append(item)

            @corral.query
            def total(self) -> Total:
                return Total(count=len(self.items))
    """

    id_reuse: ClassVar[IdReusePolicy] = IdReusePolicy.ALLOW_DUPLICATE
    """What `*_with_start` does once a run closed (see `IdReusePolicy`)."""

    snapshots: ClassVar[SnapshotPolicy] = SnapshotPolicy()
    """When state is snapshotted and how many snapshots are kept (see `SnapshotPolicy`)."""

    _corral_definition: ClassVar[EntityDefinition]
    _corral_context: EntityContext
    mailbox: Mailbox
    """Payloads of mailbox signals (declared as `name = corral.signal(Model)`)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # The frame defining the class, so annotations may name models local to it.
        localns = sys._getframe(1).f_locals
        cls._corral_definition = define_entity(cls, localns, has_run=cls.run is not Entity.run)

    async def run(self) -> Any:
        """The main loop. The default keeps the entity alive until it is terminated."""
        await self.wait_for(lambda: False)

    async def wait_for(
        self, predicate: Callable[[], object], *, timeout: float | None = None
    ) -> bool:
        """Wait until `predicate()` is truthy; re-checked after every applied message.

        Returns True when the predicate holds, False when `timeout` seconds passed first.
        """
        return await self._corral_context.wait_for(predicate, timeout)

    async def checkpoint(self) -> None:
        """Snapshot the state now (e.g. before an effect `run()` must not repeat).

        After a crash, `run()` restarts from the top with the state of the latest
        snapshot plus the messages applied after it.
        """
        await self._corral_context.checkpoint()

    def __getstate__(self) -> dict[str, Any]:
        """What a snapshot holds: the instance's attributes minus the host's context.

        Override `__getstate__`/`__setstate__` to customise snapshots (pickle protocol).
        """
        state = self.__dict__.copy()
        state.pop("_corral_context", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @property
    def key(self) -> str:
        """This entity's business key, e.g. `"ticket-9104"`."""
        return self._corral_context.key

    @property
    def run_id(self) -> int:
        """The number of the current run (1 for the first, +1 for each new run)."""
        return self._corral_context.run_id
