"""What traces cost: signal throughput with tracing off, today's code, and tracing on.

Run from the repository root:

    .venv/bin/python benchmarks/tracing.py            # full run
    .venv/bin/python benchmarks/tracing.py --quick    # smoke run: fewer signals, rounds

Three ways, side by side in one run, each in a fresh process per round, the rounds
interleaved (today, off, on, today, off, on, ...) so that a noisy neighbour on the
machine costs each the same:

- `today`: corral before traces (the parent of the commit that added `_tracing.py`,
  extracted with `git archive`): no tracing code at all;
- `off`: this corral, OpenTelemetry not configured (no tracer provider; the process
  never imports it): every traced path makes its one check;
- `on`: this corral under the OpenTelemetry SDK (`TracerProvider`, every span sampled,
  a `SimpleSpanProcessor` into an exporter that drops what it gets): an accept span per
  signal and an apply span per message applied, each traceparent stored;
- `sampled`: the same SDK sampling one trace in 100 (`ParentBased(TraceIdRatioBased)`),
  as a busy service would: the other spans record nothing, their contexts are stored;
- `floor`: today's corral (no tracing code) under the same SDK as `on`, with the two
  spans a signal that tracing needs at the least made by this benchmark itself: each
  sender starts and ends a bare span around each `signal`, the handler a bare one each
  time it runs (no attributes, no parent, never current, no traceparent stored). What
  the SDK alone costs: no tracing that makes an SDK span per acceptance and one per
  application can be cheaper than this.

Each process: a SQLite store (WAL, `synchronous=FULL`) in a temporary directory, a local
runtime hosting `ENTITIES` running entities, `SENDERS` concurrent callers sending
`signal`s to them round robin; the figure is signals accepted and applied per second,
from the first send until every entity applied every signal, and the process's CPU time
over the same span per signal (both threads: the event loop's and the SQLite store's),
which the machine's load moves far less than the rate. Prints the medians, the ratios to
`today` and the CPU each mode adds to `today`'s as a table; writes
benchmarks/results/tracing.json (`--quick`: tracing-quick.json).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import corral

ROOT = Path(__file__).resolve().parent.parent
SAMPLED = 0.01  # `sampled`: one trace in 100 recorded
ENTITIES = 16
SENDERS = 32
MODES = ("today", "off", "on", "sampled", "floor")
_floor: Any = None  # `floor`: the tracer the benchmark's own spans come from


# -- one process: one mode, one round --------------------------------------------------------


class Counter(corral.Entity):
    count: int

    def __init__(self) -> None:
        self.count = 0

    @corral.signal
    def bump(self) -> None:
        self.count += 1
        if _floor is not None:
            _floor.start_span("bump").end()


def _trace(ratio: float) -> None:
    """The SDK, `ratio` of the traces sampled (the rest: spans that record nothing),
    every sampled span processed and exported to nowhere."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    class Dropped(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)))
    provider.add_span_processor(SimpleSpanProcessor(Dropped()))
    trace.set_tracer_provider(provider)


async def _child(mode: str, signals: int, db: str) -> tuple[float, float]:
    """(signals a second, CPU microseconds a signal) of one process in `mode`."""
    global _floor
    if mode in ("on", "sampled", "floor"):
        _trace(SAMPLED if mode == "sampled" else 1.0)
    if mode == "floor":
        from opentelemetry import trace

        _floor = trace.get_tracer("floor")
    counter = Counter
    async with corral.open_runtime(db, entities=[counter]) as rt:
        refs = [rt.ref(counter, f"e-{n}") for n in range(ENTITIES)]
        for ref in refs:
            await ref.start(start=None)
        per_sender = signals // SENDERS

        async def sender(s: int) -> None:
            for n in range(per_sender):
                if _floor is None:
                    await refs[(s + n) % ENTITIES].signal(counter.bump)
                else:
                    span = _floor.start_span("signal")
                    await refs[(s + n) % ENTITIES].signal(counter.bump)
                    span.end()

        began, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(sender(s) for s in range(SENDERS)))
        for ref in refs:
            while True:
                info = await ref.describe()
                if info.applied_seq >= info.accepted_seq:
                    break
                await asyncio.sleep(0.002)
        done = per_sender * SENDERS
        return (done / (time.perf_counter() - began),
                (time.process_time() - cpu) / done * 1e6)


