"""Bounded entities under faults and at scale.

- SIGKILL of a host process at random moments while its entities snapshot every 5
  signals and continue as new every ~40 (`tests/support/mp_bounded_worker.py`, real processes,
  real SIGKILL), then a check of the whole store;
- 60,000 signals into one entity: journal, snapshot and dedupe rows plateau, and so does
  the SQLite file (PostgreSQL's files are its own: sizes are reported, not asserted);
- recovery after 30,000 signals replays only the tail after the latest snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import corral
from bounded_entities import Applied, Chain, ChurnLedger, ChurnMailbox, Note, Sink, SinkInit, Tick
from procs import Worker, spawner, wait_until
from stores import is_postgres, sql

WORKER = Path(__file__).resolve().parents[1] / "support" / "mp_bounded_worker.py"
CHURN: list[type[corral.Entity]] = [ChurnLedger, ChurnMailbox]
TTL = 1.0
WAIT = 40.0  # wait_until's timeout in this module where a call does not set one
KILLS = 10  # hosts started and SIGKILLed in turn


# -- helpers ---------------------------------------------------------------------------


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    with spawner(tmp_path, WORKER) as start:
        yield start


def lines(path: Path) -> list[str]:
    """Whole lines only: each was written by one write() after its ack returned."""
    return path.read_bytes().decode().split("\n")[:-1]


# -- SIGKILL during continue-as-new and snapshot writing -------------------------------


@pytest.mark.skipif(sys.platform == "win32", reason="needs SIGKILL")
async def test_sigkill_at_random_moments_of_snapshots_and_continue_as_new_loses_and_duplicates_nothing(  # noqa: E501
        tmp_path: Path, db_path: str, spawn: Callable[..., Worker]) -> None:
    seed = int(os.environ.get("CORRAL_TEST_SEED", time.time_ns() % 1_000_000))
    rng = random.Random(seed)
    print(f"\nseed {seed} (set CORRAL_TEST_SEED to replay the kill points)")
    acklog, status = tmp_path / "acks.log", tmp_path / "status.log"
    acklog.touch()
    status.touch()
    for i in range(KILLS):
        worker = spawn(f"churn{i}", "churn", "--db", db_path, "--lease-ttl", str(TTL),
                       "--acklog", str(acklog), "--status", str(status), "--prefix", f"it{i}")
        await wait_until(lambda: len(lines(status)) == i + 1,  # noqa: B023
                         f"worker {i} hosts the entities", timeout=WAIT, alive=[worker])
        kill_at = rng.randint(20, 400)
        tag = f" it{i}-"
        await wait_until(lambda: sum(tag in line for line in lines(acklog)) >= kill_at,  # noqa: B023
                         f"worker {i} got {kill_at} acks", timeout=WAIT, alive=[worker])
        worker.sigkill()
    acked = [line.split() for line in lines(acklog)]
    print(f"{len(acked)} acknowledged signals over {KILLS} SIGKILLed hosts")

    async with corral.open_runtime(db_path, entities=CHURN, lease_ttl=TTL) as rt:
        refs = {"ChurnLedger": rt.ref(ChurnLedger, "ledger"),
                "ChurnMailbox": rt.ref(ChurnMailbox, "mailbox")}
        accepted = {etype: _accepted_in_seq_order(db_path, etype) for etype in refs}

        histories = {"ChurnLedger": ChurnLedger.history, "ChurnMailbox": ChurnMailbox.history}

        async def applied(etype: str) -> int:
            return len(await refs[etype].query(histories[etype]))

        async def settled(etype: str) -> bool:
            info = await refs[etype].describe()
            return (info.hosted_here and info.applied_seq == info.accepted_seq
                    and await applied(etype) >= len(accepted[etype]))

        # The mailbox entity can be far behind its senders when they die (each snapshot
        # holds its untaken payloads): wait while it works the backlog off, fail on a stall.
        started = time.monotonic()
        for etype in refs:
            await wait_until(lambda: settled(etype), f"{etype} applied its backlog",  # noqa: B023
                             timeout=WAIT, progress=lambda: applied(etype))  # noqa: B023
        print(f"backlogs applied {time.monotonic() - started:.1f} s after the last kill")
        history = {"ChurnLedger": await refs["ChurnLedger"].query(ChurnLedger.history),
                   "ChurnMailbox": await refs["ChurnMailbox"].query(ChurnMailbox.history)}
        carried = await refs["ChurnMailbox"].query(ChurnMailbox.carried_counts)
        # Retried sends of acknowledged signals are duplicates of the original acceptance.
        retries = await asyncio.gather(*(
            refs[etype].signal_with_start(
                ChurnLedger.note if etype == "ChurnLedger" else ChurnMailbox.notes,
                Note(mid=mid), start=Chain(), message_id=mid)
            for etype, _, mid, _, _ in acked))
        descriptions = {etype: await ref.describe() for etype, ref in refs.items()}

    lost = [(mid, r) for (_, _, mid, seq, _), r in zip(acked, retries, strict=True)
            if (r.status, r.seq) != ("duplicate", int(seq))]
    assert lost == [], "acknowledged signals were not in the store after the crashes"
    for etype, key in (("ChurnLedger", "ledger"), ("ChurnMailbox", "mailbox")):
        mids = [a.mid for a in history[etype]]
        assert len(mids) == len(set(mids)), f"{etype}: a signal was applied twice"
        assert mids == accepted[etype], f"{etype}: applied set or order differs from the store"
        acked_here = {mid for e, _, mid, _, _ in acked if e == etype}
        assert acked_here <= set(mids)
        _check_runs_are_a_chain(history[etype])
        _check_store_is_consistent(db_path, etype, key, descriptions[etype])
        print(f"{etype}: {len(mids)} applied over {descriptions[etype].run_id} runs")
    print(f"untaken mailbox payloads carried per continue-as-new: {carried}")


def _accepted_in_seq_order(db_path: str, etype: str) -> list[str]:
    return [r[0] for r in sql(db_path, "SELECT message_id FROM dedupe WHERE etype=? "
                                       "ORDER BY seq", etype)]


def _check_runs_are_a_chain(history: list[Applied]) -> None:
    runs = [a.run for a in history]
    assert runs == sorted(runs), "a later run's message was applied before an earlier one's"


def _check_store_is_consistent(db_path: str, etype: str, key: str,
                               info: corral.EntityDescription) -> None:
    runs = sql(db_path, "SELECT run_id, status, continued_from FROM runs WHERE etype=? "
                        "AND key=? ORDER BY run_id", etype, key)
    last = runs[-1][0]
    assert [r[0] for r in runs] == list(range(1, last + 1))
    assert [r[1] for r in runs] == ["continued"] * (last - 1) + ["running"], \
        "exactly one running run, every earlier one continued"
    assert [r[2] for r in runs] == [None, *range(1, last)]
    assert sql(db_path, "SELECT run_id, status FROM entities WHERE etype=? AND key=?",
               etype, key) == [(last, "running")]
    assert info.run_id == last
    seqs = sql(db_path, "SELECT seq, run_id FROM journal WHERE etype=? AND key=?", etype, key)
    assert len({s for s, _ in seqs}) == len(seqs), "journal seqs are not unique"
    assert {r for _, r in seqs} <= {last}, "journal entries of closed runs were left"
    assert {r[0] for r in sql(db_path, "SELECT run_id FROM snapshots WHERE etype=? AND key=?",
                              etype, key)} <= {last}, "snapshots of closed runs were left"
    assert sql(db_path, "SELECT count(*) FROM timers WHERE etype=? AND run_id<?",
               etype, last) == [(0,)]
    (accepted_max,), = sql(db_path, "SELECT max(seq) FROM dedupe WHERE etype=? AND key=?",
                           etype, key)
    assert info.accepted_seq == accepted_max


# -- storage stays bounded -------------------------------------------------------------


def _sizes(db_path: str) -> dict[str, int]:
    """SQLite: the database's logical size (pages as readers see them, WAL included) and
    the bytes of the dedupe table in it (SQLite's dbstat), plus the files on disk.

    PostgreSQL: the database's size, reported only; what it holds besides live rows
    (dead row versions until autovacuum reclaims them) is the server's business."""
    if is_postgres(db_path):
        ((size,),) = sql(db_path, "SELECT pg_database_size(current_database())")
        return {"database": int(size)}
    with contextlib.closing(sqlite3.connect(db_path)) as db:
        db.execute("BEGIN")  # one read snapshot for all three numbers
        pages, page_size = (db.execute(f"PRAGMA {p}").fetchone()[0]
                            for p in ("page_count", "page_size"))
        (dedupe,) = db.execute("SELECT sum(pgsize) FROM dbstat WHERE name='dedupe'").fetchone()
        db.execute("COMMIT")
    wal = Path(f"{db_path}-wal")
    return {"logical": pages * page_size, "dedupe_bytes": int(dedupe),
            "file": os.path.getsize(db_path), "wal": wal.stat().st_size if wal.exists() else 0}


def _count(db_path: str, table: str) -> int:
    return int(sql(db_path, f"SELECT count(*) FROM {table}")[0][0])


async def _pump(ref: corral.EntityRef[Sink], first: int, n: int, senders: int = 100) -> None:
    """Send ticks first..first+n-1 from concurrent senders (they share group commits).

    Message ids are left to the runtime (time-ordered, as real callers' usually are)."""
    async def sender(s: int) -> None:
        for v in range(first + s, first + n, senders):
            await ref.signal_with_start(Sink.tick, Tick(v=v), start=SinkInit())

    await asyncio.gather(*(sender(s) for s in range(senders)))


async def _caught_up(ref: corral.EntityRef[Sink]) -> bool:
    info = await ref.describe()
    return info.applied_seq == info.accepted_seq


@pytest.mark.slow
async def test_60000_signals_into_one_entity_keep_rows_and_the_store_file_flat(
        db_path: str) -> None:
    policy, window = Sink.snapshots, Sink.dedupe_window
    assert policy.every is not None
    assert window.max_count is not None
    total, step = 60_000, 6_000
    # Warm: every bounded table is full (the window holds max_count ids, the journal
    # every * keep entries) and SQLite's free pages have been reused once.
    warm = 2 * (window.max_count + policy.every * policy.keep)
    samples: list[dict[str, int]] = []
    async with corral.open_runtime(db_path, entities=[Sink]) as rt:
        ref = rt.ref(Sink, "sink-1")
        for sent in range(step, total + 1, step):
            await _pump(ref, sent - step, step)
            await wait_until(lambda: _caught_up(ref), "the entity applied what was sent",
                             timeout=30)
            samples.append({
                "sent": sent, "journal": _count(db_path, "journal"),
                "snapshots": _count(db_path, "snapshots"), "dedupe": _count(db_path, "dedupe"),
                **_sizes(db_path),
            })
        assert await ref.query(Sink.totals) == [total, total * (total - 1) // 2]
    for s in samples:
        print(s)
    for s in samples:
        # Nothing is in flight at a sample (all applied), so no slack for unapplied entries.
        # Kept snapshots cover all but the last `every * keep` entries:
        assert s["journal"] <= policy.every * policy.keep, s
        assert s["snapshots"] <= policy.keep, s
        # Ids leave the window at each snapshot, so at most `every` more than max_count:
        assert s["dedupe"] <= window.max_count + policy.every, s
    assert _count(db_path, "runs") == 1
    assert _count(db_path, "timers") == 0
    if is_postgres(db_path):
        return  # the rows are bounded; the files are PostgreSQL's (see `_sizes`)
    # The file: after warm-up its size stays within 25% of its size at warm-up. History
    # kept anywhere would grow it by the journal's ~100 B (or dedupe's ~60 B) per signal,
    # i.e. by >= 0.3 MiB per 6,000-signal step, more than the margin allows.
    at_warm = next(s for s in samples if s["sent"] >= warm)
    late = [s for s in samples if s["sent"] > at_warm["sent"]]
    assert late, "no samples after warm-up"
    for what in ("logical", "file"):
        bound = at_warm[what] * 1.25
        assert all(s[what] <= bound for s in late), (what, at_warm[what], late)


@pytest.mark.slow
async def test_recovery_after_30000_signals_replays_only_the_tail_after_the_latest_snapshot(
        db_path: str) -> None:
    every = Sink.snapshots.every
    assert every is not None
    total = 30_000 + every // 2 + 37  # the latest snapshot covers 30,000
    async with corral.open_runtime(db_path, entities=[Sink]) as rt:
        ref = rt.ref(Sink, "sink-3")
        await _pump(ref, 0, total)
        await wait_until(lambda: _caught_up(ref), "the entity applied what was sent",
                         timeout=WAIT)
    ((latest,),) = sql(db_path, "SELECT max(applied_seq) FROM snapshots")
    assert latest == total // every * every
    Sink.handler_calls = 0
    async with corral.open_runtime(db_path, entities=[Sink]) as rt:
        ref = rt.ref(Sink, "sink-3")
        assert await ref.query(Sink.totals) == [total, total * (total - 1) // 2]
        info = await ref.describe()
    assert info.hosted_here
    assert info.applied_seq == total
    assert Sink.handler_calls == total - latest
