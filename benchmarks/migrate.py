"""Migrate benchmark (issue 45): moving a store of N entities SQLite -> PostgreSQL, and back.

Run from the repository root:

    .venv/bin/python -m benchmarks.migrate                      # 100,000 entities
    .venv/bin/python -m benchmarks.migrate --entities 1000000   # the issue's million
    .venv/bin/python -m benchmarks.migrate --quick              # 10,000 (CI smoke)

It builds a SQLite store of `--entities` entities with `_bulk.build` (the rows a real
runtime leaves: closed and passivated runs, journals, dedupe windows, snapshots, dead
letters, open waits, suspended runs; 1,000 running), then times, on a throwaway
PostgreSQL server:

- `migrate` SQLite -> a new PostgreSQL database (`corral.persistence.migrate`, batches
  of `--batch` rows), in rows/s;
- `verify` of the two (every row read and digested on both engines);
- `migrate` PostgreSQL -> a new SQLite file (back);
- `backup` of the SQLite store into a file;
- the ceiling: `_bulk.build` of the same entities straight into a new PostgreSQL
  database (COPY in one transaction, no reads, no upserts): the ratio says what the
  copy's batches, upserts and resumability cost against a bulk load.

Prints a table and writes benchmarks/results/migrate.json (`--quick`: migrate-quick.json).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import _bulk  # noqa: E402
import _pg  # noqa: E402

from corral.persistence import backup, migrate, verify  # noqa: E402

__all__ = ["main"]


async def _timed(what: str, work: Any) -> tuple[Any, float]:
    began = time.perf_counter()
    result = await work
    seconds = time.perf_counter() - began
    print(f"  {what}: {seconds:.1f} s", flush=True)
    return result, seconds


async def measure(server: _pg.Server | None, *, entities: int, batch: int) -> dict[str, Any]:
    assert server is not None, "the migrate benchmark needs PostgreSQL"
    figures: dict[str, Any] = {"entities": entities, "batch": batch}
    with tempfile.TemporaryDirectory(prefix="corral-migrate-") as tmp:
        lite = str(Path(tmp) / "source.db")
        built, _ = await _timed("build SQLite", _bulk.build(
            lite, entities=entities, running=min(1000, entities),
            report=_bulk.progress_printer("sqlite")))
        figures["rows"] = built["rows"]
        async with server.database("migrate_target") as url:
            copied, seconds = await _timed("migrate SQLite -> PostgreSQL",
                                           migrate(lite, url, batch=batch))
            figures["to_postgres"] = {"rows": copied.total, "seconds": seconds,
                                      "rows_per_s": copied.total / seconds}
            checked, seconds = await _timed("verify", verify(lite, url))
            assert checked.equal, [t for t in checked.tables if not t.equal]
            figures["verify"] = {"seconds": seconds, "rows_per_s": 2 * copied.total / seconds}
            back = str(Path(tmp) / "back.db")
            copied, seconds = await _timed("migrate PostgreSQL -> SQLite",
                                           migrate(url, back, batch=batch))
            figures["to_sqlite"] = {"rows": copied.total, "seconds": seconds,
                                    "rows_per_s": copied.total / seconds}
        copied, seconds = await _timed("backup SQLite", backup(
            lite, Path(tmp) / "backup.corral", batch=batch))
        figures["backup"] = {"rows": copied.total, "seconds": seconds,
                             "rows_per_s": copied.total / seconds}
        async with server.database("migrate_ceiling") as url:
            loaded, seconds = await _timed("ceiling: bulk COPY into PostgreSQL", _bulk.build(
                url, entities=entities, running=min(1000, entities)))
            figures["ceiling_copy"] = {"rows": loaded["rows"], "seconds": seconds,
                                       "rows_per_s": loaded["rows"] / seconds}
    figures["to_postgres"]["x_ceiling"] = (figures["to_postgres"]["rows_per_s"]
                                           / figures["ceiling_copy"]["rows_per_s"])
    return figures


def render(figures: dict[str, Any]) -> str:
    lines = [f"{figures['entities']:,} entities, {figures['rows']:,} rows, batch "
             f"{figures['batch']:,}", "| step | seconds | rows/s |", "|---|---|---|"]
    for step in ("to_postgres", "verify", "to_sqlite", "backup", "ceiling_copy"):
        f = figures[step]
        lines.append(f"| {step} | {f['seconds']:.1f} | {f['rows_per_s']:,.0f} |")
    lines.append(f"SQLite -> PostgreSQL at x{figures['to_postgres']['x_ceiling']:.2f} of "
                 "the bulk COPY ceiling")
    return "\n".join(lines)


def main() -> None:
    parser = _pg.arguments(__doc__, "10,000 entities (a smoke run)")
    parser.add_argument("--entities", type=int, default=100_000,
                        help="entities in the store (default 100,000; the issue's: 1,000,000)")
    parser.add_argument("--batch", type=int, default=5000, help="rows per batch")
    args = parser.parse_args()
    entities = 10_000 if args.quick else args.entities

    async def run(server: _pg.Server | None) -> dict[str, Any]:
        figures = await measure(server, entities=entities, batch=args.batch)
        print(render(figures))
        return {"machine": _pg.machine(), "figures": figures}

    _pg.run_and_write(run, args=args, name="migrate")


if __name__ == "__main__":
    main()