# -- the run: rounds of every mode -------------------------------------------------------------


def _today(into: Path) -> tuple[str, Path]:
    """The source of corral before traces (the parent of the commit that added
    `src/corral/_tracing.py`: on main, the merge base with main is HEAD itself),
    extracted under `into`."""
    added = subprocess.run(["git", "log", "--diff-filter=A", "--format=%H", "--",
                            "src/corral/_tracing.py"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split()[-1]
    base = subprocess.run(["git", "rev-parse", f"{added}^"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout.strip()
    archive = into / "today.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "archive", base, "src"], cwd=ROOT, check=True, stdout=out)
    with tarfile.open(archive) as tar:
        tar.extractall(into / "today", filter="data")
    return base, into / "today" / "src"


def _round(mode: str, signals: int, src: Path, tmp: Path) -> tuple[float, float]:
    db = tmp / f"{mode}-{time.monotonic_ns()}.db"
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run([sys.executable, __file__, "--child", mode, str(signals), str(db)],
                         env=env, check=True, capture_output=True, text=True).stdout
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    rate, cpu = out.strip().splitlines()[-1].split()
    return float(rate), float(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", nargs=3, metavar=("MODE", "SIGNALS", "DB"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, signals, db = args.child
        print(*asyncio.run(_child(mode, int(signals), db)))
        return
    signals, rounds = (3_200, 4) if args.quick else (16_000, 12)
    rates: dict[str, list[float]] = {m: [] for m in MODES}
    cpus: dict[str, list[float]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory(prefix="corral-tracing-") as tmp:
        base, today = _today(Path(tmp))
        sources = {"today": today, "off": ROOT / "src", "on": ROOT / "src",
                   "sampled": ROOT / "src", "floor": today}
        for r in range(rounds):
            n = r % len(MODES)
            order = MODES[n:] + MODES[:n]  # each mode first as often as the others
            for mode in order:
                rate, cpu = _round(mode, signals, sources[mode], Path(tmp))
                rates[mode].append(rate)
                cpus[mode].append(cpu)
            print(f"round {r + 1}/{rounds}: " + ", ".join(
                f"{m} {rates[m][-1]:,.0f}/s {cpus[m][-1]:.0f} us" for m in MODES), flush=True)
    medians = {m: statistics.median(rates[m]) for m in MODES}
    # Each round's ratio to that round's `today` (run beside it): the machine's load
    # moves the rates between rounds by far more than tracing does.
    ratios = {m: statistics.median(x / t for x, t in zip(rates[m], rates["today"],
                                                          strict=True)) for m in MODES}
    cpu = {m: statistics.median(cpus[m]) for m in MODES}
    print(f"\n{'mode':<8}{'signals/s (median)':>20}{'vs today (median of rounds)':>30}"
          f"{'CPU us/signal (median)':>25}{'over today':>12}")
    for m in MODES:
        print(f"{m:<8}{medians[m]:>20,.0f}{ratios[m]:>30.3f}{cpu[m]:>25.1f}"
              f"{cpu[m] - cpu['today']:>+12.1f}")
    result = {
        "today": base, "signals": signals, "rounds": rounds, "entities": ENTITIES,
        "senders": SENDERS, "rates": rates, "median": medians,
        "cpu_us_per_signal": cpus, "cpu_median": cpu,
        "ratio_off": ratios["off"], "ratio_on": ratios["on"],
        "ratio_sampled": ratios["sampled"], "ratio_floor": ratios["floor"],
        "sampled_ratio": SAMPLED,
        "targets": {"off": "within 3% of today", "on": "within 15% of today"},
    }
    name = "tracing-quick.json" if args.quick else "tracing.json"
    out = ROOT / "benchmarks" / "results" / name
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
