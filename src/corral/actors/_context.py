"""The seam between an entity and its host.

An `Entity` never imports the runtime. The host implements `EntityContext` and
attaches it to each instance before `__init__` runs; entity methods call into it.
"""

from __future__ import annotations

import bisect
import functools
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol, overload

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

    A signal declared with a reorder window (`corral.signal(Reply, order_by="at",
    hold=2.0)`) puts its payloads in a held list, in the order of their field; each is
    released when its hold ran out, with every held payload ordered before it, in that
    order. `late` tells whether the payload `get` (or `async for`) just returned was
    ordered before one released earlier in this run; the highest released (`released`)
    is kept in the entity's snapshots, so the flag holds across a restart.
    """

    __slots__ = ("_context", "_held", "_items", "_last", "_last_token", "_puts", "late")

    def __init__(self, context: EntityContext | None = None) -> None:
        # (payload, token, late) triples, allocated on first use: most mailboxes stay empty.
        self._items: deque[tuple[Any, Any, bool]] | None = None
        # Windowed payloads not yet released: (order key, release time, payload, token),
        # by order key (arrival order among equal keys).
        self._held: list[tuple[Any, float, Any, Any]] = []
        self._last: Any = None  # the highest order key released
        self._last_token: Any = None  # the token of the payload that released it
        self._puts = 0
        self._context = context
        self.late = False

    def put(self, item: Any, token: Any = None, *, order: tuple[Any, float] | None = None
            ) -> None:
        """Add a payload; `order`: its (order key, release time) under a reorder window."""
        if order is None:
            if self._items is None:
                self._items = deque()
            self._items.append((item, token, False))
        else:
            key, release_at = order
            at = bisect.bisect_right([h[0] for h in self._held], key)
            self._held.insert(at, (key, release_at, item, token))
        self._puts += 1
        if self._context is not None:
            self._context.notify()

    def _release(self) -> None:
        """Move the held payloads that are due (and those ordered before them) to the
        ready queue, in order, flagging the late ones."""
        if not self._held or self._context is None:
            return
        now = self._context.now()
        due = [h[0] for h in self._held if h[1] <= now]
        if not due:
            return
        cut = max(due)
        released = [h for h in self._held if h[0] <= cut]
        self._held = [h for h in self._held if h[0] > cut]
        if self._items is None:
            self._items = deque()
        for key, _, item, token in released:
            late = self._last is not None and key < self._last
            if not late:
                self._last, self._last_token = key, token
            self._items.append((item, token, late))

    def _put_since(self, puts: int) -> bool:
        return self._puts != puts

    def _next_release(self) -> float | None:
        return min(h[1] for h in self._held) if self._held else None

    def drain(self) -> list[Any]:
        """Take every payload ready now without waiting (held ones stay held)."""
        self._release()
        items = [item for item, _, _ in self._items or ()]
        self._items = None
        return items

    def released(self) -> Any:
        """The token of the payload with the highest order key released so far (None:
        none yet): what a later payload is judged `late` against."""
        return self._last_token

    def restore_released(self, key: Any, token: Any) -> None:
        """Take up the watermark a snapshot kept: order key `key`, from `token`."""
        self._last, self._last_token = key, token

    def pending_tokens(self) -> list[Any]:
        """The tokens of payloads not yet taken, held ones included (the host carries
        them over)."""
        return [token for _, token, _ in self._items or ()] + [h[3] for h in self._held]

    @overload
    async def get(self) -> Any: ...
    @overload
    async def get(self, *, timeout: float | None) -> Any | None: ...

    async def get(self, *, timeout: float | None = None) -> Any | None:
        """Wait for the next payload; None if `timeout` passes first (without one, it
        waits for a payload: never None)."""
        deadline = None
        while True:
            self._release()
            if self._items:
                item, _, self.late = self._items.popleft()
                return item
            assert self._context is not None, "mailbox used outside a running entity"
            now = self._context.now()
            if deadline is None and timeout is not None:
                deadline = now + timeout
            if deadline is not None and now >= deadline:
                return None
            wake = [t for t in (deadline, self._next_release()) if t is not None]
            await self._context.wait_for(functools.partial(self._put_since, self._puts),
                                         max(0.0, min(wake) - now) if wake else None)

    def __len__(self) -> int:
        """Payloads not yet taken, held ones included."""
        return (len(self._items) if self._items is not None else 0) + len(self._held)

    def __bool__(self) -> bool:
        return bool(self._items) or bool(self._held)

    async def __aiter__(self) -> AsyncIterator[Any]:
        while True:
            yield await self.get()

    def __getstate__(self) -> dict[str, Any]:
        return {"items": [(item, token) for item, token, _ in self._items or ()],
                "held": list(self._held), "last": (self._last, self._last_token)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._items = deque((item, token, False) for item, token in state["items"]) \
            if state["items"] else None
        self._held = list(state.get("held", ()))
        self._last, self._last_token = state.get("last", (None, None))
        self._puts, self.late = 0, False
        self._context = None

    def attach(self, context: EntityContext) -> None:
        """Bind a restored mailbox to its new host."""
        self._context = context
