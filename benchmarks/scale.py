"""Scale benchmark (issue 42): work per operation at 10k / 100k / 1M, and its growth.

Run from the repository root:

    .venv/bin/python -m benchmarks.scale                     # 10k, 100k, 1M; both stores
    .venv/bin/python -m benchmarks.scale --quick             # 10k and 100k (CI smoke)
    .venv/bin/python -m benchmarks.scale --sizes 10000,50000 --no-postgres --only reads

It starts a throwaway PostgreSQL server (`_pg`, with `pg_stat_statements` preloaded so
parts can count buffers per statement), then for each store and each part makes a fresh
empty store and calls the part's `measure(engine, url, quick)`; each part returns
figures `{"item", "case", "size", "value", "unit"}`. The parts (one module each; a
missing one is skipped with a line saying so):

- `_scale_reads`: every operator read and the census (items "reads", "census");
- `_scale_takeover`: recovery after a takeover for K running entities;
- `_scale_idle`: idle statements/s and connections per host for N hosts;
- `_scale_hot`: a hot entity's PostgreSQL storage over 1M signals.

Prints one table (each figure at each size, and the growth ratio from the smallest to
the largest size of the same engine, item, case and unit; `!` marks a ratio above 1.5,
the issue's bound) and writes benchmarks/results/scale.json (`--quick`:
scale-quick.json, so a smoke run never overwrites a full one).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the parts import their siblings as top-level modules
    sys.path.insert(0, str(HERE))

import _bulk  # noqa: E402
import _pg  # noqa: E402
import asyncpg  # noqa: E402

__all__ = ["BOUND", "PARTS", "growth", "main", "render"]

# (module, the names `--only` selects it by)
PARTS = (("_scale_reads", ("reads", "census")), ("_scale_takeover", ("takeover",)),
         ("_scale_idle", ("idle",)), ("_scale_hot", ("hot",)))
BOUND = 1.5  # the growth bound from the smallest to the largest size
NOT_BOUNDED = {"build"}  # items that may grow (building a bigger store takes longer)
PG_SETTINGS = "-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.max=10000"

Figure = dict[str, Any]


def growth(figures: Sequence[Figure]) -> list[dict[str, Any]]:
    """One row per (engine, item, case, unit): the value at each size and the ratio of
    the largest size's to the smallest's (None without two sizes or from a zero),
    `over` when it exceeds `BOUND` on an item that must stay flat."""
    rows: dict[tuple[str, str, str, str], dict[int, float]] = {}
    for f in figures:
        key = (str(f.get("engine", "")), str(f["item"]), str(f["case"]), str(f["unit"]))
        rows.setdefault(key, {})[int(f["size"])] = float(f["value"])
    out = []
    for (engine, item, case, unit), by_size in rows.items():
        small, large = min(by_size), max(by_size)
        ratio = None if small == large or by_size[small] == 0 else \
            by_size[large] / by_size[small]
        if ratio is None and small != large and by_size[large] > 0:
            ratio = float("inf")
        out.append({"engine": engine, "item": item, "case": case, "unit": unit,
                    "values": {str(s): by_size[s] for s in sorted(by_size)},
                    "ratio": ratio,
                    "over": ratio is not None and ratio > BOUND and item not in NOT_BOUNDED})
    return out


def _number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 or value == int(value) else f"{value:,.2f}"


def render(rows: Sequence[dict[str, Any]]) -> str:
    """The growth rows as one Markdown table (sizes as columns)."""
    sizes = sorted({int(s) for r in rows for s in r["values"]})
    head = ["engine", "item", "case", "unit", *(f"{s:,}" for s in sizes), "growth"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["engine"], r["item"], r["case"], r["unit"]]
        cells += [_number(r["values"][str(s)]) if str(s) in r["values"] else "-" for s in sizes]
        ratio = r["ratio"]
        cells.append("-" if ratio is None else
                     f"x{ratio:.2f}{' !' if r['over'] else ''}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


async def _run_part(module: Any, name: str, engine: str, server: _pg.Server | None,
                    quick: bool, tmp: Path) -> list[Figure]:
    if engine == "sqlite":
        return list(await module.measure("sqlite", str(tmp / f"{name}.db"), quick))
    assert server is not None
    async with server.database(f"scale{name}") as url:
        return list(await module.measure("postgres", url, quick))


def _selected(only: set[str] | None) -> list[tuple[str, Any]]:
    parts = []
    for module_name, names in PARTS:
        if only is not None and not only & set(names):
            continue
        try:
            parts.append((module_name, importlib.import_module(module_name)))
        except ModuleNotFoundError as err:
            if err.name != module_name:
                raise
            print(f"{module_name}: not on this branch, skipped", flush=True)
    return parts


async def measure_all(server: _pg.Server | None, *, quick: bool, only: set[str] | None
                      ) -> list[Figure]:
    """Every selected part on every store, each on a fresh empty store; the figures,
    each with its `engine`."""
    figures: list[Figure] = []
    engines = ["sqlite"] + (["postgres"] if server is not None else [])
    with tempfile.TemporaryDirectory(prefix="corral-scale-") as tmp:
        for module_name, module in _selected(only):
            for engine in engines:
                print(f"{module_name} on {engine}:", flush=True)
                got = await _run_part(module, module_name, engine, server, quick, Path(tmp))
                figures += [{**f, "engine": engine} for f in got
                            if only is None or f["item"] not in ("reads", "census")
                            or f["item"] in only]
    return figures


async def _settings(server: _pg.Server) -> dict[str, str]:
    """The server's shown settings, with `shared_preload_libraries`: one server serves
    every part, and the reads, idle and hot parts count buffers and statements through
    `pg_stat_statements`, which only a preloaded library collects."""
    settings = await server.settings()
    conn = await asyncpg.connect(server.url())
    try:
        settings["shared_preload_libraries"] = await conn.fetchval(
            "SHOW shared_preload_libraries")
    finally:
        await conn.close()
    if "pg_stat_statements" not in settings["shared_preload_libraries"]:
        raise SystemExit(f"PostgreSQL started without pg_stat_statements ({PG_SETTINGS})")
    return settings


def main(argv: Sequence[str] | None = None) -> None:
    parser = _pg.arguments(__doc__, "10k and 100k entities only (development, CI smoke)")
    parser.add_argument("--sizes", help="comma-separated store sizes (entities), e.g. "
                        "10000,100000,1000000")
    parser.add_argument("--only", help="comma-separated parts: reads, census, takeover, "
                        "idle, hot")
    args = parser.parse_args(argv)
    if args.sizes:
        os.environ[_bulk.SIZES_ENV] = args.sizes
    only = None if not args.only else {p.strip() for p in args.only.split(",")}
    began = time.time()
    try:
        server_cm = contextlib.nullcontext(None) if args.no_postgres else \
            _pg.throwaway_server(settings=PG_SETTINGS)
        with server_cm as server:
            settings = _pg.run(_settings(server)) if server is not None else None
            figures = _pg.run(measure_all(server, quick=args.quick, only=only))
    except _pg.ServerUnavailable as err:
        raise SystemExit(f"{err}; or pass --no-postgres") from None
    rows = growth(figures)
    table = render(rows)
    print(table)
    over = [r for r in rows if r["over"]]
    print(f"{len(over)} of {len(rows)} figures grow more than x{BOUND} "
          f"(marked !)" if rows else "no figures")
    out = Path(args.out) if args.out else \
        HERE / "results" / ("scale-quick.json" if args.quick else "scale.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(_dump({"date": time.strftime("%F"), "seconds": round(time.time() - began),
                          "machine": _pg.machine(postgres=settings), "figures": figures,
                          "growth": rows, "table": table}))
    print(f"wrote {out}")


def _dump(data: dict[str, Any]) -> str:
    import json

    return json.dumps(data, indent=1, default=str)


if __name__ == "__main__":
    main()
