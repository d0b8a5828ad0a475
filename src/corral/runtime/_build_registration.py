"""This process's builds in the store's registry: refused at open if incompatible, kept
live while it runs, and the facts a host needs to never skip an entry silently.

On open (`BuildRegistration.open`) each entity type's manifest (`actors._manifest`) is
compared (`actors._compat`) with the newest build of the type the store holds:

* a build the store does not know yet is a new release, the new newest: it must be
  able to run beside the newest (`compare(newest, mine)`);
* a known build older than the newest (release 1 still running while release 2 rolls
  out, or a rollback) keeps working if the newest is a compatible successor of it
  (`compare(mine, newest)`);
* a build never seen that the newest shows to be older (the newest renames its names
  or upgrades from its state version: an old release started late) is registered as
  older, never the newest, under the same rule as a known older build.

A build is known by its fingerprint, the interface, which leaves the state's types and
the code out: a build whose fingerprint the store knows must also keep the state types
the store registered it with (`_restated`); an annotated attribute's type changed at
the same `state_version` would leave snapshots it cannot restore.

The facts the comparison needs about removed handlers and waits are read at that
moment: messages of them in the journal or the dead letters, and live processes whose
build has them (their senders). Any incompatible difference refuses the open with
`IncompatibleBuildError`, before this process registers or hosts anything. A
registered build whose manifest does not decode (a row damaged or written by hand) is
no build any process can run: every check ignores it, with a warning naming it
(`readable`), and `build_infos` lists it as incompatible with the `CorruptRowError`.
The check and the registration are one decision: they run in one store transaction,
serialised with every other process's (`Store.register_builds(check=...)`), so of two
incompatible builds opened at the same instant the second is checked against the
first and refused.

Liveness: every process (host or pure client) refreshes its registration on its own
timer, every quarter of its `ttl` (twice the lease ttl: 20 s by default), and drops it
on close; one that stops refreshing is no longer live once `ttl` has passed. A live
host's registration is also what makes it an heir for the shards of a host that closes
(`Store.live_hosts`) and what the newest build's hosts are found by (`_newest`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from corral._errors import CorruptRowError, IncompatibleBuildError, StoreError
from corral.actors import EntityDefinition
from corral.actors._compat import Difference, compare, incompatible, removed
from corral.actors._manifest import Manifest, manifest, manifest_json
from corral.persistence import BuildFacts, BuildProcess, BuildRecord, Row, Store, newest_build

__all__ = ["BuildInfo", "BuildRegistration", "build_infos", "build_knowing", "process_id",
           "refused_client", "refused_release"]

log = logging.getLogger("corral.builds")


def process_id() -> str:
    """A pure client's name in the registry (a host registers under its lease owner)."""
    return f"{os.getpid()}-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, slots=True)
class BuildInfo:
    """One registered build of an entity type, as `Runtime.builds()` reports it.

    Attributes:
        entity_type, fingerprint: which build.
        state_version: the version its snapshots are written at.
        first_seen, last_seen: when a process first and last registered it (epoch s).
        processes: the processes live on it now (`host` or `client`).
        newest: whether it is the type's newest build (the last one registered as a
            new release, not as an older one started late).
        compatible: whether the newest build may run beside it.
        why: "newest", or each difference from it to the newest, with the fix.
    """

    entity_type: str
    fingerprint: str
    state_version: int
    first_seen: float
    last_seen: float
    processes: tuple[BuildProcess, ...]
    newest: bool
    compatible: bool
    why: str


