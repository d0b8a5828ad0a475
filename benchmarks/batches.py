"""Batches benchmark: 10,000 signals as `signal_many` batches of 500, against 10,000
single `signal_with_start` calls, in one run, on both stores.

Run from the repository root:

    .venv/bin/python benchmarks/batches.py                # SQLite and PostgreSQL (~1-2 min)
    .venv/bin/python benchmarks/batches.py --no-postgres  # SQLite only

What a stream consumer does with a poll of 500 events, three ways, each into 1,000
entities (keys drawn at random, the same sequence for every way), through the public
API on a pure client (`host=False`: acceptance only, the cost a consumer waits for):

- **batches**: one `rt.signal_many([...500 SignalItems...])` per poll, polls one after
  another (one transaction per poll);
- **singles, 500 in flight**: the poll's 500 `signal_with_start` calls at once
  (`asyncio.gather`), polls one after another: they share group commits, but each is
  its own op;
- **singles, one at a time**: each call awaited before the next (the simplest consumer).

A fresh store per way (a SQLite file in a temp dir, WAL, `synchronous=FULL`; a fresh
PostgreSQL database with `fsync=on`). Prints a table (signals/s, ratio of batches to
each) and writes benchmarks/results/batches.json.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import random
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import _pg
from accept import write_json
from pydantic import BaseModel

import corral

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "batches.json"
SIGNALS, BATCH, ENTITIES = 10_000, 500, 1_000


class Open(BaseModel):
    tenant: str


class Event(BaseModel):
    id: str
    body: str


class Stream(corral.Entity):
    def __init__(self, init: Open) -> None:
        self.tenant = init.tenant

    @corral.signal
    def event(self, event: Event) -> None:
        pass


def _polls() -> list[list[tuple[str, str]]]:
    rng = random.Random(28)
    events = [(f"key-{rng.randrange(ENTITIES)}", f"evt-{n}") for n in range(SIGNALS)]
    return [events[i:i + BATCH] for i in range(0, SIGNALS, BATCH)]


Way = Callable[[corral.Runtime, list[tuple[str, str]]], Awaitable[None]]
START = Open(tenant="acme")


async def batches(rt: corral.Runtime, poll: list[tuple[str, str]]) -> None:
    acks = await rt.signal_many([
        corral.SignalItem(rt.ref(Stream, key), Stream.event, Event(id=mid, body="b"),
                          message_id=mid, start=START) for key, mid in poll])
    assert all(a.status == "accepted" for a in acks)


async def singles_in_flight(rt: corral.Runtime, poll: list[tuple[str, str]]) -> None:
    await asyncio.gather(*(
        rt.ref(Stream, key).signal_with_start(Stream.event, Event(id=mid, body="b"),
                                              start=START, message_id=mid)
        for key, mid in poll))


async def singles_one_at_a_time(rt: corral.Runtime, poll: list[tuple[str, str]]) -> None:
    for key, mid in poll:
        await rt.ref(Stream, key).signal_with_start(Stream.event, Event(id=mid, body="b"),
                                                    start=START, message_id=mid)


WAYS: dict[str, Way] = {"batches of 500": batches, "singles, 500 in flight": singles_in_flight,
                        "singles, one at a time": singles_one_at_a_time}


async def measure(store: str, way: Way) -> float:
    """Signals per second of `way` over the whole stream into a fresh store."""
    async with corral.open_runtime(store, entities=[Stream], host=False) as rt:
        await way(rt, [("warm-up", "warm-up")])
        began = time.perf_counter()
        for poll in _polls():
            await way(rt, poll)
        return SIGNALS / (time.perf_counter() - began)


async def bench(stores: Callable[[str], Any]) -> dict[str, float]:
    rates: dict[str, float] = {}
    for name, way in WAYS.items():
        async with stores(name.replace(" ", "-").replace(",", "")) as store:
            rates[name] = await measure(store, way)
        print(f"  {name:<24} {rates[name]:>9,.0f} signals/s", flush=True)
    return rates


def table(engine: str, rates: dict[str, float]) -> str:
    batch = rates["batches of 500"]
    lines = [f"| {engine} | signals/s | batches of 500 vs this |", "|---|---|---|"]
    lines += [f"| {name} | {rate:,.0f} | {batch / rate:.1f}x |" for name, rate in rates.items()]
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> None:
    result: dict[str, Any] = {"signals": SIGNALS, "batch": BATCH, "entities": ENTITIES,
                              "machine": platform.platform(), "date": time.strftime("%F")}
    tables = []
    with tempfile.TemporaryDirectory() as tmp:
        import contextlib

        @contextlib.asynccontextmanager
        async def sqlite_file(name: str) -> Any:
            yield str(Path(tmp) / f"{name}.db")

        print("SQLite", flush=True)
        result["sqlite"] = await bench(sqlite_file)
        tables.append(table("SQLite", result["sqlite"]))
    if not args.no_postgres:
        try:
            with _pg.throwaway_server() as server:
                print("PostgreSQL", flush=True)
                result["postgresql"] = await bench(server.database)
                tables.append(table("PostgreSQL", result["postgresql"]))
        except _pg.ServerUnavailable as err:
            print(f"PostgreSQL: not run ({err})")
            result["postgresql"] = f"not run: {err}"
    print("\n" + "\n\n".join(tables))
    write_json(args.out, result)
    print(f"written to {args.out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    asyncio.run(main(parser.parse_args()))
