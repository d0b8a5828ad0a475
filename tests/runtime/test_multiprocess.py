"""Several OS processes on one store: atomic start, durable acks, takeover, fencing.

Every test runs on both stores (`db_path`: one SQLite file, or one PostgreSQL database).
Workers are real processes (`tests/support/mp_worker.py`, run with `sys.executable`) sharing the
entity classes of `tests/support/mp_entities.py`; they report through files under `tmp_path`.
Crashes are real `SIGKILL`s. Leases are short (`lease_ttl=1.0`) so a survivor takes a
dead host's shards within about a second.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

import corral
from corral.persistence import (
    Acceptance,
    EntryKind,
    Fence,
    UpdateOutcome,
    open_store,
    payload_hash,
)
from mp_entities import Clocked, Job, Note, Pipeline, Recorder, Start
from procs import Worker, spawner, wait_for_exit, wait_until
from stores import leased_owners, sql, tables

WORKER = Path(__file__).resolve().parents[1] / "support" / "mp_worker.py"
ENTITIES: list[type[corral.Entity]] = [Clocked, Pipeline, Recorder]
TTL = 1.0  # lease_ttl of every process in this module
SHARDS = 16
WAIT = 60.0  # wait_until's timeout in this module

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs SIGKILL")


# -- worker processes ------------------------------------------------------------------


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    """Start `mp_worker.py` workers; every one still running is killed when the test ends."""
    with spawner(tmp_path, WORKER) as start:
        yield start




# -- reading the store directly --------------------------------------------------------


def journal_ids(db_path: str, etype: str, key: str) -> list[str]:
    """The entity's message ids in journal (acceptance) order."""
    return [r[0] for r in sql(db_path, "SELECT message_id FROM journal WHERE etype=? AND "
                                       "key=? ORDER BY seq", etype, key)]


