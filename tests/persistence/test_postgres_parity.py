"""`PostgresStore` answers every op exactly as `SqliteStore` does.

A seeded random walk of store ops (acceptances of every kind and id reuse policy,
duplicates and conflicts, closes with and without unapplied messages, snapshots with
truncation, forgetting and passivation, continue-as-new with carried entries, timers,
update outcomes, dead letters with replays and discards, lease takeovers that fence the
old holder) runs on both stores side by side. After every op the two must have answered
the same (the same result, or the same error type and message) and must read back the
same state. Only what is meant to differ is normalised: wall-clock stamps (`closed_at`,
`started_at` of a run opened by continue-as-new, `failed_at` of the dead letters a close
keeps),
and dead-letter ids (SQLite reuses the highest id after a delete, PostgreSQL never
reuses one), which also appear inside replay message ids.
"""

from __future__ import annotations

import random
import re
from collections.abc import AsyncIterator
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("asyncpg")

import corral
from corral.persistence import (
    Acceptance,
    EntryKind,
    Fence,
    JournalEntry,
    Store,
    UpdateOutcome,
    open_sqlite_store,
    payload_hash,
)
from corral.persistence._postgres import open_postgres_store
from pg import pg_url as pg_fixture  # noqa: F401 (fixtures, found by name)
from pg import postgres_url as cluster_fixture  # noqa: F401

SHARDS = 4
KEYS = {"k0": 0, "k1": 1, "k2": 1}  # two entities share shard 1
POLICIES = list(corral.IdReusePolicy)
STATUSES = [corral.RunStatus.COMPLETED, corral.RunStatus.FAILED]
_IDS = re.compile(r"(replay:|dead letter )\d+")


