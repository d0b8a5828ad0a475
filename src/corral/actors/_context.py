"""The seam between an entity and its host.

An `Entity` never imports the runtime. The host implements `EntityContext` and
attaches it to each instance before `__init__` runs; entity methods call into it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from corral._common import RetryPolicy

__all__ = ["EntityContext", "Mailbox"]


class EntityContext(Protocol):
    """What the host provides to one activation of an entity."""

    @property
    def entity_type(self) -> str: ...
    @property
    def key(self) -> str: ...
    @property
    def run_id(self) -> int: ...

    async def wait_for(self, predicate: Callable[[], object], timeout: float | None) -> bool:
        """Wait until `predicate()` is truthy (re-checked after every applied message)."""
        ...

    def notify(self) -> None:
        """State changed outside a handler (e.g. the mailbox): re-check waiters."""
        ...

    async def checkpoint(self) -> None:
        """Snapshot the entity's state now."""
        ...

    async def sleep_until(self, deadline: float) -> None:
        """Sleep until wall-clock `deadline` under a durable timer."""
        ...

    async def wait_signal(self, name: str, timeout: float | None) -> str:
        """Wait for the durable signal wait `name` of this run to be delivered; the
        payload's JSON. Raises `SignalTimeoutError` once it timed out (or its run ended)."""
        ...

    async def step(self, fn: Callable[..., Any], args: tuple[Any, ...], *, name: str,
                   retry: RetryPolicy | None, timeout: float | None,
                   ray_options: dict[str, Any] | None) -> Any:
        """Run `fn(*args)` as the durable step `name` of this run, or return (raise)
        its recorded outcome."""
        ...

    def send(self, entity_type: type, key: str, handler: object, payload: object,
             start: object, with_start: bool) -> None:
        """Keep a message to another entity, checked, for the next write of progress."""
        ...

    @property
    def continue_as_new_suggested(self) -> bool: ...

    def now(self) -> float:
        """The host clock's wall time (virtual under `corral.testing`)."""
        ...


class Mailbox:
    """Payloads of mailbox signals, in acceptance order, waiting for `run()`.

    `run()` drains it with `async for reply in self.mailbox:` or `self.mailbox.drain()`.
    The mailbox is part of the entity's state: what was delivered but not yet taken is
    kept across snapshots and carried to the next run by continue-as-new. Each payload
    is kept with the journal entry it came from (`token`), which is what gets carried.
    """

    __slots__ = ("_context", "_items")

    def __init__(self, context: EntityContext | None = None) -> None:
        # (payload, token) pairs, allocated on first use: most mailboxes stay empty.
        self._items: deque[tuple[Any, Any]] | None = None
        self._context = context

    def put(self, item: Any, token: Any = None) -> None:
        if self._items is None:
            self._items = deque()
        self._items.append((item, token))
        if self._context is not None:
            self._context.notify()

    def drain(self) -> list[Any]:
        """Take every waiting payload without waiting."""
        items = [item for item, _ in self._items or ()]
        self._items = None
        return items

    def pending_tokens(self) -> list[Any]:
        """The tokens of payloads not yet taken (the host carries them over)."""
        return [token for _, token in self._items or ()]

    async def get(self, *, timeout: float | None = None) -> Any | None:
        """Wait for the next payload; None if `timeout` passes first."""
        if not self._items:
            assert self._context is not None, "mailbox used outside a running entity"
            if not await self._context.wait_for(lambda: self._items, timeout):
                return None
        assert self._items is not None
        return self._items.popleft()[0]

    def __len__(self) -> int:
        return len(self._items) if self._items is not None else 0

    def __bool__(self) -> bool:
        return bool(self._items)

    async def __aiter__(self) -> AsyncIterator[Any]:
        while True:
            yield await self.get()

    def __getstate__(self) -> dict[str, Any]:
        return {"items": list(self._items or ())}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._items = deque(state["items"]) if state["items"] else None
        self._context = None

    def attach(self, context: EntityContext) -> None:
        """Bind a restored mailbox to its new host."""
        self._context = context
