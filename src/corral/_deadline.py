"""`within`: a bounded wait that is told apart from a `TimeoutError` raised inside, and
that never loses its caller's cancellation. A leaf of the package (it imports nothing
of corral): the store's waits and the runtime's use it alike.

On Python 3.11+ `asyncio.TimeoutError` is the builtin `TimeoutError`, so the one
`asyncio.wait_for` raises at its deadline and one a driver raised inside the awaited
call (a statement timed out) are the same type: catching it to say "not done within N
s" then said so of a call that failed after 3 s. `within` raises its own `Expired`,
only when the deadline passed.

Before Python 3.12, `asyncio.wait_for` also lost a cancellation that came while the
awaited call had just finished (it returned the call's result instead): a loop waiting
on an event with a timeout went on looping after its task was cancelled, and whatever
awaited that task waited forever (a host's close, on its journal tail). `within`
waits with `asyncio.wait`, which never swallows it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["Expired", "within"]

T = TypeVar("T")


class Expired(Exception):
    """The caller's deadline passed before the call finished (the call was cancelled)."""


async def within(call: Awaitable[T], timeout: float | None) -> T:
    """`await call` for at most `timeout` seconds (None: no bound); `Expired` if it
    did not finish by then. Whatever `call` raises (a `TimeoutError` too) propagates."""
    if timeout is None:
        return await call
    task = asyncio.ensure_future(call)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    except BaseException:  # the caller was cancelled: so is its call
        task.cancel()
        raise
    if task in done:
        return task.result()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise Expired
