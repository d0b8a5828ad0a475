"""The SQLite schema's versions, and how a store records its version.

The tables are `_tables.TABLES`. Key choices (see SQLITE_NOTES.md): the journal is a
rowid table whose `pos` grows in commit order, so a host can tail it cheaply for
entries other processes accepted; dedupe and run lookups are narrow WITHOUT ROWID
tables keyed by (etype, key, ...).

Versions: schema 1 was the first one released; each later version is one entry of
`MIGRATIONS`, the statements that upgrade a store from the version before it. A store
records its version in `meta`; opening creates a new store at `SCHEMA_VERSION`, applies
an older store's missing migrations in one transaction, and refuses a store written by
a newer corral (see `SqliteStore`).
"""

from __future__ import annotations

from corral._errors import ShardCountError, StoreError

from ._census import RECOUNT
from ._tables import create, table_sql

_DEAD_LETTER_FIELDS = ("id, etype, key, run_id, seq, message_id, name, payload, sender, "
                       "error, traceback, attempts, failed_at")
_OUTBOX_FIELDS = ("etype, key, run_id, seq, shard, target_type, target_key, name, payload, "
                  "start, id_reuse, delivered, error, created_at")
# The outbox as migrations 10 and 13 made it (18 adds `trace`).
_OUTBOX_V13 = (
    "CREATE TABLE IF NOT EXISTS {} (etype TEXT NOT NULL, key TEXT NOT NULL, run_id INTEGER "
    "NOT NULL, seq INTEGER NOT NULL, shard INTEGER NOT NULL, target_type TEXT NOT NULL, "
    "target_key TEXT NOT NULL, name TEXT NOT NULL, payload TEXT NOT NULL, start TEXT, "
    "id_reuse TEXT NOT NULL, delivered INTEGER NOT NULL, error TEXT, created_at REAL NOT "
    "NULL, message_id TEXT, PRIMARY KEY (etype, key, run_id, seq)) WITHOUT ROWID")
_OUTBOX_PENDING = "CREATE INDEX IF NOT EXISTS outbox_pending ON outbox (shard, delivered)"

