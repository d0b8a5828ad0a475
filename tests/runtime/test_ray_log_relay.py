"""The pieces of the host actors' log relay that need no Ray (`runtime/ray/_logs`): a
record's trip as data, and the relay's ring. On Ray end to end: tests/ray/test_ray_env.py."""

from __future__ import annotations

import asyncio
import logging

import pytest

from corral.runtime.ray._logs import LogRelay, _emit, _entry


def _record(msg: str, *, created: float = 1.0) -> dict[str, object]:
    return {"namespace": "ns", "name": "corral.test", "levelno": 20, "msg": msg,
            "created": created}


def test_a_record_arrives_with_its_name_level_fields_and_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    try:
        raise ValueError("cannot take bad-1")
    except ValueError as err:
        record = logging.LogRecord("corral.shard", logging.ERROR, __file__, 7,
                                   "%s moved to dead letter %d", ("k", 3), (type(err), err,
                                                                            err.__traceback__))
    record.event = "dead-lettered"
    record.payload = object()  # not plain data: stays behind
    entry = _entry(record, "ns", "corral/ns/shard-1")
    caplog.set_level(logging.INFO, logger="corral")
    _emit(entry)
    [got] = caplog.records
    assert (got.name, got.levelno, got.getMessage()) == (
        "corral.shard", logging.ERROR, "k moved to dead letter 3")
    assert "ValueError: cannot take bad-1" in got.exc_text
    assert "Traceback (most recent call last)" in caplog.text
    assert (got.event, got.processName, got.corral_relayed) == (
        "dead-lettered", "corral/ns/shard-1", True)
    assert not hasattr(got, "payload")


def test_a_record_below_the_drivers_level_is_not_emitted(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="corral")
    _emit({"name": "corral.host", "levelno": logging.INFO, "msg": "took shard 1"})
    assert caplog.records == []


async def test_the_relay_keeps_a_ring_and_tells_a_reader_what_it_missed() -> None:
    relay = LogRelay(capacity=3)
    await relay.append([_record(f"m{i}") for i in range(2)])
    cursor, found, missed = await relay.read("ns", 0, 0.0, 0.01)
    assert (cursor, [r["msg"] for r in found], missed) == (2, ["m0", "m1"], 0)
    await relay.append([_record(f"m{i}") for i in range(2, 7)])
    cursor, found, missed = await relay.read("ns", cursor, 0.0, 0.01)
    assert (cursor, [r["msg"] for r in found], missed) == (7, ["m4", "m5", "m6"], 2)


async def test_a_reader_gets_its_namespace_since_it_opened_and_waits_for_news() -> None:
    relay = LogRelay()
    await relay.append([_record("old", created=1.0), {**_record("other"), "namespace": "x",
                                                      "created": 5.0}])
    cursor, found, _ = await relay.read("ns", 0, 2.0, 0.01)
    assert (cursor, found) == (2, [])
    waiting = asyncio.ensure_future(relay.read("ns", cursor, 2.0, 30.0))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    await relay.append([_record("new", created=3.0)])
    cursor, found, _ = await asyncio.wait_for(waiting, 5)
    assert (cursor, [r["msg"] for r in found]) == (3, ["new"])


async def test_a_cursor_beyond_a_restarted_relays_end_reads_from_its_start() -> None:
    relay = LogRelay()
    await relay.append([_record("after restart", created=9.0)])
    assert [r["msg"] for r in (await relay.read("ns", 500, 2.0, 0.01))[1]] == ["after restart"]
