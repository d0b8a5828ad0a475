"""Schedules (`rt.schedules`) on the test clock, on both stores: specs (cron across DST
in a named zone, interval with offset), overlap policies, the catch-up window,
pause/resume, backfill and triggers; every tick delivered once (its derived message id)."""

from __future__ import annotations

import datetime as dt
from typing import ClassVar

import pytest
from pydantic import BaseModel

import corral
import corral.metrics
import corral.testing
from corral.persistence import FireOp, tick_message_id
from stores import sql

UTC = dt.timezone.utc


class Tick(BaseModel):
    level: int = 1


class Start(BaseModel):
    owner: str = "ops"


class Gate:
    """Closed: `Ticker.__init__` raises, so the run is suspended and its signals stay
    unapplied until the test opens it and resumes the run."""

    closed = False


class Ticker(corral.Entity):
    run_retry: ClassVar[corral.RetryPolicy] = corral.RetryPolicy(
        max_attempts=None, initial_backoff=3600.0, max_backoff=3600.0)

    def __init__(self, init: Start) -> None:
        if Gate.closed:
            raise RuntimeError("gate closed")
        self.applied_at: list[float] = []

    @corral.signal
    def tick(self, t: Tick) -> None:
        self.applied_at.append(self.now())

    @corral.query
    def seen(self) -> list[float]:
        return self.applied_at


def epoch(*args: int) -> float:
    return dt.datetime(*args, tzinfo=UTC).timestamp()


def delivered(db_path: str, sid: str) -> list[str]:
    """The message ids of the schedule's ticks in the entity's journal, in order."""
    rows = sql(db_path, "SELECT message_id FROM journal WHERE message_id LIKE ? ORDER BY seq",
               f"schedule:{sid}%")
    return [r[0] for r in rows]


@pytest.fixture(autouse=True)
def _open_gate() -> None:
    Gate.closed = False


async def test_a_cron_schedule_in_a_named_zone_fires_each_wall_clock_time_once_across_dst(
        db_path: str) -> None:
    # New York springs forward on 2026-03-08 (02:00 EST -> 03:00 EDT): 02:30 does not
    # exist that day and fires at 03:30 EDT; it falls back on 2026-11-01, when 01:30
    # happens twice and fires at the first only.
    async with corral.testing.open_test_runtime(entities=[Ticker], store=db_path,
                                                start=epoch(2026, 3, 6)) as env:
        rt = env.runtime
        ref = rt.ref(Ticker, "t-1")
        await rt.schedules.create("spring", ref, Ticker.tick, Tick(), start=Start(),
                                  spec=corral.Cron("0 30 2 * * *",
                                                   time_zone="America/New_York"))
        await env.advance(days=4)
        assert delivered(db_path, "spring") == [
            "schedule:spring@2026-03-06T07:30:00Z",  # 02:30 EST
            "schedule:spring@2026-03-07T07:30:00Z",
            "schedule:spring@2026-03-08T07:30:00Z",  # 03:30 EDT: 02:30 skipped by DST
            "schedule:spring@2026-03-09T06:30:00Z",  # 02:30 EDT
        ]
        await rt.schedules.create("fall", rt.ref(Ticker, "t-2"), Ticker.tick, Tick(),
                                  start=Start(),
                                  spec=corral.Calendar(minute="*/30", hour="1",
                                                       time_zone="America/New_York"))
        env.clock.set_time(epoch(2026, 10, 31, 12))
        await rt.schedules.update("fall", rt.ref(Ticker, "t-2"), Ticker.tick, Tick(),
                                  start=Start(),
                                  spec=corral.Calendar(minute="*/30", hour="1",
                                                       time_zone="America/New_York"))
        await env.advance(days=1)
        assert delivered(db_path, "fall") == [
            "schedule:fall@2026-11-01T05:00:00Z",  # 01:00 EDT
            "schedule:fall@2026-11-01T05:30:00Z",  # 01:30 EDT; its EST repeat never fires
        ]
        assert await rt.ref(Ticker, "t-2").query(Ticker.seen) == [
            epoch(2026, 11, 1, 5), epoch(2026, 11, 1, 5, 30)]


