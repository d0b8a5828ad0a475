"""The registry of builds: records and reads, written once for both engines.

A build is one definition of an entity type (its fingerprint), with the manifest its
code derived (`corral.actors._manifest`), when a process first and last ran it, and the
processes running it now: each registers on open and refreshes its row before
`expires_at` (`RegisterBuildsOp`); a process that stops refreshing is no longer live.
Whether two builds may run side by side is decided above the store (`actors._compat`);
the store answers the facts it needs (`names_in_use`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ._txn import Txn

__all__ = ["BuildCheck", "BuildFacts", "BuildProcess", "BuildRecord", "BuildRegistry",
           "TxnBuildFacts", "builds", "host_builds", "names_in_use", "newest_build"]


@dataclass(frozen=True, slots=True)
class BuildProcess:
    """A live process running a build: a shard `host` or a pure `client`."""

    process: str
    role: str
    last_seen: float


@dataclass(frozen=True, slots=True)
class BuildRecord:
    """One registered build of an entity type, with its live processes."""

    entity_type: str
    fingerprint: str
    manifest: str
    """The manifest as canonical JSON text."""
    first_seen: float
    last_seen: float
    older: bool = False
    """It arrived after a newer build of its type (an old release started late)."""
    processes: tuple[BuildProcess, ...] = ()


class BuildFacts(Protocol):
    """What deciding whether a build may run reads of the registry (a `Store`, or one
    transaction: `TxnBuildFacts`)."""

    async def builds(self, etype: str | None = None) -> list[BuildRecord]:
        """Registered builds (of one type, or all), oldest first, with live processes."""
        ...

    async def names_in_use(self, etype: str, names: Sequence[str]) -> dict[str, str]:
        """Of `names`, those the store still holds journal entries or dead letters of,
        each with a description of what it holds."""
        ...


BuildCheck = Callable[[BuildFacts], Awaitable[frozenset[str]]]
"""The decision on a process's builds, over the registry as it stands: the types whose
build is older than the newest, or a `CorralError` raised to refuse them all. It only
reads through the facts it is given (and never waits on anything else: on SQLite it
runs in the writer's thread)."""


class TxnBuildFacts:
    """`BuildFacts` read inside one transaction."""

    __slots__ = ("_txn",)

    def __init__(self, txn: Txn) -> None:
        self._txn = txn

    async def builds(self, etype: str | None = None) -> list[BuildRecord]:
        return await builds(self._txn, etype)

    async def names_in_use(self, etype: str, names: Sequence[str]) -> dict[str, str]:
        return await names_in_use(self._txn, etype, tuple(names))


class BuildRegistry(Protocol):
    """The store's role for the registry of builds: any process registers its own and
    reads every one."""

    async def register_builds(self, process: str, role: str,
                              builds: Sequence[tuple[str, str, str]], *, ttl: float,
                              older: frozenset[str] = frozenset(),
                              check: BuildCheck | None = None) -> float:
        """Record or refresh `process` (role `host` or `client`) on these builds
        ((entity type, fingerprint, manifest JSON) each), live for `ttl` seconds from
        the store's clock, whose reading it returns. A new build of a type in `older`
        arrives after a newer one: it is recorded as older, never the newest.

        With `check` (a process opening), the decision and the registration are one:
        in the same transaction, serialised with every other checked registration
        (SQLite's write lock; PostgreSQL an advisory lock), `check` reads the registry
        and answers `older` or refuses (its error raised, nothing registered), so of
        two incompatible builds opened at once the second sees the first."""
        ...

    async def forget_process(self, process: str) -> None:
        """`process` stopped: it runs no build any more."""
        ...

    async def builds(self, etype: str | None = None) -> list[BuildRecord]:
        """Registered builds (of one type, or all), oldest first, with live processes."""
        ...

    async def host_builds(self, exclude: str) -> tuple[list[BuildRecord], list[dict[str, str]]]:
        """The registered builds (without their processes), and the distinct sets of
        builds ({entity type: fingerprint}) that live hosts other than `exclude` run:
        as many rows as there are releases live, however many hosts run them (a host
        planning its round, `runtime/host/_newest`, reads this every round)."""
        ...

    async def names_in_use(self, etype: str, names: Sequence[str]) -> dict[str, str]:
        """Of `names`, those the store still holds journal entries or dead letters of,
        each with a description of what it holds."""
        ...


async def builds(q: Txn, etype: str | None) -> list[BuildRecord]:
    """Registered builds (of one type, or all), oldest first within each type, each
    with the processes whose registration has not expired."""
    where, args = ("WHERE etype = ? ", (etype,)) if etype is not None else ("", ())
    rows = await q.fetchall(
        "SELECT etype, fingerprint, manifest, first_seen, last_seen, older FROM builds "
        f"{where}ORDER BY etype, first_seen, fingerprint", *args)
    live: dict[tuple[str, str], list[BuildProcess]] = {}
    for r in await q.fetchall(
            "SELECT etype, fingerprint, process, role, last_seen FROM build_processes "
            f"WHERE expires_at >= ? {where.replace('WHERE', 'AND')}ORDER BY process",
            await q.clock(), *args):
        live.setdefault((r[0], r[1]), []).append(BuildProcess(r[2], r[3], r[4]))
    return [BuildRecord(r[0], r[1], r[2], r[3], r[4], bool(r[5]),
                        tuple(live.get((r[0], r[1]), ()))) for r in rows]


_TYPE_SEP, _BUILD_SEP = "\x1f", "\x1e"  # in no entity type name nor fingerprint
_HOST_SETS = """
SELECT b.k, count(*) FROM (
    SELECT p.process, {joined} AS k FROM (
        SELECT process, etype, fingerprint FROM build_processes
        WHERE role = 'host' AND expires_at >= ? AND process <> ? ORDER BY process, etype
    ) AS p GROUP BY p.process
) AS b GROUP BY b.k
"""


async def host_builds(q: Txn, exclude: str) -> tuple[list[BuildRecord], list[dict[str, str]]]:
    """See `BuildRegistry.host_builds`: two statements, one row per build and one per
    distinct set of builds, whatever the number of hosts."""
    rows = await q.fetchall(
        "SELECT etype, fingerprint, manifest, first_seen, last_seen, older FROM builds "
        "ORDER BY etype, first_seen, fingerprint")
    records = [BuildRecord(r[0], r[1], r[2], r[3], r[4], bool(r[5])) for r in rows]
    joined = q.joined("p.etype || ? || p.fingerprint", "?", order="p.etype")
    sets = await q.fetchall(_HOST_SETS.format(joined=joined), _TYPE_SEP, _BUILD_SEP,
                            await q.clock(), exclude)
    return records, [dict(b.split(_TYPE_SEP, 1) for b in r[0].split(_BUILD_SEP))
                     for r in sets]


def newest_build(builds: Sequence[BuildRecord], etype: str) -> BuildRecord | None:
    """The newest build of `etype` among `builds`: the last registered not as older."""
    of_type = [b for b in builds if b.entity_type == etype]
    fallback = of_type[-1] if of_type else None
    return next((b for b in reversed(of_type) if not b.older), fallback)


async def names_in_use(q: Txn, etype: str, names: Sequence[str]) -> dict[str, str]:
    """Of `names` (handlers or waits of `etype`), those the store still holds messages
    of, each with what it holds: "2 journal entries, 1 dead letter"."""
    if not names:
        return {}
    marks = ", ".join("?" * len(names))
    held: dict[str, list[str]] = {}
    for table, one, many in (("journal", "journal entry", "journal entries"),
                             ("dead_letters", "dead letter", "dead letters")):
        for name, count in await q.fetchall(
                f"SELECT name, count(*) FROM {table} WHERE etype = ? AND name IN ({marks}) "
                "GROUP BY name ORDER BY name", etype, *names):
            held.setdefault(name, []).append(f"{count} {one if count == 1 else many}")
    return {name: ", ".join(what) + " remain" for name, what in held.items()}
