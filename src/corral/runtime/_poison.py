"""Poison messages: a signal handler that raises is retried, then dead-lettered.

A live host applies every journal entry through `apply_live`, or a sync signal handler's
first attempt through `apply_now` (no await: `Activation._apply_now`). A signal whose
handler raises is called again after a backoff, up to the type's `RetryPolicy.max_attempts`
calls in all; the entity's later entries wait meanwhile, so order is kept. After the last
attempt the entry moves to the `dead_letters` table (a fenced write, with the error and
the traceback text), counts as applied, and the entity goes on with its next entry.

Recovery never applies a dead-lettered entry again, for two reasons:

* right after the dead letter is recorded the host snapshots the entity at that entry,
  so recovery starts after it (and replaying or discarding the dead letter, which
  deletes its row, cannot make a later recovery apply the original entry again);
* should that snapshot be missing (a crash between the two writes, or state that does
  not pickle), a replayed entry whose run and seq have a dead letter row is skipped
  without calling the handler. The dead-lettered seqs of a run are read once per
  `Shard` (one lease epoch: only the lease holder writes dead letters) and cached on it.

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
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

import corral.metrics as metrics
from corral._errors import StoreError
from corral.actors import (
    ContinueAsNew,
    Entity,
    EntityDefinition,
    HandlerDefinition,
    HandlerKind,
)
from corral.persistence import EntryKind, JournalEntry, UpdateOutcome

from ._apply import Unappliable, apply_entry, decode_arg
from ._events import lifecycle

if TYPE_CHECKING:
    from ._activation import Activation
    from ._shard import Shard

__all__ = ["apply_live", "apply_now", "retried_handler"]

log = logging.getLogger("corral.poison")

_CACHE_SIZE = 4096


async def apply_live(shard: Shard, act: Activation, entry: JournalEntry, *,
                     replaying: bool, failed: Exception | None = None) -> UpdateOutcome | None:
    """Apply a signal or update entry on a live host; return the outcome for updates.

    Signals with a handler body get the retry policy and the dead-letter path; updates
    and mailbox signals are applied by `apply_entry`. An entry this code cannot apply
    (no handler of its name, a payload today's model refuses: `Unappliable`) moves to
    the dead letters at once, with the reason; an update's caller gets that reason.
    `failed`: the error of a first attempt already made by `apply_now`, which counts.
    """
    definition, entity = act.definition, act.entity
    assert entity is not None
    try:
        handler = retried_handler(definition, entry)
        if handler is None:
            return await apply_entry(definition, entity, entry)
        if isinstance(failed, Unappliable):
            raise failed
        arg = decode_arg(handler, entry)
    except Unappliable as why:
        return await _unappliable(shard, act, entry, why, replaying=replaying)
    if replaying and entry.seq in await _dead_lettered(shard, entry):
        log.info("%s %r: seq %d was dead-lettered before; not applied again",
                 entry.entity_type, entry.key, entry.seq)
        return None
    policy = definition.retry
    limit = policy.max_attempts or 1  # never None: the definition refuses it for `retry`
    attempts, err = (0, None) if failed is None else (1, failed)
    while err is None or attempts < limit:
        if err is not None:
            delay = policy.backoff(attempts)
            log.warning("%s %r: signal %r (seq %d) raised %s: %s; attempt %d of %d, retrying "
                        "in %.3fs", entry.entity_type, entry.key, entry.name, entry.seq,
                        type(err).__name__, err, attempts, policy.max_attempts, delay)
            await asyncio.sleep(delay)
        attempts += 1
        try:
            result = _call(handler, entity, arg)
            if handler.is_async:
                await result
            return None
        except ContinueAsNew:
            _continue_in_handler(entry)
            return None
        except Exception as error:
            err = error
    await _dead_letter(shard, act, entry, f"{type(err).__name__}: {err}",
                       "".join(traceback.format_exception(err)), attempts)
    return None


async def _unappliable(shard: Shard, act: Activation, entry: JournalEntry, why: Unappliable,
                       *, replaying: bool) -> UpdateOutcome | None:
    """Dead-letter an entry this code cannot apply (once: recovery finds its row)."""
    if not (replaying and entry.seq in await _dead_lettered(shard, entry)):
        await _dead_letter(shard, act, entry, why.reason, "", 0)
    if entry.kind is EntryKind.UPDATE:
        return UpdateOutcome(None, f"DeadLettered: {why.reason}")
    return None


def retried_handler(definition: EntityDefinition, entry: JournalEntry
                    ) -> HandlerDefinition | None:
    """The handler body of a signal entry, which the retry policy covers; None for an
    update, a mailbox signal or an entry without a handler."""
    handler = definition.handler(entry.name)
    if entry.kind is not EntryKind.SIGNAL or handler is None \
            or handler.kind is not HandlerKind.SIGNAL or handler.fn is None:
        return None
    return handler


def apply_now(entity: Entity, entry: JournalEntry, handler: HandlerDefinition
              ) -> Exception | None:
    """The first attempt of a sync signal handler, in the caller's frame (no task, no
    coroutine): None once applied, or the error it raised (`Unappliable` for a payload
    today's model refuses), for `apply_live(failed=...)` to retry under the type's
    `RetryPolicy` or dead-letter."""
    try:
        _call(handler, entity, decode_arg(handler, entry))
    except ContinueAsNew:
        _continue_in_handler(entry)
    except Exception as err:
        return err
    return None


def _call(handler: HandlerDefinition, entity: Entity, arg: tuple[BaseModel, ...]) -> Any:
    """The handler's return value: a coroutine when it is async."""
    fn = handler.fn
    assert fn is not None
    return fn(entity, *arg)


def _continue_in_handler(entry: JournalEntry) -> None:
    log.error("%s %r: continue_as_new() called in handler %r (seq %d); call it from run(). "
              "Ignored.", entry.entity_type, entry.key, entry.name, entry.seq)


async def _dead_letter(shard: Shard, act: Activation, entry: JournalEntry, error: str,
                       text: str, attempts: int) -> None:
    dead_id = await shard.store.record_dead_letter(
        shard.fence, entry, error=error, traceback=text, attempts=attempts,
        failed_at=shard.clock.time(),
    )
    metrics.dead_lettered(entry.entity_type)
    lifecycle("dead-lettered", entry.entity_type, entry.key, entry.run_id, seq=entry.seq,
              message_id=entry.message_id, dead_letter=dead_id)
    ident = (entry.entity_type, entry.key, entry.run_id)
    if ident in shard.dead_seqs:
        shard.dead_seqs[ident] = shard.dead_seqs[ident] | {entry.seq}
    log.error("%s %r: %s %r (seq %d) moved to dead letter %d after %d attempts: %s\n%s",
              entry.entity_type, entry.key, entry.kind.value, entry.name, entry.seq, dead_id,
              attempts, error, text)
    # Snapshot at this entry so that recovery starts after it (see the module docstring).
    act.applied_seq = entry.seq
    try:
        await act.snapshot()
    except StoreError:  # lease lost or store failing: the activation stops
        raise
    except Exception as snap_err:  # state that does not encode (SnapshotCaptureError)
        log.warning("%s %r: no snapshot after dead letter %d (%s: %s); recovery skips the "
                    "entry by its dead letter row", entry.entity_type, entry.key, dead_id,
                    type(snap_err).__name__, snap_err)


async def _dead_lettered(shard: Shard, entry: JournalEntry) -> frozenset[int]:
    ident = (entry.entity_type, entry.key, entry.run_id)
    cache = shard.dead_seqs
    seqs = cache.get(ident)
    if seqs is None:
        seqs = await shard.store.dead_letter_seqs(*ident)
        cache[ident] = seqs
        while len(cache) > _CACHE_SIZE:
            cache.popitem(last=False)
    else:
        cache.move_to_end(ident)
    return seqs