async def test_an_interval_with_an_offset_fires_at_the_offset_past_each_period(
        db_path: str) -> None:
    async with corral.testing.open_test_runtime(entities=[Ticker], store=db_path,
                                                start=epoch(2026, 1, 1)) as env:
        rt = env.runtime
        ref = rt.ref(Ticker, "t-1")
        info = await rt.schedules.create("every-minute", ref, Ticker.tick, Tick(level=2),
                                         start=Start(),
                                         spec=corral.Interval(every=60, offset=15))
        assert info.next_ticks[:2] == (epoch(2026, 1, 1, 0, 0, 15),
                                       epoch(2026, 1, 1, 0, 1, 15))
        await env.advance(minutes=5)
        assert delivered(db_path, "every-minute") == [
            tick_message_id("every-minute", int(epoch(2026, 1, 1, 0, m, 15)))
            for m in range(5)]
        assert await ref.query(Ticker.seen) == [epoch(2026, 1, 1, 0, m, 15) for m in range(5)]
        described = await rt.schedules.describe("every-minute")
        assert (described.fired, described.skipped) == (5, 0)
        assert [o.outcome for o in described.outcomes] == ["accepted"] * 4 + ["started"]


async def _pending_first_tick(env: corral.testing.TestRuntime, overlap: corral.Overlap
                              ) -> None:
    """A schedule every minute whose first tick's signal stays unapplied (the run it
    starts is suspended) while four more ticks come due."""
    Gate.closed = True
    await env.runtime.schedules.create(
        "s", env.runtime.ref(Ticker, "t-1"), Ticker.tick, Tick(), start=Start(),
        spec=corral.Interval(every=60), overlap=overlap)
    await env.advance(minutes=5, seconds=30)


@pytest.mark.parametrize("overlap", list(corral.Overlap))
async def test_overlap_policies_hold_ticks_while_the_previous_tick_is_not_applied(
        db_path: str, overlap: corral.Overlap) -> None:
    start = epoch(2026, 1, 1)
    async with corral.testing.open_test_runtime(entities=[Ticker], store=db_path,
                                                start=start) as env:
        await _pending_first_tick(env, overlap)
        info = await env.runtime.schedules.describe("s")
        ids = delivered(db_path, "s")
        if overlap is corral.Overlap.ALLOW:
            assert len(ids) == 5
            assert info.skipped == 0
        elif overlap is corral.Overlap.SKIP:
            assert ids == [tick_message_id("s", int(start + 60))]
            assert info.skipped == 4
            assert info.buffered is None
        else:
            assert ids == [tick_message_id("s", int(start + 60))]
            assert info.skipped == 3
            assert info.buffered == start + 300
        Gate.closed = False
        await env.runtime.ref(Ticker, "t-1").resume()  # the first tick is applied now
        await env.advance(minutes=3)
        ids = delivered(db_path, "s")
        applied = await env.runtime.ref(Ticker, "t-1").query(Ticker.seen)
        assert len(applied) == len(ids) == len(set(ids))  # each delivered once, applied
        late = tick_message_id("s", int(start + 300))
        assert (late in ids) is (overlap is not corral.Overlap.SKIP)


async def test_missed_ticks_inside_the_catch_up_window_fire_on_return_the_older_are_skipped(
        db_path: str) -> None:
    start = epoch(2026, 1, 1)
    async with corral.testing.open_test_runtime(entities=[Ticker], store=db_path,
                                                start=start) as env:
        rt = env.runtime
        await rt.schedules.create("s", rt.ref(Ticker, "t-1"), Ticker.tick, Tick(),
                                  start=Start(), spec=corral.Interval(every=60),
                                  overlap=corral.Overlap.ALLOW, catchup_window=150)
        env.clock.set_time(start + 600)  # ten minutes with no round: every host was down
        await env.advance(0)
        assert delivered(db_path, "s") == [tick_message_id("s", int(start + s))
                                           for s in (480, 540, 600)]
        info = await rt.schedules.describe("s")
        assert (info.fired, info.skipped) == (3, 7)
        assert "7 tick(s) missed" in info.outcomes[0].detail