MIGRATIONS: dict[int, tuple[str, ...]] = {
    2: ("CREATE INDEX IF NOT EXISTS timers_shard_due ON timers (shard, due_at)",
        "CREATE INDEX IF NOT EXISTS entities_status ON entities (status, etype, key)"),
    3: (*create("signal_waits", "sqlite"),
        # Operators see when an entity last accepted a message or changed status.
        "ALTER TABLE entities ADD COLUMN updated_at REAL"),
    # A dead letter's id is never reused (AUTOINCREMENT): a table rebuild, as SQLite
    # cannot add AUTOINCREMENT to an existing table.
    4: (table_sql("dead_letters", "sqlite", as_name="dead_letters_v4"),
        f"INSERT INTO dead_letters_v4 ({_DEAD_LETTER_FIELDS}) "
        f"SELECT {_DEAD_LETTER_FIELDS} FROM dead_letters",
        "DROP TABLE dead_letters",
        "ALTER TABLE dead_letters_v4 RENAME TO dead_letters",
        *create("dead_letters", "sqlite")[1:]),
    # The dedupe window is swept by seq (`SnapshotOp`): a sweep reads only the rows it
    # forgets, where it read every row of the entity's window (~10 ms a snapshot at a
    # window of 100,000 ids).
    5: ("CREATE INDEX IF NOT EXISTS dedupe_seq ON dedupe (etype, key, seq)",),
    6: create("suspensions", "sqlite"),
    # The registry of builds (`_build_registry`).
    7: (*create("builds", "sqlite"), *create("build_processes", "sqlite")),
    # Graceful shard hand-off (`_ops_handoff`).
    8: create("lease_handoffs", "sqlite"),
    # Hosts' progress: applied watermarks and mailbox depths (`_progress`).
    9: create("progress", "sqlite"),
    # Durable steps (`_ops_steps`) and the outbox of entity-to-entity sends (`_ops_outbox`).
    10: (*create("steps", "sqlite"), _OUTBOX_V13.format("outbox"), _OUTBOX_PENDING),
    # Retention (`_ops_retention`) finds the runs closed longest ago per type.
    11: ("CREATE INDEX IF NOT EXISTS runs_closed ON runs (etype, closed_at)",),
    # Which cluster hosts the store: one Ray instance, or local hosts (`_hosting`).
    12: create("hosting", "sqlite"),
    # A handler's send carries the message id derived from its cause (`_ops_outbox`): a
    # rebuild, as the table 10 creates is today's (a store from before 10 has it already).
    13: (_OUTBOX_V13.format("outbox_v13"),
         f"INSERT INTO outbox_v13 ({_OUTBOX_FIELDS}) SELECT {_OUTBOX_FIELDS} FROM outbox",
         "DROP TABLE outbox",
         "ALTER TABLE outbox_v13 RENAME TO outbox",
         _OUTBOX_PENDING),
    # Declared releases of each deployment (`_releases`).
    14: create("releases", "sqlite"),
    # A shard's recovery read seeks its running entities (PostgreSQL has had it from 1):
    # `entities_status` walked every running entity of every shard (116 ms a shard at
    # 100,000 running).
    15: ("CREATE INDEX IF NOT EXISTS entities_running ON entities (shard) "
         "WHERE status = 'running'",),
    # The census counts entities from counters its writers keep (`_census`): it
    # counted every row (0.7 s a scrape at 1,000,000 entities).
    # ... and the backlog from its hosts' summaries per shard (`_backlog`): it sought
    # every running entity.
    16: (*create("census_counts", "sqlite"), *RECOUNT, *create("backlogs", "sqlite"),
         # ... and operators page one type's or entity's dead letters by a seek.
         "CREATE INDEX IF NOT EXISTS dead_letters_type ON dead_letters (etype, id)",
         "CREATE INDEX IF NOT EXISTS dead_letters_key ON dead_letters (etype, key, id)"),
    # Steps in an entity's history, with their attempts (`_ops_steps`).
    17: create("step_history", "sqlite"),
    # A listing reads each entity's run's first seq from its own row, not one run
    # lookup per row (`_tables.first_seq_sql`; rows keep NULL until their next run).
    18: ("ALTER TABLE entities ADD COLUMN first_seq INTEGER",),
    # Traces (`corral._tracing`): a message's W3C traceparent, stored with its journal
    # entry, and a send's with its outbox row, so whichever host applies it continues
    # the trace.
    19: ("ALTER TABLE journal ADD COLUMN trace TEXT",
         "ALTER TABLE outbox ADD COLUMN trace TEXT"),
    # Schedules (`_ops_schedules`).
    20: create("schedules", "sqlite"),
}
"""Schema version -> the statements that upgrade a store from the version before it."""

SCHEMA_VERSION = max(MIGRATIONS)
"""The schema this corral writes."""


def parse_schema_version(found: str, where: str) -> int:
    """The schema version a store recorded (`found`, the text of its `meta` row), as
    both engines read it; a `StoreError` saying what to fix if it is not an integer."""
    try:
        return int(found)
    except ValueError:
        raise StoreError(
            f"store {where} has an unreadable schema version {found!r} (the "
            "'schema_version' row of its meta table, where corral writes an integer): "
            "restore the store from a backup, or set that row back to the version of "
            "the corral that wrote the store") from None


def shard_count_error(where: str, pinned: str, shards: int) -> ShardCountError:
    """The refusal of a store created with `pinned` shards (its `meta` row) opened with
    `shards`, as both engines word it."""
    count = int(pinned) if pinned.isascii() and pinned.isdecimal() else 0
    return ShardCountError(
        f"{where} was created with shards={pinned}, this runtime uses {shards}; the "
        f"shard count is fixed when a store is created (open it with shards={pinned})",
        store_shards=count, shards=shards)


PRAGMAS = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=FULL",
    "PRAGMA busy_timeout=30000",
    "PRAGMA journal_size_limit=67108864",
    "PRAGMA foreign_keys=OFF",
)
