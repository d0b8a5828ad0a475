"""Never a silent skip: an entry whose handler this build lacks, while a live build of
its type has it (or the newest registered build has it: a rollback runs an older build
on purpose), waits for a host on that build.

During a rolling deploy a process of the new release (a host or a pure client) may
accept a message of a handler it adds while a host of the old release still holds the
entity's shard. That host must not dead-letter it: the entry is fine, only this host is
too old. So the host suspends the run (`Suspension`, its reason naming the build that
knows the handler), checks again every `RECHECK` seconds, and a host that takes the
shard (one on the new build, e.g. after this one restarts) applies it at once, in
order. A rollback (a Ray deployment declaring an older release again) is the same
wait: what only the newest build has stays in the journal until it is deployed again,
nothing dead-lettered. With no such build knowing the handler (it was removed, or
misspelt by an earlier release), the entry becomes a replayable dead letter as before.

Why waiting rather than refusing the send with a retryable error: the sender's build
knows the handler and its acceptance is durable and deduplicated; refusing it would
need every send to ask which build hosts the shard (a read on the hot path), and a
message accepted just before a hand-off would still meet the old host. The wait costs
nothing until it happens and keeps every entity's order.
"""

from __future__ import annotations

from corral.actors import HandlerKind
from corral.persistence import JournalEntry, Suspension

from .._build_registration import build_knowing
from ._residence import Residence

__all__ = ["RECHECK", "AwaitingBuild", "awaiting_suspension", "check_awaiting"]

RECHECK = 2.0
"""Seconds between a waiting run's checks for a host on a build that knows its entry."""


class AwaitingBuild(Exception):
    """This build lacks the handler of an entry that a live build has: the run waits."""


async def check_awaiting(home: Residence, entry: JournalEntry) -> None:
    """Raise `AwaitingBuild` if `entry` has no signal or update handler in this code
    while a live build of its type has one; return if the entry may be dead-lettered.

    Raises:
        AwaitingBuild: with the reason the suspension records.
    """
    definition = home.definition
    handler = definition.handler(entry.name)
    if handler is not None and handler.kind is not HandlerKind.QUERY:
        return  # it has the handler: the payload is what this code refuses
    knower = await build_knowing(home.store, definition, entry.name)
    if knower is not None:
        raise AwaitingBuild(
            f"waiting for a host on a build that knows {entry.kind.value} {entry.name!r} "
            f"(seq {entry.seq}): this build {definition.fingerprint} of "
            f"{definition.name} has no such handler; {knower}")


def awaiting_suspension(home: Residence, run_id: int, err: AwaitingBuild) -> Suspension:
    """The suspension of a run that waits for a build (never counted as a failure)."""
    held = home.suspended()
    same = held is not None and held.run_id == run_id
    now = home.clock.time()
    return Suspension(home.entity_type, home.key, run_id, str(err),
                      held.attempts if held is not None and same else 0,
                      held.since if held is not None and same else now, now + RECHECK)