async def test_a_paused_schedule_skips_its_ticks_and_resumes_from_the_next_one(
        db_path: str) -> None:
    start = epoch(2026, 1, 1)
    async with corral.testing.open_test_runtime(entities=[Ticker], store=db_path,
                                                start=start) as env:
        rt = env.runtime
        await rt.schedules.create("s", rt.ref(Ticker, "t-1"), Ticker.tick, Tick(),
                                  start=Start(), spec=corral.Interval(every=60))
        await env.advance(minutes=1)
        paused = await rt.schedules.pause("s")
        assert paused.paused
        assert paused.next_ticks == ()
        await env.advance(minutes=5)
        assert len(delivered(db_path, "s")) == 1
        resumed = await rt.schedules.resume("s")
        assert resumed.next_ticks[0] == start + 420
        await env.advance(minutes=2)
        assert delivered(db_path, "s") == [tick_message_id("s", int(start + s))
                                           for s in (60, 420, 480)]


async def test_a_backfill_delivers_each_tick_of_its_range_once_whatever_fired_before(
        db_path: str) -> None:
    start = epoch(2026, 1, 1)
    async with corral.testing.open_test_runtime(entities=[Ticker], store=db_path,
                                                start=start) as env:
        rt = env.runtime
        ref = rt.ref(Ticker, "t-1")
        await rt.schedules.create("s", ref, Ticker.tick, Tick(), start=Start(),
                                  spec=corral.Interval(every=60))
        await env.advance(minutes=3)  # 60, 120 and 180 fired
        result = await rt.schedules.backfill("s", start - 120, start + 180)
        assert result.outcomes == ("accepted", "accepted", "accepted", "duplicate",
                                   "duplicate", "duplicate")
        again = await rt.schedules.backfill("s", start - 120, start + 180)
        assert again.delivered == 0
        await env.settle()
        ids = delivered(db_path, "s")
        assert sorted(ids) == [tick_message_id("s", int(start + s))
                               for s in (-120, -60, 0, 60, 120, 180)]
        assert len(await ref.query(Ticker.seen)) == 6


async def test_a_trigger_delivers_once_per_token(db_path: str) -> None:
    async with corral.testing.open_test_runtime(entities=[Ticker], store=db_path) as env:
        rt = env.runtime
        ref = rt.ref(Ticker, "t-1")
        await rt.schedules.create("s", ref, Ticker.tick, Tick(), start=Start(),
                                  spec=corral.Interval(every=3600), paused=True)
        assert (await rt.schedules.trigger("s", token="deploy-1")).outcomes == ("started",)
        assert (await rt.schedules.trigger("s", token="deploy-1")).outcomes == ("duplicate",)
        await env.settle()
        assert len(await ref.query(Ticker.seen)) == 1


async def test_a_plain_signal_schedule_records_a_refusal_while_the_entity_is_not_running(
        db_path: str) -> None:
    start = epoch(2026, 1, 1)
    async with corral.testing.open_test_runtime(entities=[Ticker], store=db_path,
                                                start=start) as env:
        rt = env.runtime
        await rt.schedules.create("s", rt.ref(Ticker, "t-1"), Ticker.tick, Tick(),
                                  spec=corral.Interval(every=60), max_ticks=2)
        await env.advance(minutes=1)
        info = await rt.schedules.describe("s")
        assert info.outcomes[0].outcome == "refused"
        assert "EntityNotRunningError" in info.outcomes[0].detail
        await rt.ref(Ticker, "t-1").start(start=Start())
        await env.advance(minutes=5)
        info = await rt.schedules.describe("s")
        assert info.fired == 2
        assert info.next_ticks == ()
        assert len(delivered(db_path, "s")) == 1