class BuildRegistration:
    """This process's registration in the registry of builds (see the module docstring)."""

    def __init__(self, store: Store, definitions: Mapping[str, EntityDefinition], *,
                 process: str, role: str, ttl: float) -> None:
        self.store = store
        self.process = process
        self._role = role
        self._ttl = ttl
        self._definitions = definitions
        self._builds = [(name, d.fingerprint, manifest_json(d))
                        for name, d in sorted(definitions.items())]
        self._older: frozenset[str] = frozenset()
        self._task: asyncio.Task[None] | None = None

    async def open(self) -> None:
        """Check every type against the registry, register, and keep it live.

        Raises:
            IncompatibleBuildError: a type's build cannot run beside the newest one.
        """
        if not self._builds:
            return
        await self.store.register_builds(self.process, self._role, self._builds,
                                         ttl=self._ttl, check=self._decide)
        self._task = asyncio.create_task(self._keep_live(), name="corral-builds")

    async def _decide(self, facts: BuildFacts) -> frozenset[str]:
        """Inside the registering transaction: the types whose build is older than the
        newest, or `IncompatibleBuildError` refusing the open."""
        registered = readable(await facts.builds())
        older: set[str] = set()
        refused: list[IncompatibleBuildError] = []
        for name, definition in sorted(self._definitions.items()):
            verdict = await self._check(facts, definition, registered)
            if isinstance(verdict, IncompatibleBuildError):
                refused.append(verdict)
            elif verdict == "older":
                older.add(name)
        if refused:
            raise IncompatibleBuildError(
                "; ".join(str(e) for e in refused), entity_type=refused[0].entity_type,
                differences=tuple(d for e in refused for d in e.differences),
                fingerprint=refused[0].fingerprint,
                newest_fingerprint=refused[0].newest_fingerprint)
        self._older = frozenset(older)
        return self._older

    async def close(self) -> None:
        if self._task is None:
            return
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)  # never raised on close
        with contextlib.suppress(StoreError):
            await self.store.forget_process(self.process)

    async def _register(self) -> None:
        await self.store.register_builds(self.process, self._role, self._builds,
                                         ttl=self._ttl, older=self._older)

    async def _keep_live(self) -> None:
        while True:
            await asyncio.sleep(self._ttl / 4)
            try:
                await self._register()
            except StoreError as err:  # the next round tries again; ttl covers three
                log.warning("process %s: build registration not refreshed (%s)",
                            self.process, err)

    async def _check(self, facts: BuildFacts, definition: EntityDefinition,
                     registered: Sequence[BuildRecord]
                     ) -> IncompatibleBuildError | str | None:
        """None (the newest, or a known build the newest may run beside), "older" (a
        build never seen, older than the newest), or the error refusing it."""
        etype, mine = definition.name, manifest(definition)
        newest = newest_build(registered, etype)
        if newest is None:
            return None
        others = [b for b in registered if b.entity_type == etype]
        same = next((b for b in others if b.fingerprint == mine["fingerprint"]), None)
        if same is not None and (refused := _restated(same, mine, newest)) is not None:
            return refused
        if newest is same:
            return None
        theirs = manifest_of(newest)
        known = same is not None
        # This process sends what it has: that matters while the newest build hosts.
        me = [(f"this process ({self.process}) sends it", mine)] if newest.processes else []
        if known:  # an older build than the newest: the newest must succeed it
            bad = incompatible(await assess(facts, etype, mine, theirs, others, me))
            role = "an older build than"
        else:  # a new release; or an old one started late, which the newest shows
            bad = incompatible(await assess(facts, etype, theirs, mine, others))
            if bad and _succeeds(theirs, mine) and not incompatible(
                    await assess(facts, etype, mine, theirs, others, me)):
                return "older"
            role = "a new build, not compatible with"
        if not bad:
            return None
        return IncompatibleBuildError(
            f"{etype} build {mine['fingerprint']} is {role} the newest build "
            f"{newest.fingerprint} in the store: " + "; ".join(str(d) for d in bad),
            entity_type=etype, differences=tuple(str(d) for d in bad),
            fingerprint=mine["fingerprint"], newest_fingerprint=newest.fingerprint)


def _restated(same: BuildRecord, mine: Manifest, newest: BuildRecord
              ) -> IncompatibleBuildError | None:
    """The error refusing `mine` when the store registered its fingerprint (the same
    interface) with state it cannot read: an annotated attribute's type changed
    without a new `state_version` (which would be a new fingerprint)."""
    changed = incompatible(compare(manifest_of(same), mine))
    if not changed:
        return None
    return IncompatibleBuildError(
        f"{same.entity_type} build {same.fingerprint} changed its state since the store "
        "registered it: " + "; ".join(str(d) for d in changed),
        entity_type=same.entity_type, differences=tuple(str(d) for d in changed),
        fingerprint=same.fingerprint, newest_fingerprint=newest.fingerprint)


