"""Poison messages: a signal handler that raises is retried, then dead-lettered.

A live host applies every signal and update entry through `apply_live`. A signal whose
handler raises is called again after a backoff, up to the type's
`RetryPolicy.max_attempts` calls in all; the entity's later entries wait meanwhile, so
order is kept. This module only decides: it returns a verdict (`Applied`, or
`Poisoned` with the error and the traceback text) and writes nothing. The activation
acts on it: it moves the entry to the `dead_letters` table (a fenced write), counts it
as applied, and goes on with its next entry.

Recovery never applies a dead-lettered entry again, for two reasons:

* right after the dead letter is recorded the host snapshots the entity at that entry,
  so recovery starts after it (and replaying or discarding the dead letter, which
  deletes its row, cannot make a later recovery apply the original entry again);
* should that snapshot be missing (a crash between the two writes, or state that does
  not pickle), a replayed entry whose run and seq have a dead letter row is skipped
  without calling the handler. The dead-lettered seqs of a run are read once per
  lease epoch (only the lease holder writes dead letters) and cached by the shard.

An entry whose retries were cut short by a crash has no dead letter yet: recovery
retries it from the first attempt, and it is dead-lettered then if it still fails.

Updates are not retried: a raising update handler's error is recorded as its outcome
and its caller gets `UpdateFailedError`. Read-only replicas (`query` from a process
that does not host the entity) apply entries through `apply_entry`, without retries.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from corral.actors import (
    ContinueAsNew,
    Entity,
    EntityDefinition,
    HandlerDefinition,
    HandlerKind,
)
from corral.persistence import EntryKind, JournalEntry, UpdateOutcome

from ._apply import Unappliable, apply_entry, decode_arg

__all__ = ["Applied", "Poisoned", "Verdict", "apply_live", "retried_handler"]

log = logging.getLogger("corral.poison")


@dataclass(frozen=True)
class Applied:
    """The entry is applied; `outcome` is an update's, to record for its callers."""

    outcome: UpdateOutcome | None = None


@dataclass(frozen=True)
class Poisoned:
    """The verdict on a poison entry: move it to the dead letters. Its signal handler
    raised on every one of `attempts` calls, or this code cannot apply it (`attempts` 0:
    no handler of its name, a payload today's model refuses). It counts as applied all
    the same; an update's caller gets `outcome`, which says why.

    Not `corral.persistence.DeadLetter`, the stored row the activation writes from this
    verdict (with the entry's identity and the time)."""

    error: str
    traceback: str = ""
    attempts: int = 0
    outcome: UpdateOutcome | None = None


Verdict = Applied | Poisoned


async def apply_live(definition: EntityDefinition, entity: Entity, entry: JournalEntry, *,
                     attempt: Callable[[], None] = lambda: None) -> Verdict:
    """Apply a signal or update entry on a live host, retrying a raising signal handler
    under the type's `RetryPolicy`; the verdict says what the host must record.

    Signals with a handler body get the retry policy and the `Poisoned` verdict once it runs out;
    updates and mailbox signals are applied by `apply_entry`. `attempt` is called before
    each call of the handler (the host starts collecting what that call sends).
    """
    try:
        handler = retried_handler(definition, entry)
        if handler is None:
            attempt()
            return Applied(await apply_entry(definition, entity, entry))
        arg = decode_arg(handler, entry)
    except Unappliable as why:
        outcome = UpdateOutcome(None, f"DeadLettered: {why.reason}") \
            if entry.kind is EntryKind.UPDATE else None
        return Poisoned(why.reason, outcome=outcome)
    policy = definition.retry
    limit = policy.max_attempts or 1  # never None: the definition refuses it for `retry`
    attempts = 0
    err: Exception | None = None  # the last call's
    while err is None or attempts < limit:
        if err is not None:
            delay = policy.backoff(attempts)
            log.warning("%s %r: signal %r (seq %d) raised %s: %s; attempt %d of %d, retrying "
                        "in %.3fs", entry.entity_type, entry.key, entry.name, entry.seq,
                        type(err).__name__, err, attempts, policy.max_attempts, delay)
            await asyncio.sleep(delay)
        attempts += 1
        attempt()
        try:
            result = _call(handler, entity, arg)
            if handler.is_async:
                await result
            return Applied()
        except ContinueAsNew:
            _continue_in_handler(entry)
            return Applied()
        except Exception as error:
            err = error
    return Poisoned(f"{type(err).__name__}: {err}", "".join(traceback.format_exception(err)),
                      attempts)


def retried_handler(definition: EntityDefinition, entry: JournalEntry
                    ) -> HandlerDefinition | None:
    """The handler body of a signal entry, which the retry policy covers; None for an
    update, a mailbox signal or an entry without a handler."""
    handler = definition.handler(entry.name)
    if entry.kind is not EntryKind.SIGNAL or handler is None \
            or handler.kind is not HandlerKind.SIGNAL or handler.fn is None:
        return None
    return handler


def _call(handler: HandlerDefinition, entity: Entity, arg: tuple[BaseModel, ...]) -> Any:
    """The handler's return value: a coroutine when it is async."""
    fn = handler.fn
    assert fn is not None
    return fn(entity, *arg)


def _continue_in_handler(entry: JournalEntry) -> None:
    log.error("%s %r: continue_as_new() called in handler %r (seq %d); call it from run(). "
              "Ignored.", entry.entity_type, entry.key, entry.name, entry.seq)
