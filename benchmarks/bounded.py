"""Bounded storage and reactivation time as one entity's history grows.

Run from the repository root:

    .venv/bin/python benchmarks/bounded.py           # full run: ~1,000,000 signals per side
    .venv/bin/python benchmarks/bounded.py --quick   # smoke run: ~50,000 per side, < 60 s
    .venv/bin/python benchmarks/bounded.py --plot-only   # redraw the PNG from the JSON

Two entity types receive the same stream of signals (one entity each, 100 closed-loop
concurrent senders, `signal_with_start`, ~180-byte payloads) on a real SQLite file:

- `with`: `SnapshotPolicy(every=1000, keep=2)` and a `run()` that continues as new when
  `continue_as_new_suggested` (`ContinueAsNewPolicy(max_signals=120_000)`: not a divisor
  of the checkpoints, so they do not all fall just after a switch); the default
  `DedupeWindow` (the last 100,000 message ids, pruned at each snapshot);
- `without`: `SnapshotPolicy(every=None)` and no `run()`: the journal keeps everything,
  and with no snapshot the dedupe window is never pruned either.

While sending, the store's size (database file + WAL) is sampled every 10,000 signals
(5,000 with `--quick`). At checkpoints (10k, 30k, 100k, 300k and 1M signals, each plus
500: halfway between two snapshots of the `with` side) the entity is brought
up to date, the rows and bytes of each table are counted (SQLite's `dbstat`), and the
runtime is closed and reopened: `reopen` is `open_runtime` (store, leases, recovery
scheduled), `first query` the time from there until the first `query` answers (the
activation restored the latest snapshot and replayed the journal after it), `replayed`
the number of handler calls that took. The OS page cache is warm (same process, file just
written); SQLite's own cache is cold (new connections).

Prints a table; writes benchmarks/results/bounded.json and a plot of store size against
signals received (benchmarks/results/bounded.png; needs matplotlib: `pip install -e
'.[bench]'`). `--quick` writes `bounded-quick.*` instead, so it never replaces a full run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import sqlite3
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel

import corral

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
SENDERS = 100
TAIL = 500  # signals after the latest snapshot at each checkpoint (half of `every`)
TEXT = "The customer replied: the replacement part arrived, but the fan still rattles. " * 2


class Carry(BaseModel):
    """Start input; continue-as-new carries the running totals in it."""

    count: int = 0
    total: int = 0


class Ping(BaseModel):
    n: int
    text: str


class _Counter(corral.Entity):
    """Counts and sums its signals; the two sides differ only in their policies."""

    handler_calls: ClassVar[int] = 0

    def __init__(self, init: Carry) -> None:
        self.count = init.count
        self.total = init.total

    @corral.signal
    def ping(self, p: Ping) -> None:
        type(self).handler_calls += 1
        self.count += 1
        self.total += p.n

    @corral.query
    def counted(self) -> int:
        return self.count


class WithSnapshots(_Counter):
    """Snapshots every 1,000 signals (keeps 2) and continues as new every 120,000."""

    snapshots = corral.SnapshotPolicy(every=1000, keep=2)
    continue_as_new_policy = corral.ContinueAsNewPolicy(
        max_signals=120_000, max_journal_entries=None, max_journal_bytes=None)
    handler_calls: ClassVar[int] = 0

    async def run(self) -> None:
        await self.wait_for(lambda: self.continue_as_new_suggested)
        self.continue_as_new(Carry(count=self.count, total=self.total))


class WithoutSnapshots(_Counter):
    """Never snapshots and never continues as new: recovery replays the whole journal."""

    snapshots = corral.SnapshotPolicy(every=None)
    handler_calls: ClassVar[int] = 0


Bench = type[WithSnapshots] | type[WithoutSnapshots]
SIDES: dict[str, Bench] = {"with": WithSnapshots, "without": WithoutSnapshots}


# -- measuring the store ------------------------------------------------------------------


def file_sizes(path: Path) -> tuple[int, int]:
    """Bytes of the database file and of its WAL."""
    wal = Path(f"{path}-wal")
    return path.stat().st_size, wal.stat().st_size if wal.exists() else 0


def store_census(path: Path) -> dict[str, Any]:
    """Rows of the growing tables and bytes of every table and index (dbstat)."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("BEGIN")
        rows = {t: db.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in ("journal", "dedupe", "snapshots", "runs")}
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        page_size = db.execute("PRAGMA page_size").fetchone()[0]
        free = db.execute("PRAGMA freelist_count").fetchone()[0]
        by_name = dict(db.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name"))
        db.execute("COMMIT")
    journal = by_name.get("journal", 0) + by_name.get("sqlite_autoindex_journal_1", 0)
    dedupe = by_name.get("dedupe", 0)
    snapshots = by_name.get("snapshots", 0)
    return {
        "rows": rows, "logical_bytes": pages * page_size, "free_bytes": free * page_size,
        "journal_bytes": journal, "dedupe_bytes": dedupe, "snapshot_bytes": snapshots,
        "other_bytes": pages * page_size - free * page_size - journal - dedupe - snapshots,
    }


# -- driving the entity -------------------------------------------------------------------


async def pump(ref: corral.EntityRef[Any], cls: Bench, first: int, n: int) -> None:
    """Send signals first..first+n-1 from SENDERS closed-loop senders."""
    async def sender(s: int) -> None:
        for i in range(first + s, first + n, SENDERS):
            await ref.signal_with_start(cls.ping, Ping(n=i, text=TEXT), start=Carry())

    await asyncio.gather(*(sender(s) for s in range(SENDERS)))


async def caught_up(ref: corral.EntityRef[Any], timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        info = await ref.describe()
        if info.applied_seq is not None and info.applied_seq == info.accepted_seq:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{ref!r} did not catch up: {info}")
        await asyncio.sleep(0.01)


class Host:
    """One `open_runtime` at a time on the side's store file; reopened at checkpoints."""

    def __init__(self, path: Path, cls: Bench) -> None:
        self.path, self.cls = path, cls
        self._stack: contextlib.AsyncExitStack | None = None
        self.rt: corral.Runtime | None = None

    async def open(self) -> None:
        self._stack = contextlib.AsyncExitStack()
        self.rt = await self._stack.enter_async_context(
            corral.open_runtime(str(self.path), entities=[self.cls]))

    async def close(self) -> None:
        if self._stack is not None:
            await self._stack.aclose()
        self._stack = self.rt = None

    @property
    def ref(self) -> corral.EntityRef[Any]:
        assert self.rt is not None
        return self.rt.ref(self.cls, "history-1")


@contextlib.asynccontextmanager
async def hosted(path: Path, cls: Bench) -> AsyncIterator[Host]:
    host = Host(path, cls)
    await host.open()
    try:
        yield host
    finally:
        await host.close()


async def reactivate(host: Host, expect: int) -> dict[str, Any]:
    """Close and reopen the runtime; time the reopen and the first query."""
    await host.close()
    host.cls.handler_calls = 0
    t0 = time.perf_counter()
    await host.open()
    t1 = time.perf_counter()
    counted = await host.ref.query(host.cls.counted)
    t2 = time.perf_counter()
    if counted != expect:
        raise AssertionError(f"{host.cls.__name__}: counted {counted}, expected {expect}")
    return {"reopen_s": t1 - t0, "first_query_s": t2 - t1, "reactivation_s": t2 - t0,
            "replayed": host.cls.handler_calls, "rss_mb": rss_mb()}


def rss_mb() -> float | None:
    try:
        import psutil  # the `bench` extra
    except ImportError:
        return None
    return float(psutil.Process().memory_info().rss / 2**20)


async def run_side(side: str, path: Path, total: int, sample_every: int,
                   checkpoints: list[int]) -> dict[str, Any]:
    cls = SIDES[side]
    series: list[dict[str, Any]] = []
    marks: list[dict[str, Any]] = []
    sent = 0
    started = time.perf_counter()
    async with hosted(path, cls) as host:
        for target in sorted({*range(sample_every, total + 1, sample_every), *checkpoints}):
            t0 = time.perf_counter()
            await pump(host.ref, cls, sent, target - sent)
            rate = (target - sent) / (time.perf_counter() - t0)
            sent = target
            db, wal = file_sizes(path)
            series.append({"signals": sent, "db_bytes": db, "wal_bytes": wal,
                           "signals_per_s": rate})
            if sent not in checkpoints:
                continue
            await caught_up(host.ref)
            census = store_census(path)
            info = await host.ref.describe()
            react = await reactivate(host, sent)
            db, wal = file_sizes(path)
            marks.append({"signals": sent, "db_bytes": db, "wal_bytes": wal,
                          "run_id": info.run_id, **census, **react})
            print(f"  {side:7} {sent:>9,}  store {(db + wal) / 2**20:7.1f} MiB  "
                  f"journal {census['rows']['journal']:>9,} rows  reactivation "
                  f"{react['reactivation_s'] * 1000:8.1f} ms ({react['replayed']:,} replayed)",
                  flush=True)
    return {"side": side, "entity": cls.__name__, "series": series, "checkpoints": marks,
            "seconds": time.perf_counter() - started}


# -- output -------------------------------------------------------------------------------


def mib(n: float) -> str:
    return f"{n / 2**20:.1f}"


def print_table(sides: list[dict[str, Any]]) -> None:
    head = ("side", "signals", "store MiB", "db MiB", "WAL MiB", "journal rows", "journal MiB",
            "dedupe rows", "dedupe MiB", "snapshots", "runs", "reopen ms", "1st query ms",
            "replayed", "ingest/s")
    rows = []
    for s in sides:
        rates = {p["signals"]: p["signals_per_s"] for p in s["series"]}
        for c in s["checkpoints"]:
            rows.append((
                s["side"], f"{c['signals']:,}", mib(c["db_bytes"] + c["wal_bytes"]),
                mib(c["db_bytes"]), mib(c["wal_bytes"]), f"{c['rows']['journal']:,}",
                mib(c["journal_bytes"]), f"{c['rows']['dedupe']:,}", mib(c["dedupe_bytes"]),
                str(c["rows"]["snapshots"]), str(c["rows"]["runs"]),
                f"{c['reopen_s'] * 1000:.0f}", f"{c['first_query_s'] * 1000:.0f}",
                f"{c['replayed']:,}", f"{rates.get(c['signals'], 0):,.0f}",
            ))
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    print()
    print("  ".join(h.rjust(w) for h, w in zip(head, widths, strict=True)))
    for r in rows:
        print("  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)))


def plot(sides: list[dict[str, Any]], out: Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("\nmatplotlib is not installed: no plot. Install the benchmark extras with\n"
              "    .venv/bin/pip install -e '.[bench]'")
        return False
    fig, (size_ax, time_ax) = plt.subplots(1, 2, figsize=(12, 4.8))
    colors = {"with": "tab:blue", "without": "tab:orange"}
    for s in sides:
        color, label = colors.get(s["side"]), f"{s['side']} snapshots/CAN"
        xs = [p["signals"] for p in s["series"]]
        size_ax.plot(xs, [(p["db_bytes"] + p["wal_bytes"]) / 2**20 for p in s["series"]],
                     color=color, label=f"{label}: db + WAL files")
        marks = s["checkpoints"]
        at = [c["signals"] for c in marks]
        size_ax.plot(at, [c["journal_bytes"] / 2**20 for c in marks], "o--", color=color,
                     label=f"{label}: journal table")
        size_ax.plot(at, [c["dedupe_bytes"] / 2**20 for c in marks], "s:", color=color,
                     label=f"{label}: dedupe table")
        time_ax.plot(at, [c["reactivation_s"] for c in marks], "o-", color=color, label=label)
    size_ax.set(xlabel="signals received", ylabel="MiB", xscale="log", yscale="log",
                title="store size (log-log: flat = bounded)")
    size_ax.legend(fontsize=7)
    size_ax.grid(alpha=0.3, which="both")
    time_ax.set(xlabel="signals received", ylabel="seconds", xscale="log", yscale="log",
                title="reactivation: reopen + first query")
    time_ax.legend(fontsize=8)
    time_ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return True


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(), "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version, "platform": platform.platform(),
        "load_avg": os.getloadavg(),
    }


async def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="50,500 signals per side (< 60 s)")
    parser.add_argument("--out", type=Path, help="JSON path (the PNG goes next to it)")
    parser.add_argument("--plot-only", action="store_true",
                        help="redraw the PNG from an existing JSON (--out or the default)")
    args = parser.parse_args(argv)
    if args.plot_only:
        path = args.out or RESULTS / ("bounded-quick.json" if args.quick else "bounded.json")
        if plot(json.loads(path.read_text())["sides"], path.with_suffix(".png")):
            print(f"wrote {path.with_suffix('.png')}")
        return
    # Checkpoints sit halfway between two snapshots of the `with` side (every 1,000), so
    # its reactivation replays the average tail of 500 signals, not a lucky 0.
    if args.quick:
        sample_every, rounds = 5_000, [5_000, 10_000, 25_000, 50_000]
    else:
        sample_every, rounds = 10_000, [10_000, 30_000, 100_000, 300_000, 1_000_000]
    checkpoints = [n + TAIL for n in rounds]
    total = checkpoints[-1]
    out = args.out or RESULTS / ("bounded-quick.json" if args.quick else "bounded.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    start = machine()
    print(f"{total:,} signals into one entity per side, {SENDERS} senders; "
          f"{start['cpus']} CPUs, load {start['load_avg'][0]:.2f}, SQLite {start['sqlite']}")
    sides = []
    with tempfile.TemporaryDirectory(prefix="corral-bounded-") as tmp:
        for side in SIDES:
            sides.append(await run_side(side, Path(tmp) / f"{side}.db", total, sample_every,
                                        checkpoints))
    print_table(sides)
    summary = summarise(sides)
    for line in summary["lines"]:
        print(line)
    result = {"benchmark": "bounded", "quick": args.quick, "signals": total,
              "senders": SENDERS, "payload_bytes": len(Ping(n=0, text=TEXT).model_dump_json()),
              "machine": {"start": start, "end_load_avg": os.getloadavg()},
              "summary": {k: v for k, v in summary.items() if k != "lines"}, "sides": sides}
    out.write_text(json.dumps(result, indent=1))
    png = out.with_suffix(".png")
    if plot(sides, png):
        print(f"\nwrote {out} and {png}")
    else:
        print(f"\nwrote {out}")


def summarise(sides: list[dict[str, Any]]) -> dict[str, Any]:
    """Growth from the middle checkpoint to the last, per side (1.0 = flat)."""
    out: dict[str, Any] = {"lines": []}
    for s in sides:
        marks = s["checkpoints"]
        mid, last = marks[len(marks) // 2], marks[-1]
        store = (last["db_bytes"] + last["wal_bytes"]) / (mid["db_bytes"] + mid["wal_bytes"])
        journal = last["journal_bytes"] / mid["journal_bytes"]
        dedupe = last["dedupe_bytes"] / mid["dedupe_bytes"]
        react = last["reactivation_s"] / mid["reactivation_s"]
        out[s["side"]] = {"from": mid["signals"], "to": last["signals"], "store_growth": store,
                          "journal_growth": journal, "dedupe_growth": dedupe,
                          "reactivation_growth": react}
        out["lines"].append(
            f"{s['side']:7}: {mid['signals']:,} -> {last['signals']:,} signals "
            f"({last['signals'] / mid['signals']:.0f}x): store x{store:.2f} (journal "
            f"x{journal:.2f}, dedupe x{dedupe:.2f}), reactivation x{react:.2f}")
    return out


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