def manifest_of(build: BuildRecord) -> Manifest:
    """A registered build's manifest, checked to have the fields the comparison reads.

    Raises:
        CorruptRowError: the stored manifest is not JSON, or not a manifest.
    """
    row = Row("builds", build.entity_type, what=f"build {build.fingerprint}")
    found = row.json("manifest", build.manifest)
    if not _is_manifest(found):
        raise row.corrupt("manifest", "is not a build manifest (its handlers, waits, "
                                      "state_version or upgrades_from are missing, or "
                                      "its code or state_fields are malformed)")
    return cast("Manifest", found)


def _is_manifest(m: object) -> bool:
    """Whether `m` has what the comparison reads; `code` and `state_fields` are optional
    (a manifest stored by an earlier corral has neither)."""
    if not (isinstance(m, dict) and isinstance(m.get("state_version"), int)
            and isinstance(m.get("upgrades_from"), list)
            and all(isinstance(v, int) for v in m["upgrades_from"])
            and isinstance(m.get("code", ""), str)):
        return False
    state = m.get("state_fields", {})
    if not (isinstance(state, dict) and all(isinstance(t, dict) for t in state.values())):
        return False
    sections = [m.get("handlers"), m.get("waits")]
    return all(isinstance(items, dict) and all(
        isinstance(item, dict) and isinstance(item.get("renamed_from"), list)
        and isinstance(item.get("payload"), dict | None) for item in items.values())
        for items in sections) and all(
        isinstance(item.get("kind"), str) for item in m["handlers"].values())


def readable(builds: Sequence[BuildRecord], *, warn: bool = True) -> list[BuildRecord]:
    """`builds` without those whose manifest does not decode (a row damaged or written
    by hand): no process can run such a build, so it is no build to be compatible
    with, and it must not stop a deployment from opening. Each is logged (`warn`)."""
    good = []
    for b in builds:
        try:
            manifest_of(b)
        except CorruptRowError as err:
            if warn:
                log.warning("build registry: %s; it is ignored", err)
            continue
        good.append(b)
    return good


def _unreadable(build: BuildRecord) -> str:
    try:
        manifest_of(build)
    except CorruptRowError as err:
        return str(err)
    return ""  # pragma: no cover (only asked of an unreadable build)


def _succeeds(newer: Manifest, older: Manifest) -> bool:
    """Whether `newer` shows it came after `older`: it renames one of `older`'s names
    (`renamed_from=`), or its upgrade hooks reach its state version from `older`'s."""
    names = {n for section in ("handlers", "waits") for n in older[section]}
    renamed = any(set(item["renamed_from"]) & names
                  for section in ("handlers", "waits") for item in newer[section].values())
    ahead = older["state_version"] < newer["state_version"] and all(
        v in newer["upgrades_from"] for v in range(older["state_version"],
                                                    newer["state_version"]))
    return renamed or ahead


async def assess(store: BuildFacts, etype: str, older: Manifest, newer: Manifest,
                 builds: Sequence[BuildRecord],
                 senders: Sequence[tuple[str, Manifest]] = ()) -> list[Difference]:
    """`compare(older, newer)` with the facts about what the newer build removed: its
    messages still stored, and the live processes (of `builds`, and `senders`) whose
    build has it."""
    gone = removed(older, newer)
    in_use = dict(await store.names_in_use(etype, gone)) if gone else {}
    live = [*((f"process {p.process} of build {b.fingerprint} sends it",
               manifest_of(b)) for b in readable(builds) for p in b.processes), *senders]
    for name in gone:
        users = [who for who, m in live if _knows(m, name)]
        if users:
            in_use[name] = "; ".join([in_use[name], *users] if name in in_use else users)
    return compare(older, newer, in_use=in_use)


def _knows(m: Manifest, name: str) -> bool:
    return any(name == n or name in item["renamed_from"]
               for section in ("handlers", "waits") for n, item in m[section].items())