def normal(value: Any) -> Any:
    """What must be equal across the stores."""
    if isinstance(value, corral.CorralError):  # the fields a program acts on, too
        return (type(value).__name__, normal(str(value)), value.entity_type, value.key,
                value.run_id, normal(value.message_id))
    if isinstance(value, BaseException):
        return (type(value).__name__, normal(str(value)))
    if isinstance(value, str):
        return _IDS.sub(r"\1#", value)
    if is_dataclass(value) and not isinstance(value, type):
        out = {f.name: normal(getattr(value, f.name)) for f in fields(value)}
        if isinstance(value, corral.persistence.DeadLetter):
            out["id"] = 0
        if "closed_at" in out:
            out["closed_at"] = out["closed_at"] is not None
        if isinstance(out.get("started_at"), float) and out["started_at"] > 1e9:
            out["started_at"] = "wall clock"  # continue-as-new stamps the time it ran
        if isinstance(out.get("failed_at"), float) and out["failed_at"] > 1e9:
            out["failed_at"] = "wall clock"  # a close keeps what its run never applied
        return (type(value).__name__, out)
    if isinstance(value, dict):
        return {normal(k): normal(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [normal(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted(normal(v) for v in value)
    return value


def difference(want: Any, got: Any, path: str = "") -> str:
    """Where two normalised values first differ."""
    if isinstance(want, dict) and isinstance(got, dict):
        for k in sorted(set(want) | set(got), key=repr):
            if want.get(k) != got.get(k):
                return difference(want.get(k), got.get(k), f"{path}.{k}")
    if isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
        for i, (w, g) in enumerate(zip(want, got, strict=True)):
            if w != g:
                return difference(w, g, f"{path}[{i}]")
    return f"at {path}:\n  sqlite:   {want!r}\n  postgres: {got!r}"


class Walk:
    """Draws the next op from `rng`, reading the current state from the SQLite store
    (the reference) and translating store-specific values (dead-letter ids, entries)
    for each store."""

    def __init__(self, rng: random.Random, stores: dict[str, Store]) -> None:
        self.rng = rng
        self.stores = stores
        self.clock = 1000.0
        self.epoch = {s: 0 for s in range(SHARDS)}  # of owner "h"
        self.last_replay: dict[str, int] | None = None
        self.updated: set[tuple[str, str]] = set()  # (key, message id) given an outcome

    def acc(self, key: str, **kw: Any) -> Acceptance:
        r = self.rng
        self.clock += 1.0
        kind = kw.get("kind", EntryKind.SIGNAL)
        mid = f"m{r.randrange(40)}" if kind is EntryKind.SIGNAL else f"t{r.randrange(1000)}"
        # Mostly the same message under the same id (a duplicate), sometimes a conflict.
        name = "terminate" if kind is EntryKind.TERMINATE else (
            "note" if r.random() < 0.9 else "other")
        payload = '"reason"' if kind is EntryKind.TERMINATE else (
            '{"a":1}' if r.random() < 0.9 else '{"a":2}')
        return Acceptance(
            "E", key, KEYS[key], kind, name, mid, payload, payload_hash(name, payload),
            None if r.random() < 0.9 else "s1",
            kw.get("start", r.choice([None, '{"i":1}', '{"i":1}'])), r.choice(POLICIES),
            self.clock)

    async def step(self) -> tuple[str, dict[str, Any]]:
        """One op: (its description, {store name: result or error})."""
        r = self.rng
        key = r.choice(list(KEYS))
        fence = Fence(KEYS[key], "h", self.epoch[KEYS[key]])
        ref = self.stores["sqlite"]
        latest = await ref.latest_run("E", key)
        run_id, next_seq = (latest[0].run_id, latest[1]) if latest else (1, 1)
        top = max(next_seq - 1, 0)
        choice = r.choices(
            ["accept", "terminate", "close", "snapshot", "can", "timer", "activated",
             "update", "dead", "replay", "discard", "takeover", "leases"],
            weights=[30, 3, 5, 6, 3, 3, 2, 3, 4, 4, 2, 3, 2])[0]
        if choice == "accept":
            a = self.acc(key)
            return f"accept {a}", await self.each(lambda s: s.accept(a))
        if choice == "terminate":
            a = self.acc(key, kind=EntryKind.TERMINATE, start=None)
            return f"terminate {a}", await self.each(lambda s: s.accept(a))
        if choice == "close":
            args = dict(applied_seq=top - r.choice([0, 0, 1]), status=r.choice(STATUSES),
                        result='"r"', error=None, force=r.random() < 0.3)
            rid = run_id - r.choice([0, 0, 0, 1])
            return f"close {key} {rid} {args}", await self.each(
                lambda s: s.close_run(fence, "E", key, rid, **args))
        if choice == "snapshot":
            args = dict(applied_seq=r.randint(0, top), state=bytes([r.randrange(256)]),
                        keep=r.choice([1, 2]), passivate=r.random() < 0.3,
                        forget_seq=r.randint(0, top), forget_before=r.choice(
                            [0.0, self.clock - r.randrange(30)]))
            return f"snapshot {key} {run_id} {args}", await self.each(
                lambda s: s.write_snapshot(fence, "E", key, run_id, **args))
        if choice == "can":
            return await self.continue_as_new(fence, key, run_id, top)
        if choice == "timer":
            due = r.choice([None, 5.0, 10.0**10])
            tid = r.choice(["t1", "t2"])
            return f"timer {key} {tid} {due}", await self.each(
                lambda s: s.set_timer(fence, "E", key, run_id, tid, due))
        if choice == "activated":
            return f"activated {key}", await self.each(
                lambda s: s.mark_activated(fence, "E", key))
        if choice == "update":
            mid, out = f"m{r.randrange(40)}", UpdateOutcome(r.choice(['"x"', None]), None)
            self.updated.add((key, mid))
            return f"update {key} {mid}", await self.each(
                lambda s: s.record_update(fence, "E", key, mid, out))
        if choice == "dead":
            return await self.dead_letter(fence, key, run_id)
        if choice in ("replay", "discard"):
            return await self.replay_or_discard(choice, key)
        if choice == "takeover":
            shard = r.randrange(SHARDS)
            who = "z" if r.random() < 0.3 else "h"  # "z" fences "h" out until it returns
            result = await self.each(lambda s: s.acquire_leases(who, [shard], 1000.0,
                                                                force=True))
            if who == "h" and isinstance(result["sqlite"], dict):
                self.epoch[shard] = result["sqlite"][shard]
            return f"takeover {who} {shard}", result
        held = {s: e for s, e in self.epoch.items() if e}
        if r.random() < 0.5:
            return f"renew {held}", await self.each(
                lambda s: s.renew_leases("h", held, 1000.0))
        return "release h", await self.each(lambda s: s.release_leases("h"))

    async def continue_as_new(self, fence: Fence, key: str, run_id: int, top: int
                              ) -> tuple[str, dict[str, Any]]:
        r = self.rng
        applied = r.randint(0, top)
        picks: dict[str, list[JournalEntry]] = {}
        chosen: list[int] | None = None
        for name, s in self.stores.items():
            old = [e for e in await s.journal("E", key, run_id=run_id, after_seq=0)
                   if e.seq <= applied]
            if chosen is None:
                chosen = sorted(r.sample(range(len(old)), r.randint(0, len(old))))
            picks[name] = [old[i] for i in chosen]
        rid = run_id - r.choice([0, 0, 0, 1])
        return f"can {key} {rid} {applied} {chosen}", await self.each(
            lambda s, n: s.continue_as_new(fence, "E", key, rid, applied_seq=applied,
                                           next_input='{"n":1}', carried=picks[n]))

    async def dead_letter(self, fence: Fence, key: str, run_id: int
                          ) -> tuple[str, dict[str, Any]]:
        entries = {n: await s.journal("E", key, run_id=run_id, after_seq=0)
                   for n, s in self.stores.items()}
        if not entries["sqlite"]:
            return "no entry to dead-letter", {}
        i = self.rng.randrange(len(entries["sqlite"]))
        self.last_replay = None  # a new letter may take a replayed letter's SQLite id
        ids = await self.each(
            lambda s, n: s.record_dead_letter(fence, entries[n][i], error="E: x",
                                              traceback="tb", attempts=3, failed_at=1.0))
        return f"dead {key} #{i}", {n: "an id" if isinstance(v, int) else v
                                    for n, v in ids.items()}

    async def replay_or_discard(self, what: str, key: str) -> tuple[str, dict[str, Any]]:
        r = self.rng
        letters = {n: [d.id for d in await s.dead_letters("E", key)]
                   for n, s in self.stores.items()}
        if self.last_replay is not None and r.random() < 0.3:
            ids = self.last_replay  # a retry of the last replay or discard
        elif letters["sqlite"] and r.random() < 0.9:
            i = r.randrange(len(letters["sqlite"]))
            ids = {n: ls[i] for n, ls in letters.items()}
        else:
            ids = {n: 10**6 for n in letters}
        self.last_replay = ids
        self.clock += 1.0
        now = self.clock
        if what == "replay":
            return f"replay {key}", await self.each(
                lambda s, n: s.replay_dead_letter("E", key, KEYS[key], ids[n], accepted_at=now))
        return f"discard {key}", await self.each(
            lambda s, n: s.discard_dead_letter("E", key, ids[n]))

    async def each(self, call: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, store in self.stores.items():
            try:
                out[name] = await (call(store, name) if call.__code__.co_argcount == 2
                                   else call(store))
            except corral.CorralError as err:
                out[name] = err
        return out


async def state(store: Store, updated: set[tuple[str, str]]) -> Any:
    """Everything a store reads back, normalised."""
    seen: dict[str, Any] = {}
    for key in KEYS:
        latest = await store.latest_run("E", key)
        seen[key] = {"latest": latest, "runs": await store.runs("E", key)}
        if latest is not None:
            rid = latest[0].run_id
            seen[key]["journal"] = await store.journal("E", key, run_id=rid, after_seq=0)
            seen[key]["snapshot"] = await store.latest_snapshot("E", key, rid)
            seen[key]["dead_seqs"] = await store.dead_letter_seqs("E", key, rid)
            seen[key]["outcomes"] = [await store.update_outcome("E", key, mid)
                                     for k, mid in sorted(updated) if k == key]
    seen["dead"] = await store.dead_letters(limit=1000)
    seen["running"] = [sorted(found) for found in (
        await store.running_entities(range(SHARDS))).values()]
    seen["urgent"] = [sorted(found) for found in (
        await store.urgent_entities(range(SHARDS), 100.0)).values()]
    seen["due"] = sorted(await store.due_timers(frozenset(range(SHARDS)), 100.0))
    return normal(seen)


@pytest.fixture
async def stores(tmp_path: Path, pg_url: str) -> AsyncIterator[dict[str, Store]]:
    sqlite = await open_sqlite_store(str(tmp_path / "parity.db"), shards=SHARDS)
    postgres = await open_postgres_store(pg_url, shards=SHARDS)
    try:
        yield {"sqlite": sqlite, "postgres": postgres}
    finally:
        await sqlite.close()
        await postgres.close()


@pytest.mark.parametrize("seed", range(4))
async def test_every_op_answers_and_reads_back_exactly_as_on_sqlite(
    stores: dict[str, Store], seed: int,
) -> None:
    walk = Walk(random.Random(seed), stores)
    assert normal(await walk.each(lambda s: s.acquire_leases("h", range(SHARDS), 1000.0))) \
        == {"sqlite": {0: 1, 1: 1, 2: 1, 3: 1}, "postgres": {0: 1, 1: 1, 2: 1, 3: 1}}
    walk.epoch = dict.fromkeys(range(SHARDS), 1)
    history: list[str] = []
    for _ in range(250):
        what, results = await walk.step()
        history.append(what)
        if results:
            assert normal(results["postgres"]) == normal(results["sqlite"]), (
                f"op {len(history)} differs: {what}\nsqlite:   {results['sqlite']!r}\n"
                f"postgres: {results['postgres']!r}")
        got = await state(stores["postgres"], walk.updated)
        want = await state(stores["sqlite"], walk.updated)
        assert got == want, (f"state differs after op {len(history)}: {what}\n"
                             f"{difference(want, got)}")
