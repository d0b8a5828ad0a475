"""`Runtime.signal_many`: a batch of signals of mixed types and keys in one call, all or
nothing, one `Ack` per item, each entity's items in batch order (the store's side,
`Store.accept_all`, is in the contract suite on both engines)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import corral
from procs import TESTS, Worker, spawner, wait_for_exit, wait_until
from ray_workers import Counter, Item, Seen, Start, Tally
from stores import sql

ENTITIES: list[type[corral.Entity]] = [Counter, Tally]


def item(ref: corral.EntityRef, mid: str, **kwargs: object) -> corral.SignalItem:
    handler = Counter.add if ref.definition.name == "Counter" else Tally.add
    return corral.SignalItem(ref, handler, Item(id=mid), message_id=mid, **kwargs)


async def test_a_batch_of_mixed_types_and_keys_is_answered_per_item_and_applied_in_order(
    db_path: str,
) -> None:
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        a, b, t = rt.ref(Counter, "a"), rt.ref(Counter, "b"), rt.ref(Tally, "t")
        start = Start(tenant="o")
        acks = await rt.signal_many([
            item(a, "a1", start=start), item(t, "t1", start=None), item(b, "b1", start=start),
            item(a, "a2"), item(a, "a3"), item(t, "t2"), item(a, "a1", start=start)])
        assert [(x.status, x.seq, x.started) for x in acks] == [
            ("accepted", 1, True), ("accepted", 1, True), ("accepted", 1, True),
            ("accepted", 2, False), ("accepted", 3, False), ("accepted", 2, False),
            ("duplicate", 1, False)]  # a duplicate inside the batch is answered, not refused
        again = await rt.signal_many([item(a, "a2"), item(b, "b2")])  # a resent batch
        assert [(x.status, x.seq) for x in again] == [("duplicate", 2), ("accepted", 2)]

        async def applied() -> bool:
            seen: Seen = await a.query(Counter.seen)
            return len(seen.items) == 3

        await wait_until(applied, "a's three signals applied")
        assert (await a.query(Counter.seen)).items == ["a1", "a2", "a3"]
        assert (await t.query(Tally.seen)).items == ["t1", "t2"]
        assert await rt.signal_many([]) == []


async def test_a_bad_item_refuses_the_whole_batch_naming_its_index_and_nothing_is_stored(
    db_path: str,
) -> None:
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        a, never = rt.ref(Counter, "a"), rt.ref(Counter, "never")
        await a.signal_with_start(Counter.add, Item(id="a0"), start=Start(tenant="o"),
                                  message_id="a0")
        good = [item(a, "g1"), item(rt.ref(Tally, "t"), "g2", start=None)]
        bad_items: list[tuple[object, type[corral.CorralError]]] = [
            (corral.SignalItem(a, Counter.add, {"id": 5}, message_id="x"),
             corral.InvalidPayloadError),
            (corral.SignalItem(a, Tally.add, Item(id="x"), message_id="x"),
             corral.UnknownHandlerError),
            (corral.SignalItem(a, Counter.add, Item(id="x"), message_id="bad\x00id"),
             corral.InvalidKeyError),
            ("not an item", corral.InvalidArgumentError),
            (corral.SignalItem(a, Counter.add, Item(id="changed"), message_id="a0"),
             corral.IdempotencyConflictError),
            (item(never, "n1"), corral.EntityNotRunningError),
        ]
        for bad, error in bad_items:
            with pytest.raises(corral.BatchRefusedError) as refused:
                await rt.signal_many([*good, bad])  # type: ignore[list-item]
            assert refused.value.index == 2, error
            assert isinstance(refused.value.error, error), refused.value.error
            assert refused.value.__cause__ is refused.value.error
        with pytest.raises(corral.InvalidArgumentError, match="at most 10000"):
            await rt.signal_many([good[0]] * 10_001)
        async with corral.open_runtime(db_path, entities=ENTITIES, host=False) as other:
            with pytest.raises(corral.BatchRefusedError, match="not one of this runtime"):
                await other.signal_many([item(a, "foreign")])
    assert sql(db_path, "SELECT message_id FROM dedupe ORDER BY message_id") == [("a0",)]


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    with spawner(tmp_path, TESTS / "batch_worker.py") as start:
        yield start


async def test_a_batch_across_100_entities_races_single_sends_of_the_same_ids_from_3_processes(
    db_path: str, tmp_path: Path, spawn: Callable[..., Worker],
) -> None:
    fire = tmp_path / "fire"
    workers = [
        spawn(name, role, "--db", db_path, "--fire", str(fire), "--out",
              str(tmp_path / f"{name}.json"))
        for name, role in (("batch", "batch"), ("singles", "singles"),
                           ("singles2", "singles"))]
    fire.write_text("go")
    await wait_for_exit(workers)
    answers = {name: json.loads((tmp_path / f"{name}.json").read_text())
               for name in ("batch", "singles", "singles2")}
    for n in range(100):  # each id accepted by exactly one of the three, once
        statuses = [answers[name][n] for name in answers]
        assert sorted(statuses) == ["accepted", "duplicate", "duplicate"], (n, statuses)
    assert sql(db_path, "SELECT count(*), count(DISTINCT message_id) FROM journal") == [
        (100, 100)]
    assert sql(db_path, "SELECT count(*) FROM runs") == [(100,)]  # one run each
    async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
        for n in (0, 57, 99):
            ref = rt.ref(Counter, f"key-{n}")

            async def applied(ref: corral.EntityRef = ref, n: int = n) -> bool:
                return (await ref.query(Counter.seen)).items == [f"id-{n}"]

            await wait_until(applied, f"key-{n} applied once")
