"""The whole runtime on a `PostgresStore`, through the public API only.

The same entity types as the SQLite suites (`tests/support/entities.py`,
`tests/support/bounded_entities.py`), on a fresh PostgreSQL database per test: signals, updates
and queries, dedupe, closed runs and id reuse, continue-as-new with carried mailbox
payloads, snapshots keeping storage bounded, passivation with durable timers, and
poison messages through the dead letters.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel

asyncpg = pytest.importorskip("asyncpg")

import corral  # noqa: E402
from bounded_entities import (  # noqa: E402
    Chain,
    ChurnLedger,
    Reminder,
    Sleepy,
    StormMailbox,
    Wake,
)
from bounded_entities import Note as BNote  # noqa: E402
from bounded_entities import Start as BStart  # noqa: E402
from corral.persistence._postgres import open_postgres_store  # noqa: E402
from entities import (  # noqa: E402
    Assign,
    Finish,
    Job,
    JobReject,
    Poke,
    Reply,
    Start,
    Ticket,
    fresh_key,
    wait_applied,
)
from pg import pg_url as pg_fixture  # noqa: E402, F401 (fixtures, found by name)
from pg import postgres_url as cluster_fixture  # noqa: E402, F401
from procs import wait_until  # noqa: E402

START = Start(tenant="acme")


class Item(BaseModel):
    v: int


class Fragile(corral.Entity):
    """Raises for every item whose value is in `broken` (process-wide)."""

    retry = corral.RetryPolicy(max_attempts=2, initial_backoff=0.001, max_backoff=0.002)
    broken: ClassVar[set[int]] = set()

    def __init__(self, init: Start) -> None:
        self.seen: list[int] = []

    @corral.signal
    def item(self, it: Item) -> None:
        if it.v in type(self).broken:
            raise ValueError(f"cannot take item {it.v}")
        self.seen.append(it.v)

    @corral.query
    def values(self) -> list[int]:
        return list(self.seen)


ENTITIES: list[type[corral.Entity]] = [Ticket, Job, JobReject, StormMailbox, ChurnLedger,
                                       Sleepy, Reminder, Fragile]


@pytest.fixture
async def rt(pg_url: str) -> AsyncIterator[corral.Runtime]:
    store = await open_postgres_store(pg_url, shards=16)
    try:
        async with corral.open_runtime(store, entities=ENTITIES) as runtime:
            yield runtime
    finally:
        await store.close()


async def count(rt: corral.Runtime, table: str) -> int:
    store: Any = rt.store
    return int(await store.read(lambda conn: conn.fetchval(f"SELECT count(*) FROM {table}")))


@pytest.mark.every_version
async def test_signals_updates_and_queries_apply_once_in_order(rt: corral.Runtime) -> None:
    ref = rt.ref(Ticket, fresh_key())
    first = await ref.signal_with_start(Ticket.reply, Reply(text="a"), start=START,
                                        message_id="m1")
    assert (first.status, first.started, first.seq) == ("accepted", True, 1)
    again = await ref.signal_with_start(Ticket.reply, Reply(text="a"), start=START,
                                        message_id="m1")
    assert (again.status, again.seq) == ("duplicate", 1)
    with pytest.raises(corral.IdempotencyConflictError):
        await ref.signal(Ticket.reply, Reply(text="changed"), message_id="m1")
    await ref.signal(Ticket.reply, Reply(text="b"))
    assigned = await ref.update(Ticket.assign, Assign(agent="ann"), update_id="u1")
    assert (assigned.agent, assigned.number) == ("ann", 1)
    assert (await ref.update(Ticket.assign, Assign(agent="ann"), update_id="u1")).number == 1
    status = await ref.query(Ticket.status)
    assert (status.inbox, status.assignments) == (["acme:a", "acme:b"], ["ann"])


async def test_closed_runs_follow_their_id_reuse_policy(rt: corral.Runtime) -> None:
    job = rt.ref(Job, fresh_key("job"))
    await job.signal_with_start(Job.poke, Poke(n=1), start=START)
    await job.signal(Job.finish, Finish(mode="complete"))
    assert (await job.result(timeout=10)).pokes == [1]
    with pytest.raises(corral.EntityNotRunningError):
        await job.signal(Job.poke, Poke(n=2))
    second = await job.signal_with_start(Job.poke, Poke(n=3), start=START)
    assert (second.started, second.run_id) == (True, 2)
    strict = rt.ref(JobReject, fresh_key("job"))
    await strict.signal_with_start(JobReject.finish, Finish(mode="fail"), start=START)
    with pytest.raises(corral.EntityFailedError):
        await strict.result(timeout=10)
    with pytest.raises(corral.EntityClosedError):
        await strict.signal_with_start(JobReject.poke, Poke(n=1), start=START)


async def test_continue_as_new_carries_untaken_mailbox_payloads_in_order(
    rt: corral.Runtime,
) -> None:
    ref = rt.ref(StormMailbox, fresh_key("storm"))
    mids = [f"n{i}" for i in range(250)]
    await asyncio.gather(*(ref.signal_with_start(StormMailbox.notes, BNote(mid=m),
                                                 start=Chain(expect=250), message_id=m)
                           for m in mids))
    result = await ref.result(timeout=30)
    assert [a.mid for a in result.applied] == mids
    assert [a.run for a in result.applied][-1] == 3
    assert result.carried
    assert all(n > 0 for n in result.carried)


async def test_snapshots_and_continue_as_new_keep_storage_bounded(rt: corral.Runtime) -> None:
    ref = rt.ref(ChurnLedger, fresh_key("churn"))
    mids = [f"c{i}" for i in range(200)]
    for m in mids:
        await ref.signal_with_start(ChurnLedger.note, BNote(mid=m), start=Chain(),
                                    message_id=m)
    await wait_until(lambda: _history(ref, mids), "every note is applied, in order")
    assert await count(rt, "journal") < 40
    assert await count(rt, "snapshots") <= 2
    assert await count(rt, "runs") >= 5


async def _history(ref: Any, mids: list[str]) -> bool:
    return [a.mid for a in await ref.query(ChurnLedger.history)] == mids


async def test_a_passivated_entity_wakes_for_a_message_and_a_due_timer(
    rt: corral.Runtime,
) -> None:
    sleepy = rt.ref(Sleepy, fresh_key("sleepy"))
    await sleepy.signal_with_start(Sleepy.note, BNote(mid="a"), start=BStart())
    await wait_until(lambda: _resident(sleepy, False), "it passivates", timeout=10)
    await sleepy.signal(Sleepy.note, BNote(mid="b"))
    assert (await sleepy.query(Sleepy.state))["notes"] == ["a", "b"]
    reminder = rt.ref(Reminder, fresh_key("reminder"))
    due = time.time() + 0.5
    await reminder.signal_with_start(Reminder.wake, Wake(at=due), start=BStart())
    fired = await reminder.result(timeout=15)
    assert fired.fired_at >= due


async def _resident(ref: Any, hosted: bool) -> bool:
    return bool((await ref.describe()).hosted_here == hosted)


async def test_a_poison_signal_is_dead_lettered_then_replayed_once(rt: corral.Runtime) -> None:
    Fragile.broken = {2}
    ref = rt.ref(Fragile, fresh_key("fragile"))
    for v in (1, 2, 3):
        await ref.signal_with_start(Fragile.item, Item(v=v), start=START, message_id=f"i{v}")
    await wait_until(lambda: _values(ref, [1, 3]), "the entity goes on past the poison")
    [dead] = await ref.dead_letters()
    assert (dead.seq, dead.payload) == (2, '{"v":2}')
    assert "cannot take item 2" in dead.error
    Fragile.broken = set()
    replayed = await ref.replay_dead_letter(dead.id)
    assert replayed.status == "accepted"
    assert (await ref.replay_dead_letter(dead.id)).status == "duplicate"
    await wait_applied(ref, replayed.seq)
    assert await ref.query(Fragile.values) == [1, 3, 2]
    assert await rt.dead_letters() == []


async def _values(ref: Any, want: list[int]) -> bool:
    return bool(await ref.query(Fragile.values) == want)