async def test_a_round_repeated_with_the_version_it_read_fires_nothing_more(
        db_path: str) -> None:
    """A holder whose round's commit outcome was unknown retries it: the row's version
    moved, so the retry does nothing; and a tick delivered again (as by an old holder)
    is a duplicate at the entity (its derived message id)."""
    start = epoch(2026, 1, 1)
    async with corral.testing.open_test_runtime(entities=[Ticker], store=db_path,
                                                start=start) as env:
        rt = env.runtime
        await rt.schedules.create("s", rt.ref(Ticker, "t-1"), Ticker.tick, Tick(),
                                  start=Start(), spec=corral.Interval(every=60))
        store = rt.store
        env.clock.set_time(start + 60)
        host = rt.host
        assert host is not None
        due = await store.due_schedules(frozenset(range(store.shards)), start + 60, limit=10)
        shard = host.shard(due[0].shard)  # type: ignore[attr-defined]
        op = FireOp(shard.fence, "s", due[0].version, "t", "t-1", None, start + 60)
        first, second = await store.fire_schedules([op, op])
        assert not first.raced
        assert first.outcomes == ("started",)
        assert second.raced
        assert second.outcomes == ()
        again = await rt.schedules.backfill("s", start + 60, start + 60)
        assert again.outcomes == ("duplicate",)
        await env.advance(0)
        assert delivered(db_path, "s") == [tick_message_id("s", int(start + 60))]


@pytest.mark.parametrize("bad", ["\ud800", "a\x00b", "", "x" * 201])
async def test_a_hostile_schedule_id_is_refused_and_nothing_is_stored(bad: str) -> None:
    async with corral.testing.open_test_runtime(entities=[Ticker]) as env:
        rt = env.runtime
        with pytest.raises(corral.CorralError):
            await rt.schedules.create(bad, rt.ref(Ticker, "t-1"), Ticker.tick, Tick(),
                                      spec=corral.Interval(every=60))
        assert await rt.schedules.list() == []


@pytest.mark.parametrize("options", [
    {"note": "\ud800"}, {"note": "bell\x07"}, {"catchup_window": float("nan")},
    {"jitter": -1.0}, {"end_at": float("inf")}, {"max_ticks": 0}, {"overlap": "sometimes"},
    {"end_at": dt.datetime(2030, 1, 1)},  # naive
])
async def test_hostile_options_are_refused_and_nothing_is_stored(options: dict[str, object]
                                                                  ) -> None:
    async with corral.testing.open_test_runtime(entities=[Ticker]) as env:
        rt = env.runtime
        with pytest.raises(corral.InvalidArgumentError):
            await rt.schedules.create("s", rt.ref(Ticker, "t-1"), Ticker.tick, Tick(),
                                      spec=corral.Interval(every=60),
                                      **options)  # type: ignore[arg-type]
        assert await rt.schedules.list() == []


async def test_hostile_specs_payloads_and_ids_get_typed_errors() -> None:
    async with corral.testing.open_test_runtime(entities=[Ticker]) as env:
        rt = env.runtime
        ref = rt.ref(Ticker, "t-1")
        with pytest.raises(ValueError, match="six fields"):
            corral.Cron("0 0 9 * *")
        with pytest.raises(ValueError, match="offset"):
            corral.Interval(every=60, offset=60)
        with pytest.raises(corral.InvalidArgumentError):
            await rt.schedules.create("s", ref, Ticker.tick, Tick(),
                                      spec=corral.Cron("0 0 9 31 2 *"))  # never ticks
        with pytest.raises(corral.InvalidPayloadError):
            await rt.schedules.create("s", ref, Ticker.tick,
                                      Tick.model_construct(level="x"),  # type: ignore[arg-type]
                                      spec=corral.Interval(every=60))
        with pytest.raises(ValueError, match="time zone"):
            corral.Cron("0 0 9 * * *", time_zone="Mars/Olympus")
        with pytest.raises(corral.InvalidKeyError):
            await ref.signal_with_start(Ticker.tick, Tick(), start=Start(),
                                        message_id="schedule:s@2026-01-01T00:00:00Z")
        with pytest.raises(corral.ScheduleNotFoundError):
            await rt.schedules.pause("nope")
        await rt.schedules.create("s", ref, Ticker.tick, Tick(), spec=corral.Interval(every=60))
        with pytest.raises(corral.ScheduleExistsError):
            await rt.schedules.create("s", ref, Ticker.tick, Tick(),
                                      spec=corral.Interval(every=60))
        assert [i.id for i in await rt.schedules.list()] == ["s"]
        assert await rt.schedules.delete("s")
        assert await rt.schedules.list() == []


