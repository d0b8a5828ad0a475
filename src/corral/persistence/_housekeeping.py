"""Housekeeping: a host's own rounds (lease renewal, its polls, progress, timers,
passivation, the registry of builds, the journal tail's reads), marked so a store may
serve them unhurried.

An idle host's rounds each run a statement now and then; two of them sometimes overlap.
A PostgreSQL store's pool (`_pg_pool.SharedPool`) opens another connection for a caller
that waited `PATIENCE` for a busy one: on a loaded machine an idle host's overlap
outlasted it now and then, and the host held three connections (one of four idle hosts
on the issue 42 benchmark). A statement run in `housekeeping()` waits up to
`HOUSEKEEPING_PATIENCE` instead, so an idle host keeps one pooled connection (with its
session's: two) whatever the load; work for callers (acceptances, queries, reads) keeps
the short patience. A write takes the patience of its batch: unhurried only if every op
in it was queued in housekeeping (`_batch.Batch`).

A context variable, so tasks a round starts inherit it (an activation a due timer
causes); nothing but a connection's wait depends on it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

__all__ = ["housekeeping", "in_housekeeping"]

_HOUSEKEEPING: ContextVar[bool] = ContextVar("corral_housekeeping", default=False)


@contextlib.contextmanager
def housekeeping(on: bool = True) -> Iterator[None]:
    """Run the block as housekeeping (`on`), or as work for a caller (not `on`)."""
    token = _HOUSEKEEPING.set(on)
    try:
        yield
    finally:
        _HOUSEKEEPING.reset(token)


def in_housekeeping() -> bool:
    """Whether the running code is a host's housekeeping."""
    return _HOUSEKEEPING.get()
