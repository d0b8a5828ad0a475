"""The cost of a durable step against a plain function call and a `checkpoint()`.

Run from the repository root:

    .venv/bin/python benchmarks/steps.py                 # full run, both stores
    .venv/bin/python benchmarks/steps.py --quick         # smoke run: fewer operations
    .venv/bin/python benchmarks/steps.py --no-postgres   # SQLite only

Inside one entity's `run()`, timed there (`time.perf_counter` around each operation):

- `call`: `await fn(n)`, the plain async function a step would wrap (the floor);
- `step`: `await self.step(fn, n, name=...)`, one after the other: each records its
  result (a fenced write, one commit and fsync) before the next starts;
- `checkpoint`: `await self.checkpoint()`, one after the other: a snapshot of a small
  state (fenced, one commit and fsync);
- `step, 16 entities`: 16 entities stepping at once: their records share group commits,
  so the store's throughput, not one entity's latency, is the figure (ops/s in all).

`fn` returns a small pydantic model (~60 bytes of JSON). SQLite: a real file (WAL,
`synchronous=FULL`); PostgreSQL: a throwaway server with `fsync=on` and
`synchronous_commit=on` (`benchmarks/_pg.py`). Prints a table; writes
benchmarks/results/steps.json (`--quick`: steps-quick.json).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

import corral

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _pg

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "steps.json"
QUICK_RESULTS = HERE / "results" / "steps-quick.json"
FANOUT = 16


class Plan(BaseModel):
    kind: str
    n: int


class Answer(BaseModel):
    n: int
    text: str


async def model(n: int) -> Answer:
    return Answer(n=n, text=f"the answer to question {n}")


class Bench(corral.Entity):
    """Makes `n` operations of one kind in `run()`; returns each one's seconds."""

    kind: str
    n: int
    answers: int

    def __init__(self, init: Plan) -> None:
        self.kind = init.kind
        self.n = init.n
        self.answers = 0

    async def run(self) -> list[float]:
        took: list[float] = []
        for i in range(self.n):
            began = time.perf_counter()
            if self.kind == "call":
                await model(i)
            elif self.kind == "step":
                await self.step(model, i, name=f"model:{i}")
            else:
                self.answers += 1
                await self.checkpoint()
            took.append(time.perf_counter() - began)
        return took


async def measure(store: str, n: int) -> dict[str, dict[str, float]]:
    rows: dict[str, dict[str, float]] = {}
    async with corral.open_runtime(store, entities=[Bench]) as rt:
        for kind in ("call", "step", "checkpoint"):
            ref = rt.ref(Bench, f"{kind}-1")
            await ref.start(start=Plan(kind=kind, n=n))
            took = await ref.result(timeout=600)
            rows[kind] = _row(took, sum(took))
            print(f"  {kind:<22}{rows[kind]['p50_us']:>10.1f} us p50", flush=True)
        began = time.perf_counter()
        refs = [rt.ref(Bench, f"fan-{i}") for i in range(FANOUT)]
        for ref in refs:
            await ref.start(start=Plan(kind="step", n=n))
        took = [t for ref in refs for t in await ref.result(timeout=600)]
        rows[f"step, {FANOUT} entities"] = _row(took, time.perf_counter() - began)
        print(f"  step, {FANOUT} entities{rows[f'step, {FANOUT} entities']['ops_per_s']:>12.0f}"
              " ops/s", flush=True)
    return rows


def _row(took: list[float], wall: float) -> dict[str, float]:
    ordered = sorted(took)
    return {"ops": len(took), "p50_us": statistics.median(ordered) * 1e6,
            "p99_us": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e6,
            "ops_per_s": len(took) / wall if wall > 0 else 0.0}


def table(results: dict[str, dict[str, dict[str, float]]]) -> str:
    lines = [f"{'store':<10}{'operation':<22}{'p50 us':>10}{'p99 us':>10}{'ops/s':>10}"
             f"{'p50 vs call':>13}{'p50 vs checkpoint':>19}"]
    for store, rows in results.items():
        call, ckpt = rows["call"]["p50_us"], rows["checkpoint"]["p50_us"]
        for name, r in rows.items():
            lines.append(f"{store:<10}{name:<22}{r['p50_us']:>10.1f}{r['p99_us']:>10.1f}"
                         f"{r['ops_per_s']:>10.0f}{r['p50_us'] / max(call, 1e-9):>12.0f}x"
                         f"{r['p50_us'] / max(ckpt, 1e-9):>18.2f}x")
    return "\n".join(lines)


async def amain(args: argparse.Namespace, server: Any) -> dict[str, Any]:
    n = 50 if args.quick else 300
    results = await _pg.each_store(server, "steps", lambda store: measure(store, n))
    print()
    print(table(results))
    return {"benchmark": "steps", "ops_per_kind": n, "fanout": FANOUT,
            "machine": _pg.machine(), "results": results, "table": table(results)}


def main() -> None:
    _pg.main_cli(__doc__ or "", quick="50 operations instead of 300", out=RESULTS,
                 quick_out=QUICK_RESULTS, amain=amain)


if __name__ == "__main__":
    main()
