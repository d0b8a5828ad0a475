"""What a copy of a store moves, table by table, read from the schema itself.

`migrate`, `backup` and `restore` (`_migrate`) copy a store into another of either
engine. What they copy is not a hand-written list: it is `_tables.TABLES`, each table's
columns and types parsed from its portable body, so a table added to the schema is
copied with no change here (tests/persistence/test_migrate.py fails on one that is not).

Per table, a `TablePlan`: its columns present on both engines (`columns`), its key (the
PostgreSQL primary key; SQLite's is the same columns, or a UNIQUE constraint on them),
by which a copy reads in bounded batches (a seek past the last key) and writes
idempotently (over the row of its key), and the portable type of each column, by which
a value is converted between engines (BOOL: SQLite's integer, PostgreSQL's boolean;
BLOB: bytes either way) and by which a row's digest is written in one canonical form
whatever engine it was read from (`row_digest`).

A few tables are not copied as they stand (`SKIPPED`, `RESET`): each says why.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from ._tables import TABLES, Engine, Table

__all__ = ["CROSS", "DIGEST_MODULUS", "ENGINE_ONLY", "META", "PINNED_META", "PLANS",
           "SKIPPED", "TablePlan", "is_data", "meta_copied", "row_digest", "to_engine"]

SKIPPED: dict[str, str] = {
    # Which processes host the store: claims of the source's hosts (none, while it is
    # migrated: the copy's own claim), meaningless on another store.
    "hosting": "live claims of the source's host processes, not data",
    # PostgreSQL's per-shard tail counters: derived from the copied journal's ticks.
    "shard_ticks": "derived from the journal (each shard's highest tick)",
    # A host's request for another host's shard: both hosts are of the source.
    "lease_handoffs": "requests between the source's live hosts",
}
"""Tables of the schema a copy does not copy, and why."""

RESET: dict[str, dict[str, Any]] = {
    # Epochs carry over (a host of the target takes each shard at the next one, so a
    # fencing token is never reused); the holders are the source's hosts: released.
    "leases": {"owner": "", "expires_at": 0.0},
}
"""Columns set to a fixed value on the copy (and so in the digest of either side)."""

PINNED_META = ("schema_version", "shards")
"""`meta` rows each store writes for itself when opened: never copied."""
_OWN_META = ("migrate.", "backup.")  # a copy's own markers (`_migrate`)

ENGINE_ONLY: dict[tuple[str, str], str] = {
    # The journal's tail order: SQLite's global `pos`, PostgreSQL's per-shard `tick`.
    # Copied within an engine; SQLite's pos becomes PostgreSQL's tick (per shard still
    # increasing), and PostgreSQL's ticks become new positions on SQLite.
    ("journal", "pos"): "the SQLite journal's tail position",
    ("journal", "tick"): "the PostgreSQL journal's per-shard tail tick",
}
"""Columns one engine has and the other lacks, and what they are."""

CROSS: dict[tuple[str, str], str] = {("journal", "pos"): "tick"}
"""A SQLite-only column copied into a PostgreSQL-only one (a position of the global
tail is a tick of its shard's: still increasing per shard). PostgreSQL's own columns
are not carried to SQLite, which numbers them itself."""

DIGEST_MODULUS = 2**256
_LINE_TAG = re.compile(r"^(sqlite|postgres): ")


@dataclass(frozen=True)
class TablePlan:
    """How one table is copied: `columns` (on both engines, in schema order), `types`
    (each column's portable word: TEXT, INT, BIGINT, REAL, BLOB, BOOL, SERIAL), `key`
    (the columns a batch seeks past), and per engine its own extra columns."""

    name: str
    columns: tuple[str, ...]
    types: dict[str, str]
    key: tuple[str, ...]
    only: dict[str, tuple[str, ...]]  # engine -> columns only it has
    serial: tuple[str, ...]  # columns each engine numbers itself (a high-water mark)


def _split(text: str) -> list[str]:
    """`text` split at its commas outside parentheses."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _items(table: Table, engine: Engine) -> list[str]:
    """The column definitions and constraints of `table` on `engine`."""
    kept = []
    for line in table.body.strip().splitlines():
        line = line.strip()
        tag = _LINE_TAG.match(line)
        if tag is None or tag[1] == engine:
            kept.append(line[tag.end():] if tag else line)
    return _split(" ".join(kept))


def _columns(items: list[str]) -> dict[str, str]:
    return {item.split()[0]: item.split()[1] for item in items
            if not item.startswith(("PRIMARY KEY", "UNIQUE"))}


def _key(items: list[str]) -> tuple[str, ...]:
    for item in items:
        if item.startswith("PRIMARY KEY"):
            return tuple(c.strip() for c in item[item.index("(") + 1:-1].split(","))
    for item in items:
        if "PRIMARY KEY" in item or " SERIAL" in item:
            return (item.split()[0],)
    raise AssertionError(f"no key in {items}")


def _plan(table: Table) -> TablePlan:
    by_engine = {e: _columns(_items(table, e)) for e in ("sqlite", "postgres")}
    portable = tuple(c for c in by_engine["postgres"] if c in by_engine["sqlite"])
    only = {e: tuple(c for c in cols if c not in portable) for e, cols in by_engine.items()}
    for engine, extra in only.items():
        for column in extra:
            assert (table.name, column) in ENGINE_ONLY, (
                f"{table.name}.{column} exists on {engine} only: say how a copy carries "
                "it (_copy_plan.ENGINE_ONLY, _copy_ends)")
    types = {**by_engine["sqlite"], **by_engine["postgres"]}
    return TablePlan(table.name, portable, types, _key(_items(table, "postgres")), only,
                     tuple(c for c, t in types.items() if t == "SERIAL"))


PLANS: tuple[TablePlan, ...] = tuple(
    _plan(t) for t in TABLES if t.name not in SKIPPED and t.engines == ("sqlite", "postgres"))
"""Every table a copy copies, in the schema's order."""
META = next(plan for plan in PLANS if plan.name == "meta")


def meta_copied(key: str) -> bool:
    """Whether the `meta` row `key` is copied (not pinned by the store, not a marker)."""
    return key not in PINNED_META and not key.startswith(_OWN_META)


def is_data(plan: TablePlan, columns: Sequence[str], row: Sequence[Any]) -> bool:
    """Whether `row` (of `columns`) is data a copy carries and a digest counts: not a
    `meta` row each store writes for itself, nor a lease never taken (epoch 0: a
    PostgreSQL store has one per shard from the start, a SQLite store none)."""
    if plan.name == "meta":
        return meta_copied(row[columns.index("k")])
    if plan.name == "leases":
        return bool(row[columns.index("epoch")])
    return True


def to_engine(plan: TablePlan, columns: Sequence[str], row: Sequence[Any],
              engine: Engine) -> tuple[Any, ...]:
    """`row` (values of `columns` as either engine's driver returned them) as `engine`'s
    driver takes them, with `RESET` applied."""
    reset = RESET.get(plan.name, {})
    values = []
    for column, value in zip(columns, row, strict=True):
        if column in reset:
            value = reset[column]
        elif value is not None:
            kind = plan.types[column]
            if kind == "BOOL":
                value = bool(value) if engine == "postgres" else int(bool(value))
            elif kind == "BLOB":
                value = bytes(value)
            elif kind == "REAL":
                value = float(value)
        values.append(value)
    return tuple(values)


def row_digest(plan: TablePlan, row: Sequence[Any]) -> int:
    """A row of `plan.columns` (from either engine, reset applied) as an integer below
    `DIGEST_MODULUS`, the same whatever engine it was read from; a table's digest is
    the sum of its rows' modulo `DIGEST_MODULUS`, so independent of their order."""
    values: list[Any] = []
    for value in to_engine(plan, plan.columns, row, "postgres"):
        if isinstance(value, bytes):
            value = {"b": value.hex()}
        elif isinstance(value, float):
            value = {"f": value.hex()}
        values.append(value)
    encoded = orjson.dumps(values)
    return int.from_bytes(hashlib.sha256(encoded).digest(), "big")
