"""The newest build hosts: during a rolling deploy, hosts of an older build hand their
shards to a live host of the newest one (issue 24 item 4, the local backend).

*Newest* is decided per entity type by the registry of builds
(`runtime._build_registration`): a type's newest build is the last one registered as a
new release (`newest_build`; an old release started late is registered as older and
never becomes it). A host is *on the
newest* when it runs the newest build of every type it hosts; when a release changes
only some types, the unchanged ones keep their build, which is still their newest, so
release 2's hosts are on the newest and release 1's are not. A host *supersedes*
another when it is on the newest, the other is not, and it hosts every type the other
does (so a moved shard strands no type).

Each round (every third of a lease term, or at once after a round that moved shards)
a host that receives shards reads the distinct sets of builds live hosts run (one row
per release, however many hosts: `settled`), and only when it supersedes one of them
the registry's live hosts and the lease holders, then (`plan`):

* if a live host supersedes it, it *yields*: it takes no free shard, only those handed
  to it, so what it hands over never comes straight back (no ping-pong); it keeps
  accepting messages like any client while its shards move away;
* if it is on the newest, it requests (`request_shards`, the graceful hand-off) at most
  `moves_per_round` of the shards held by hosts it supersedes, so a deploy moves a
  slice of the shards at a time rather than every one in one instant (Akka's rebalance
  limit). Two such hosts start from different shards (a hash of their names).

So a rolling restart of the application processes moves every entity onto the new
code within a few rounds, and an entry that only the new code understands, which an
old host leaves waiting (`_awaiting`), is applied by the new code as soon as its shard
moves. A host of the newest build that dies stays "live" in the registry until its
registration expires (two lease terms): the yielding hosts take its shards then.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from corral.persistence import BuildRecord, newest_build

__all__ = ["Plan", "moves_per_round", "plan", "settled"]

Builds = Mapping[str, str]  # one process's {entity type: fingerprint}


def moves_per_round(shards: int) -> int:
    """How many shards a host requests per round: a quarter of them, at least one (a
    round that moved shards is followed by the next at once, so 16 shards move in four
    rounds of a fraction of a second each; each shard pauses only for its own hand-off,
    see `benchmarks/handoff.py`)."""
    return max(1, shards // 4)


@dataclass(frozen=True, slots=True)
class Plan:
    """One round's decision for one host."""

    yielding: bool
    """A live host supersedes this one: take only the shards handed to it."""
    requests: tuple[int, ...]
    """The shards to request from the hosts this one supersedes."""


def plan(me: str, mine: Builds, records: Sequence[BuildRecord],
         holders: Mapping[int, str], *, limit: int) -> Plan:
    """The round of host `me` running `mine`, given the registry (`records`, with their
    live processes) and the lease holders ({shard: owner})."""
    hosts: dict[str, dict[str, str]] = {}
    for b in records:
        for p in b.processes:
            if p.role == "host" and p.process != me:
                hosts.setdefault(p.process, {})[b.entity_type] = b.fingerprint
    newest = {t: n.fingerprint for t in {b.entity_type for b in records}
              if (n := newest_build(records, t)) is not None}
    yielding = any(_supersedes(theirs, mine, newest) for theirs in hosts.values())
    theirs = sorted((s for s, owner in holders.items()
                     if owner in hosts and _supersedes(mine, hosts[owner], newest)),
                    key=lambda s: zlib.crc32(f"{me}/{s}".encode()))
    return Plan(yielding, tuple(sorted(theirs[:limit])))


def settled(mine: Builds, records: Sequence[BuildRecord], host_sets: Sequence[Builds]
            ) -> Plan | None:
    """The round's `plan` decided from the distinct sets of builds the other live hosts
    run (`Store.host_builds`: one row per release, not per host), or None when this
    host supersedes one of them: then `plan` needs every host and lease holder, which
    only a rolling deploy costs. The same decision as `plan`: without a host this one
    supersedes it requests nothing, and whether it yields depends only on the sets."""
    newest = {t: n.fingerprint for t in {b.entity_type for b in records}
              if (n := newest_build(records, t)) is not None}
    if any(_supersedes(mine, theirs, newest) for theirs in host_sets):
        return None
    return Plan(any(_supersedes(theirs, mine, newest) for theirs in host_sets), ())


def _on_newest(builds: Builds, newest: Builds) -> bool:
    return all(newest.get(t, f) == f for t, f in builds.items())


def _supersedes(a: Builds, b: Builds, newest: Builds) -> bool:
    return _on_newest(a, newest) and not _on_newest(b, newest) and set(b) <= set(a)