async def build_infos(store: Store, etype: str | None = None) -> list[BuildInfo]:
    """Every registered build (of one type, or all) with its compatibility with the
    newest build of its type (`Runtime.builds()`, `corral builds`). A build whose
    manifest does not decode is listed as incompatible, with why (state version -1)."""
    registered = await store.builds(etype)
    good = readable(registered, warn=False)
    infos: list[BuildInfo] = []
    for b in registered:
        if b not in good:
            why = _unreadable(b)
            infos.append(BuildInfo(b.entity_type, b.fingerprint, -1, b.first_seen,
                                   b.last_seen, b.processes, False, False, why))
            continue
        of_type = [o for o in good if o.entity_type == b.entity_type]
        newest = newest_build(of_type, b.entity_type)
        assert newest is not None
        mine = manifest_of(b)
        if newest is b:
            bad, why = [], "newest"
        else:
            found = await assess(store, b.entity_type, mine, manifest_of(newest), of_type)
            bad = incompatible(found)
            why = "; ".join(str(d) for d in (bad or found)) or "same handlers"
        infos.append(BuildInfo(b.entity_type, b.fingerprint, mine["state_version"],
                               b.first_seen, b.last_seen, b.processes, newest is b,
                               not bad, why))
    return infos


async def build_knowing(store: Store, definition: EntityDefinition, name: str
                        ) -> str | None:
    """A build of `definition`'s type, other than this code's, live or the newest
    registered (a rollback runs an older build: what only the newest has waits for it
    to be deployed again), that has a signal or update handler called `name` (today or
    as a `renamed_from=` name): a description of it, or None when none knows the name."""
    builds = readable(await store.builds(definition.name))
    newest = newest_build(builds, definition.name)
    for b in reversed(builds):
        if b.fingerprint == definition.fingerprint or not (b.processes or b is newest):
            continue
        handlers = manifest_of(b)["handlers"]
        if any(item["kind"] != "query" and (n == name or name in item["renamed_from"])
               for n, item in handlers.items()):
            if not b.processes:
                return (f"build {b.fingerprint}, the newest, has it (no process runs it "
                        f"now: deploy it again)")
            return (f"build {b.fingerprint} (live: "
                    f"{', '.join(p.process for p in b.processes)}) has it")
    return None


def refused_client(definition: EntityDefinition, client_manifest: str | None
                   ) -> list[str] | None:
    """Why a host running `definition` must refuse a client whose build of the type has
    manifest `client_manifest` (the Ray backend's check, see `ShardHost`): None when it
    serves it, else each difference (empty when the client sent no manifest).

    It serves a client of an older build this one is a compatible successor of
    (everything it sends, this code has), and, during a rolling deploy, a client of a
    newer build that is a compatible successor of this one: what only the newer build
    has is answered `HandlerNotHostedError` (retryable) until the roll moves the shard.
    """
    if client_manifest is None:
        return []
    theirs: Manifest = json.loads(client_manifest)
    mine = manifest(definition)
    sent = {name: "the client sends it" for name in removed(theirs, mine)}
    bad = incompatible(compare(theirs, mine, in_use=sent))
    if not bad or not incompatible(compare(mine, theirs)):
        return None
    return [str(d) for d in bad]


async def refused_release(store: Store, current: Mapping[str, str],
                          declared: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """Whether a Ray deployment whose release runs the builds `current` may be rolled
    to `declared` (both {entity type: manifest JSON}): (each reason it may not, notes).

    A type's new build must be a compatible successor of the current one
    (`compare(current, declared)` with the facts of `assess`: messages of removed
    handlers still stored, live senders), or, for a rollback, an older build the
    current one is a compatible successor of: then what only the current build has
    (a handler it added) waits in the store for a release that has it again, and a
    note says so. A type the current release has and the declared one lacks is
    refused: its running entities would have no host.
    """
    refused: list[str] = []
    notes: list[str] = []
    for etype in sorted(current):
        if etype not in declared:
            refused.append(f"{etype}: entity type removed (its running entities would "
                           f"have no host; keep the type in the release)")
            continue
        older: Manifest = json.loads(current[etype])
        newer: Manifest = json.loads(declared[etype])
        if older == newer:
            continue
        builds = readable(await store.builds(etype))
        bad = incompatible(await assess(store, etype, older, newer, builds))
        if not bad:
            continue
        if not incompatible(await assess(store, etype, newer, older, builds)):
            gone = ", ".join(sorted(removed(older, newer))) or "none"
            notes.append(f"{etype}: a rollback to an older build; messages of what only "
                         f"the current build has ({gone}) wait for a release that has it")
            continue
        refused += [f"{etype} {d}" for d in bad]
    return refused, notes
