"""The scale benchmark (`python -m benchmarks.scale`, issue 42): its bulk builder makes
stores corral reads, hosts and signals like its own, on both engines, and its table
computes growth ratios from a tiny run."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import corral

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import _bulk  # noqa: E402
import scale  # noqa: E402

ENTITIES, RUNNING = 2_000, 200
TYPES = _bulk.entity_types(3)
CLASSES = {c.__name__: c for c in TYPES}


def _of(i: int) -> tuple[type[corral.Entity], str]:
    key = _bulk.key_of(i)
    return CLASSES[_bulk.ENTITY_TYPES[i % 3].__name__], key


def _first(kind: str) -> int:
    return next(i for i in range(ENTITIES)
                if _bulk.kind_of(i, entities=ENTITIES, running=RUNNING) == kind)


def _corral(*args: str, store: str) -> str:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "benchmarks"),
                                          os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([str(Path(sys.executable).with_name("corral")), *args, "--store",
                           store, "--app", "_bulk:APP", "--shards", "16"],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


async def test_a_bulk_built_store_is_listed_shown_and_signalled_like_one_corral_wrote(
        db_path: str) -> None:
    built = await _bulk.build(db_path, entities=ENTITIES, running=RUNNING, shards=16)
    assert built["entities"] == ENTITIES
    closed_type, closed = _of(_first("closed"))
    dead_type, dead = _of(_first("dead"))
    live_type, live = _of(_first("running"))

    async with corral.open_runtime(db_path, entities=TYPES, shards=16, host=False) as rt:
        census = await rt.census()
        described = await rt.ref(dead_type, dead).describe()
        history = await rt.ref(closed_type, closed).history()
        letters = await rt.dead_letters(limit=100)
        page = await rt.entities(limit=300)
        # Each row sits in the shard corral routes its key to.
        assert [e.shard for e in page.items] == [
            rt.ref(CLASSES[e.entity_type], e.key).shard for e in page.items]
    # The census counts what the builder says it built.
    kinds = [_bulk.kind_of(i, entities=ENTITIES, running=RUNNING) for i in range(ENTITIES)]
    assert sum(n for _, status, n in census.entities if status == "completed") == \
        kinds.count("closed")
    assert sum(n for _, n in census.dead_letters) == kinds.count("dead") == len(letters)
    assert sum(n for _, n in census.open_waits) == kinds.count("waiting")
    assert sum(n for _, n in census.suspended_runs) == kinds.count("suspended") > 0
    assert (described.status, described.snapshot_seq, described.dead_letters) == (
        corral.RunStatus.RUNNING, 2, 1)
    assert [m.name for m in history.messages.items] == ["add", "close"]
    assert history.runs[0].status is corral.RunStatus.COMPLETED

    # A running built entity is activated by a host from its rows, and takes a signal.
    async with corral.open_runtime(db_path, entities=TYPES, shards=16) as rt:
        ref = rt.ref(live_type, live)
        ack = await ref.signal(live_type.add, _bulk.Item(n=5), message_id="after-build")
        assert (ack.status, ack.seq) == ("accepted", 2)
        for _ in range(400):
            if (await ref.describe()).applied_seq == 2:
                break
            await asyncio.sleep(0.025)
        assert (await ref.describe()).applied_seq == 2

    # The operator's command reads it too.
    listed = await asyncio.to_thread(_corral, "ls", "--limit", "5", store=db_path)
    shown = await asyncio.to_thread(_corral, "show", dead_type.__name__, dead, store=db_path)
    told = await asyncio.to_thread(_corral, "history", closed_type.__name__, closed,
                                   store=db_path)
    assert "key-00000000" in listed
    assert "dead letters" in shown
    assert dead in shown
    assert "close" in told


async def test_a_census_read_from_the_summaries_hold_writes_equals_the_exact_count(
        db_path: str) -> None:
    await _bulk.build(db_path, entities=ENTITIES, running=RUNNING, shards=16)
    running = [i for i in range(ENTITIES)
               if _bulk.kind_of(i, entities=ENTITIES, running=RUNNING) == "running"][:7]
    async with corral.open_runtime(db_path, entities=TYPES, shards=16, host=False) as rt:
        # A backlog in several types and shards: accepted, never applied (no host).
        for n, i in enumerate(running):
            etype, key = _of(i)
            for m in range(1 + n % 3):
                await rt.ref(etype, key).signal(etype.add, _bulk.Item(n=m),
                                                message_id=f"behind-{m}")
        exact = await rt.census()
        assert await _bulk.hold(db_path) == 16
        summed = await rt.census()

    assert (summed.hosts, summed.shards_held, exact.shards_held) == (1, 16, 0)
    assert len(exact.backlog) == 3
    assert sum(b.messages for b in exact.backlog) == sum(1 + n % 3 for n in range(7))
    assert summed.backlog == exact.backlog
    assert (summed.entities, summed.dead_letters, summed.open_waits, summed.suspended_runs) \
        == (exact.entities, exact.dead_letters, exact.open_waits, exact.suspended_runs)


def test_the_growth_ratio_runs_from_the_smallest_size_to_the_largest_and_flags_above_bound(
        ) -> None:
    figures = [{"engine": "sqlite", "item": "reads", "case": "ls", "unit": "steps",
                "size": size, "value": value}
               for size, value in ((10_000, 100.0), (1_000_000, 300.0), (100_000, 120.0))]
    figures += [{"engine": "sqlite", "item": "build", "case": "seconds", "unit": "s",
                 "size": size, "value": size / 1000} for size in (10_000, 1_000_000)]
    figures += [{"engine": "sqlite", "item": "reads", "case": "show", "unit": "steps",
                 "size": size, "value": 50.0} for size in (10_000, 1_000_000)]

    rows = {r["case"]: r for r in scale.growth(figures)}
    table = scale.render(list(rows.values()))

    assert (rows["ls"]["ratio"], rows["ls"]["over"]) == (3.0, True)
    assert (rows["show"]["ratio"], rows["show"]["over"]) == (1.0, False)
    assert (rows["seconds"]["ratio"], rows["seconds"]["over"]) == (100.0, False)
    assert "| sqlite | reads | ls | steps | 100 | 120 | 300 | x3.00 ! |" in table


def test_scale_py_runs_the_reads_part_and_writes_each_read_with_its_growth(
        tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.scale", "--sizes", "300,900", "--no-postgres",
         "--only", "reads,census", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)

    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(out.read_text())
    cases = {(r["item"], r["case"], r["unit"]) for r in data["growth"]}
    for item, case, _ in _cases():
        assert {(item, case, "steps"), (item, case, "ms")} <= cases, case
    for case in ("census (no host: exact fallback)", "census (hosts holding every shard)"):
        census = next(r for r in data["growth"] if r["case"] == case and r["unit"] == "steps")
        assert set(census["values"]) == {"300", "900"}
        assert census["ratio"] is not None
    assert data["table"] in done.stdout


def _cases() -> list[tuple[str, str, object]]:
    import _scale_reads

    return [*_scale_reads.reads(900), _scale_reads.CENSUS_HELD]