def sample(name: str, **labels: str) -> float:
    return corral.metrics.REGISTRY.get_sample_value(name, labels) or 0.0


async def test_ticks_fired_skipped_and_their_lateness_are_counted_in_metrics() -> None:
    start = epoch(2026, 1, 1)
    fired = ("corral_schedule_ticks_fired_total", {"entity_type": "Ticker",
                                                   "outcome": "accepted"})
    missed = ("corral_schedule_ticks_skipped_total", {"entity_type": "Ticker",
                                                      "reason": "missed"})
    late = ("corral_schedule_lateness_seconds_count", {"entity_type": "Ticker"})
    late_sum = ("corral_schedule_lateness_seconds_sum", {"entity_type": "Ticker"})
    before = [sample(n, **labels) for n, labels in (fired, missed, late, late_sum)]
    async with corral.testing.open_test_runtime(entities=[Ticker], start=start) as env:
        rt = env.runtime
        await rt.ref(Ticker, "t-1").start(start=Start())
        await rt.schedules.create("s", rt.ref(Ticker, "t-1"), Ticker.tick, Tick(),
                                  spec=corral.Interval(every=60), catchup_window=90,
                                  overlap=corral.Overlap.ALLOW)
        await env.advance(minutes=2)  # two ticks on time
        env.clock.set_time(start + 420)  # a round 5 minutes late: 180..420 due
        await env.advance(0)
    after = [sample(n, **labels) for n, labels in (fired, missed, late, late_sum)]
    assert [a - b for a, b in zip(after, before, strict=True)][:3] == [4, 3, 4]
    assert after[3] - before[3] == pytest.approx(60 + 0)  # 0, 0, 60 (360) and 0 (420) late


async def test_jitter_delays_each_tick_by_its_derived_amount_and_end_at_stops_it() -> None:
    from corral._schedule_spec import jitter_of

    start = epoch(2026, 1, 1)
    async with corral.testing.open_test_runtime(entities=[Ticker], start=start) as env:
        rt = env.runtime
        ref = rt.ref(Ticker, "t-1")
        await rt.schedules.create("s", ref, Ticker.tick, Tick(), start=Start(),
                                  spec=corral.Interval(every=60), jitter=30.0,
                                  end_at=start + 180)
        await env.advance(minutes=10)
        ticks = [int(start + s) for s in (60, 120, 180)]
        applied = await ref.query(Ticker.seen)
        assert applied == [t + jitter_of("s", t, 30.0) for t in ticks]
        assert all(0 < a - t < 30 for a, t in zip(applied, ticks, strict=True))
        info = await rt.schedules.describe("s")
        assert info.fired == 3
        assert info.next_ticks == ()  # ended
        assert [o.message_id for o in reversed(info.outcomes)] == [
            tick_message_id("s", t) for t in ticks]


async def test_a_damaged_schedule_row_fails_alone(db_path: str) -> None:
    start = epoch(2026, 1, 1)
    async with corral.testing.open_test_runtime(entities=[Ticker], store=db_path,
                                                start=start) as env:
        rt = env.runtime
        for sid in ("bad", "good"):
            await rt.schedules.create(sid, rt.ref(Ticker, sid), Ticker.tick, Tick(),
                                      start=Start(), spec=corral.Interval(every=60))
        sql(db_path, "UPDATE schedules SET definition = '{\"spec\": 1}' WHERE id = 'bad'")
        await env.advance(minutes=3)
        assert len(delivered(db_path, "good")) == 3
        assert delivered(db_path, "bad") == []
        with pytest.raises(corral.CorruptRowError, match="schedule 'bad'"):
            await rt.schedules.describe("bad")
        assert [i.id for i in await rt.schedules.list()] == ["good"]
        await rt.schedules.update("bad", rt.ref(Ticker, "bad"), Ticker.tick, Tick(),
                                  start=Start(), spec=corral.Interval(every=60))
        await env.advance(minutes=1)
        assert len(delivered(db_path, "bad")) == 1  # replaced, it fires again
