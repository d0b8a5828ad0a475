"""The cost of a send made by a handler, against a handler that sends nothing and
against the same send made by `run()` with a checkpoint per message.

Run from the repository root:

    .venv/bin/python benchmarks/handler_sends.py                 # both stores
    .venv/bin/python benchmarks/handler_sends.py --quick         # 200 messages
    .venv/bin/python benchmarks/handler_sends.py --no-postgres   # SQLite only

One sender entity gets N signals (50 callers at a time); the figure is N over the wall
time from the first signal to the last message where it ends up:

- `handler, no send` (the floor): the handler counts; done when the sender applied all;
- `handler sends`: the handler sends one message to a target entity; done when the
  target applied all. The worker applying the sender's queued signals writes their
  sends with one snapshot once the queue is empty (or every 256 sends), then the host
  delivers them (up to 256 in one transaction, in order);
- `run() sends + checkpoint` (the way before sends from handlers): a mailbox signal,
  `run()` takes each payload, sends it on and checkpoints (one snapshot per message).

SQLite: a real file (WAL, `synchronous=FULL`); PostgreSQL: a throwaway server with
`fsync=on` (`benchmarks/_pg.py`). Prints a table; writes
benchmarks/results/handler_sends.json (`--quick`: handler_sends-quick.json).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

import corral

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _pg

CALLERS = 50


class Item(BaseModel):
    n: int


class Target(corral.Entity):
    """Counts what it was sent (and, sent to directly, is the floor: a handler that
    sends nothing)."""

    def __init__(self) -> None:
        self.got = 0

    @corral.signal
    def take(self, item: Item) -> None:
        self.got += 1

    @corral.query
    def count(self) -> int:
        return self.got


class Relay(corral.Entity):
    """A handler that sends each item on."""

    @corral.signal
    def item(self, item: Item) -> None:
        self.send(Target, "t-" + self.key, Target.take, item, start=None)


class Forwarder(corral.Entity):
    """`run()` sends each item on, with a checkpoint per message."""

    item = corral.signal(Item)

    async def run(self) -> None:
        async for item in self.mailbox:
            self.send(Target, "t-" + self.key, Target.take, item, start=None)
            await self.checkpoint()


async def _signal_all(ref: Any, handler: Any, n: int) -> None:
    gate = asyncio.Semaphore(CALLERS)

    async def one(i: int) -> None:
        async with gate:
            await ref.signal_with_start(handler, Item(n=i), start=None, message_id=f"m{i}")

    await asyncio.gather(*(one(i) for i in range(n)))


async def _until(read: Any, n: int) -> None:
    while True:
        try:
            if await read() >= n:
                return
        except corral.EntityNotRunningError:
            pass
        await asyncio.sleep(0.005)


async def measure(store: str, n: int) -> dict[str, dict[str, float]]:
    rows: dict[str, dict[str, float]] = {}
    cases: tuple[tuple[str, Any, Any], ...] = (
        ("handler, no send", Target, Target.take), ("handler sends", Relay, Relay.item),
        ("run() sends + checkpoint", Forwarder, Forwarder.item))
    async with corral.open_runtime(store, entities=[Relay, Forwarder, Target]) as rt:
        for i, (name, etype, handler) in enumerate(cases):
            ref = rt.ref(etype, f"s-{i}")
            counted = ref if etype is Target else rt.ref(Target, f"t-s-{i}")

            def done(counted: Any = counted) -> Any:
                return counted.query(Target.count)

            began = time.perf_counter()
            await _signal_all(ref, handler, n)
            await _until(done, n)
            wall = time.perf_counter() - began
            rows[name] = {"messages": n, "seconds": wall, "per_s": n / wall}
            print(f"  {name:<26}{n / wall:>10.0f} msgs/s", flush=True)
            await asyncio.sleep(0.5)  # let the last snapshots settle before the next case
    return rows


def table(results: dict[str, dict[str, dict[str, float]]]) -> str:
    lines = [f"{'store':<10}{'case':<28}{'msgs/s':>10}{'vs no send':>12}"]
    for store, rows in results.items():
        floor = rows["handler, no send"]["per_s"]
        for name, r in rows.items():
            lines.append(f"{store:<10}{name:<28}{r['per_s']:>10.0f}"
                         f"{r['per_s'] / max(floor, 1e-9):>11.2f}x")
    return "\n".join(lines)


async def amain(args: argparse.Namespace, server: Any) -> dict[str, Any]:
    n = 200 if args.quick else 1000
    results = await _pg.on_stores("sends", server, lambda store: measure(store, n))
    print()
    print(table(results))
    return {"benchmark": "handler_sends", "messages": n, "callers": CALLERS,
            "machine": _pg.machine(), "results": results, "table": table(results)}


def main() -> None:
    args = _pg.arguments(__doc__, quick="200 messages instead of 1,000").parse_args()
    _pg.run_and_write(lambda server: amain(args, server), args=args, name="handler_sends")


if __name__ == "__main__":
    main()