def dump(db_path: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, for comparing the whole store before and after."""
    return {t: sorted(sql(db_path, f"SELECT * FROM {t}"), key=repr) for t in tables(db_path)}


async def caught_up(ref: corral.EntityRef[Any]) -> bool:
    """Hosted by this process, with everything accepted so far applied."""
    info = await ref.describe()
    return info.hosted_here and info.applied_seq == info.accepted_seq


# -- the tests -------------------------------------------------------------------------


async def test_500_concurrent_signal_with_start_from_4_processes_start_one_run_and_apply_each_signal_once(  # noqa: E501
        tmp_path: Path, db_path: str, spawn: Callable[..., Worker]) -> None:
    key, procs, per_proc = "order-7", 4, 125
    go, fire = tmp_path / "go", tmp_path / "fire"
    workers = [
        spawn(f"swarm{i}", "swarm", "--db", db_path, "--lease-ttl", str(TTL), "--index", str(i),
              "--count", str(per_proc), "--key", key, "--go", str(go), "--fire", str(fire),
              "--ready", str(tmp_path / f"ready{i}.json"), "--out", str(tmp_path / f"acks{i}.json"))
        for i in range(procs)
    ]
    go.touch()  # all open the fresh store file at once ...
    await wait_until(lambda: all((tmp_path / f"ready{i}.json").exists() for i in range(procs)),
                     "every worker has opened the store", timeout=WAIT, alive=workers)
    fire.touch()  # ... then all send at once
    await wait_for_exit(workers)

    acks = [a for i in range(procs)
            for a in json.loads((tmp_path / f"acks{i}.json").read_text())]
    assert [a for a in acks if "error" in a] == []
    assert len(acks) == procs * per_proc
    assert len([a for a in acks if a["started"]]) == 1, "more than one call started a run"
    assert {a["run_id"] for a in acks} == {1}
    assert {a["status"] for a in acks} == {"accepted"}
    assert sorted(a["seq"] for a in acks) == list(range(1, procs * per_proc + 1))
    assert sql(db_path, "SELECT run_id, status FROM runs WHERE etype='Recorder' AND key=?",
               key) == [(1, "running")]

    in_journal = journal_ids(db_path, "Recorder", key)
    assert sorted(in_journal) == sorted(a["mid"] for a in acks)
    assert in_journal == [a["mid"] for a in sorted(acks, key=lambda a: a["seq"])]

    async with corral.open_runtime(db_path, entities=ENTITIES, lease_ttl=TTL) as rt:
        ref = rt.ref(Recorder, key)
        await wait_until(lambda: caught_up(ref), "the parent hosts the entity and caught up",
                         timeout=WAIT)
        applied = await ref.query(Recorder.applied_ids)
    assert len(applied) == len(set(applied)) == procs * per_proc
    assert applied == in_journal


async def test_one_at_a_time_senders_in_3_processes_interleave_on_shared_keys_without_gaps_or_reordering(  # noqa: E501
        tmp_path: Path, db_path: str, spawn: Callable[..., Worker]) -> None:
    keys, procs, per_proc = ["shared-a", "shared-b"], 3, 150
    go = tmp_path / "go"
    workers = [
        spawn(f"sender{i}", "interleave", "--db", db_path, "--lease-ttl", str(TTL),
              "--index", str(i), "--count", str(per_proc), "--keys", ",".join(keys),
              "--host", "yes" if i == 0 else "no", "--go", str(go),
              "--out", str(tmp_path / f"acks{i}.json"))
        for i in range(procs)
    ]
    go.touch()
    await wait_for_exit(workers)
    acks = {i: json.loads((tmp_path / f"acks{i}.json").read_text()) for i in range(procs)}

    for key in keys:
        mine = {i: [a for a in acks[i] if a["key"] == key] for i in range(procs)}
        every = [a for i in range(procs) for a in mine[i]]
        assert sorted(a["seq"] for a in every) == list(range(1, len(every) + 1)), key
        assert len([a for a in every if a["started"]]) == 1
        assert {(a["status"], a["run_id"]) for a in every} == {("accepted", 1)}
        for i in range(procs):  # one sender's messages keep its order
            seqs = [a["seq"] for a in mine[i]]
            assert seqs == sorted(seqs), f"process {i}'s signals to {key} were reordered"
        assert journal_ids(db_path, "Recorder", key) == \
            [a["mid"] for a in sorted(every, key=lambda a: a["seq"])]

    async with corral.open_runtime(db_path, entities=ENTITIES, lease_ttl=TTL) as rt:
        for key in keys:
            ref = rt.ref(Recorder, key)
            await wait_until(partial(caught_up, ref), f"the parent hosts {key}", timeout=WAIT)
            assert await ref.query(Recorder.applied_ids) == journal_ids(db_path, "Recorder", key)


async def test_a_host_sigkilled_while_10000_signals_stream_in_applies_every_acknowledged_signal_once_in_order_after_restart(  # noqa: E501
        tmp_path: Path, db_path: str, spawn: Callable[..., Worker]) -> None:
    keys, total, kill_at = 4, 10_000, 3_000
    acklog = tmp_path / "acks.log"
    acklog.touch()
    worker = spawn("stream", "stream", "--db", db_path, "--lease-ttl", str(TTL),
                   "--acklog", str(acklog), "--total", str(total), "--senders", "50",
                   "--keys", str(keys))
    await wait_until(lambda: acklog.read_bytes().count(b"\n") >= kill_at,
                     f"{kill_at} signals are acknowledged", timeout=WAIT, alive=[worker])
    worker.sigkill()

    # Only whole lines count: each was written in one write() after its ack returned.
    lines = acklog.read_bytes().decode().split("\n")[:-1]
    acked = [line.split() for line in lines if line != "done"]
    print(f"\n{len(acked)} of {total} signals acknowledged before SIGKILL")
    assert len(acked) >= kill_at
    assert {run_id for *_, run_id in acked} == {"1"}

    async with corral.open_runtime(db_path, entities=ENTITIES, lease_ttl=TTL) as rt:
        refs = {f"stream-{k}": rt.ref(Recorder, f"stream-{k}") for k in range(keys)}

        async def all_caught_up() -> bool:
            return all([await caught_up(ref) for ref in refs.values()])

        await wait_until(all_caught_up, "the parent took over and applied the backlog",
                         timeout=WAIT)
        # Clients whose process died retry what they sent: each retry is a duplicate.
        again = await asyncio.gather(*(
            refs[key].signal_with_start(Recorder.note, Note(mid=mid), start=Start(),
                                        message_id=mid)
            for key, mid, _, _ in acked))
        lost = [(mid, a) for (_, mid, seq, _), a in zip(acked, again, strict=True)
                if (a.status, a.seq) != ("duplicate", int(seq))]
        assert lost == [], "acknowledged signals were not in the store after the crash"
        applied = {key: await ref.query(Recorder.applied_ids) for key, ref in refs.items()}

    for key, ids in applied.items():
        assert len(ids) == len(set(ids)), f"{key}: a signal was applied twice"
        assert ids == journal_ids(db_path, "Recorder", key), f"{key}: not in acceptance order"
        assert sql(db_path, "SELECT count(*) FROM runs WHERE etype='Recorder' AND key=?",
                   key) == [(1,)]
    for key, mid, seq, _ in acked:
        ids = applied[key]
        assert ids[int(seq) - 1:int(seq)] == [mid], \
            f"acknowledged {mid} (seq {seq} of {key}) was not applied at its place"


async def test_signals_accepted_by_a_non_hosting_process_reach_the_owner_and_are_applied_in_order(
        tmp_path: Path, db_path: str, spawn: Callable[..., Worker],
        record_property: Callable[[str, object], None]) -> None:
    key, count = "tail-1", 100
    out = tmp_path / "acks.json"
    async with corral.open_runtime(db_path, entities=ENTITIES, lease_ttl=TTL) as rt:
        assert rt.host is not None
        assert len(rt.host.shards) == SHARDS
        client = spawn("client", "send", "--db", db_path, "--out", str(out), "--key", key,
                       "--count", str(count))
        await wait_for_exit([client])
        acks = json.loads(out.read_text())
        assert [a["seq"] for a in acks] == list(range(1, count + 1))

        ref = rt.ref(Clocked, key)
        await wait_until(lambda: caught_up(ref), "the owner applied the client's signals",
                         timeout=WAIT)
        stamps = (await ref.query(Clocked.applied)).items
        owners = leased_owners(db_path)
    assert [s.mid for s in stamps] == [a["mid"] for a in acks]
    assert owners == {rt.host.owner}, "the pure client took a lease"

    accepted_at = dict(sql(db_path, "SELECT message_id, accepted_at FROM journal WHERE key=?",
                           key))
    # Reported, never asserted: accepted_at (taken just before the client's commit) to
    # the owner applying the signal, which it learnt of by tailing the journal.
    latency_ms = sorted((s.applied_at - accepted_at[s.mid]) * 1000 for s in stamps)
    p50, p95 = statistics.median(latency_ms), latency_ms[int(0.95 * (count - 1))]
    record_property("pickup_latency_ms", {"p50": p50, "p95": p95, "max": latency_ms[-1]})
    print(f"\nacceptance-to-apply latency over {count} signals from another process: "
          f"p50 {p50:.1f} ms, p95 {p95:.1f} ms, max {latency_ms[-1]:.1f} ms")


async def test_after_its_host_is_sigkilled_another_process_takes_its_shards_and_running_entities_continue(  # noqa: E501
        tmp_path: Path, db_path: str, spawn: Callable[..., Worker]) -> None:
    keys, jobs = [f"pipe-{i}" for i in range(6)], 5
    ready = tmp_path / "ready.json"
    host_a = spawn("host-a", "pipeline", "--db", db_path, "--lease-ttl", str(TTL),
                   "--ready", str(ready), "--keys", ",".join(keys), "--jobs", str(jobs))
    await wait_until(ready.exists, "host A's entities processed their jobs", timeout=WAIT,
                     alive=[host_a])
    a = json.loads(ready.read_text())
    host_a.sigkill()

    async with corral.open_runtime(db_path, entities=ENTITIES, lease_ttl=TTL) as rt:
        assert rt.host is not None
        refs = {key: rt.ref(Pipeline, key) for key in keys}
        for key, ref in refs.items():
            before = [f"{key}-j{n}" for n in range(1, jobs + 1)]
            await wait_until(partial(caught_up, ref), f"{key} is hosted here again",
                             timeout=WAIT)
            # `processed` is run()-made state: rebuilt only if run() continued here.
            await wait_until(partial(_done_is, ref, before),
                             f"{key}'s run() processed its jobs again", timeout=WAIT)
        for key, ref in refs.items():
            ack = await ref.signal(Pipeline.jobs, Job(mid=f"{key}-late"))
            assert (ack.run_id, ack.started) == (1, False)
            await ref.signal(Pipeline.jobs, Job(mid="finish"))
        for key, ref in refs.items():
            result = await ref.result(timeout=30)
            assert result == [*(f"{key}-j{n}" for n in range(1, jobs + 1)), f"{key}-late"]
        taken = {shard for shard in a["shards"] if shard in {r.shard for r in refs.values()}}
        leases = dict((s, (o, e)) for s, o, e in sql(
            db_path, "SELECT shard, owner, epoch FROM leases"))
        for shard in taken:
            owner, epoch = leases[shard]
            assert owner == rt.host.owner
            assert owner != a["owner"]
            assert epoch >= 2
    for key in keys:
        assert sql(db_path, "SELECT run_id, status FROM runs WHERE etype='Pipeline' AND key=?",
                   key) == [(1, "completed")]


async def _done_is(ref: corral.EntityRef[Pipeline], want: list[str]) -> bool:
    return bool(await ref.query(Pipeline.done) == want)


async def test_a_zombie_host_writing_with_a_fence_from_an_older_epoch_gets_lease_lost_and_changes_nothing(  # noqa: E501
        db_path: str) -> None:
    key = "fenced-1"
    async with corral.open_runtime(db_path, entities=ENTITIES, host=False) as rt:
        ref = rt.ref(Recorder, key)
        await ref.signal_with_start(Recorder.note, Note(mid="n-1"), start=Start(),
                                    message_id="n-1")
        shard = ref.shard
    zombie = await open_store(db_path, shards=SHARDS)
    owner_b = await open_store(db_path, shards=SHARDS)
    try:
        update = "u-1"
        await zombie.accept(Acceptance(
            "Recorder", key, shard, EntryKind.UPDATE, "tally", update, "{}",
            payload_hash("tally", "{}"), None, None, corral.IdReusePolicy.ALLOW_DUPLICATE,
            time.time()))
        old = await zombie.acquire_leases("zombie", [shard], 0.2)
        assert list(old) == [shard]
        old_fence = Fence(shard, "zombie", old[shard])

        taken: dict[int, int] = {}

        async def b_takes_over() -> bool:  # at the zombie's term: SQLite judges a lease
            # expired when it saw the row unchanged for its own term (`_sightings`)
            taken.update(await owner_b.acquire_leases("owner-b", [shard], 0.2))
            return shard in taken

        await wait_until(b_takes_over, "the zombie's lease expires and B takes the shard",
                         timeout=WAIT)
        assert taken[shard] == old_fence.epoch + 1
        new_fence = Fence(shard, "owner-b", taken[shard])

        before = dump(db_path)
        with pytest.raises(corral.LeaseLostError):
            await zombie.close_run(old_fence, "Recorder", key, 1, applied_seq=2,
                                   status=corral.RunStatus.COMPLETED, result="[]", error=None)
        with pytest.raises(corral.LeaseLostError):
            await zombie.record_update(old_fence, "Recorder", key, update,
                                       UpdateOutcome("1", None))
        with pytest.raises(corral.LeaseLostError):  # the right owner name is not enough
            await zombie.record_update(Fence(shard, "owner-b", old_fence.epoch), "Recorder",
                                       key, update, UpdateOutcome("1", None))
        assert await zombie.renew_leases("zombie", {shard: old_fence.epoch}, 30.0) == set()
        assert dump(db_path) == before

        # The current holder's identical writes go through.
        await owner_b.record_update(new_fence, "Recorder", key, update, UpdateOutcome("2", None))
        assert await owner_b.close_run(new_fence, "Recorder", key, 1, applied_seq=2,
                                       status=corral.RunStatus.COMPLETED, result="[]",
                                       error=None)
        assert sql(db_path, "SELECT outcome FROM dedupe WHERE key=? AND message_id=?",
                   key, update) == [(UpdateOutcome("2", None).to_json(),)]
        assert sql(db_path, "SELECT status FROM runs WHERE key=?", key) == [("completed",)]
    finally:
        await zombie.close()
        await owner_b.close()
