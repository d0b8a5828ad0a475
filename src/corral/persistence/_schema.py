"""The SQLite schema. One file holds every table; `meta` pins the schema and shard count.

Key choices (see SQLITE_NOTES.md): the journal is a rowid table whose `pos` grows in
commit order, so a host can tail it cheaply for entries other processes accepted;
dedupe and run lookups are narrow WITHOUT ROWID tables keyed by (etype, key, ...).

Versions: `DDL` is schema 1, the first one released; each later version is one entry
of `MIGRATIONS`, the statements that upgrade a store from the version before it. A
store records its version in `meta`; opening applies the missing migrations in one
transaction, and a store written by a newer corral is refused (see `SqliteStore`).
"""

from __future__ import annotations

from corral._errors import StoreError

_DEAD_LETTER_FIELDS = ("id, etype, key, run_id, seq, message_id, name, payload, sender, "
                       "error, traceback, attempts, failed_at")

MIGRATIONS: dict[int, tuple[str, ...]] = {
    2: (
        # Durable timers are looked up per shard (due ones, and the next one).
        "CREATE INDEX IF NOT EXISTS timers_shard_due ON timers (shard, due_at)",
        # Operators list entities by status, type and key.
        "CREATE INDEX IF NOT EXISTS entities_status ON entities (status, etype, key)",
    ),
    3: (
        # Durable signal waits (`wait_for_signal` / `deliver`): one row per wait of a
        # run, retaining the one delivery that won it (see `_waits`).
        """CREATE TABLE IF NOT EXISTS signal_waits (
            etype TEXT NOT NULL,
            key TEXT NOT NULL,
            run_id INTEGER NOT NULL,
            name TEXT NOT NULL,
            shard INTEGER NOT NULL,
            status TEXT NOT NULL,
            opened_at REAL,
            deadline REAL,
            delivery_key TEXT,
            payload TEXT,
            sender TEXT,
            delivered_at REAL,
            PRIMARY KEY (etype, key, run_id, name)
        ) WITHOUT ROWID""",
        # A delivery's key is looked up across the entity's retained runs.
        "CREATE INDEX IF NOT EXISTS signal_waits_key ON signal_waits "
        "(etype, key, name, delivery_key)",
        # Operators list open waits oldest first.
        "CREATE INDEX IF NOT EXISTS signal_waits_open ON signal_waits "
        "(status, opened_at, etype, key, run_id, name)",
        # Operators see when an entity last accepted a message or changed status.
        "ALTER TABLE entities ADD COLUMN updated_at REAL",
    ),
    4: (
        # A dead letter's id is never given to another one (AUTOINCREMENT): without it
        # SQLite reuses the highest id after a delete, so an operator's retried discard
        # or replay of a letter that is gone could hit a newer letter. A table rebuild:
        # SQLite cannot add AUTOINCREMENT to an existing table.
        """CREATE TABLE dead_letters_v4 (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            etype TEXT NOT NULL,
            key TEXT NOT NULL,
            run_id INTEGER NOT NULL,
            seq INTEGER NOT NULL,
            message_id TEXT NOT NULL,
            name TEXT NOT NULL,
            payload TEXT NOT NULL,
            sender TEXT,
            error TEXT NOT NULL,
            traceback TEXT NOT NULL,
            attempts INTEGER NOT NULL,
            failed_at REAL NOT NULL
        )""",
        f"INSERT INTO dead_letters_v4 ({_DEAD_LETTER_FIELDS}) "
        f"SELECT {_DEAD_LETTER_FIELDS} FROM dead_letters",
        "DROP TABLE dead_letters",
        "ALTER TABLE dead_letters_v4 RENAME TO dead_letters",
        "CREATE INDEX IF NOT EXISTS dead_letters_entity ON dead_letters "
        "(etype, key, run_id, seq)",
    ),
    # The dedupe window is swept by seq (`SnapshotOp`): a sweep reads only the rows it
    # forgets, where it read every row of the entity's window (~10 ms a snapshot at a
    # window of 100,000 ids). PostgreSQL's index is partial (`_pg_schema`, schema 3).
    5: ("CREATE INDEX IF NOT EXISTS dedupe_seq ON dedupe (etype, key, seq)",),
    # Suspended runs (`_suspensions`): a run whose `run()` raised, or whose activation
    # could not be built, stays running and is retried; this row says so, durably.
    6: (
        """CREATE TABLE IF NOT EXISTS suspensions (
            etype TEXT NOT NULL,
            key TEXT NOT NULL,
            run_id INTEGER NOT NULL,
            shard INTEGER NOT NULL,
            error TEXT NOT NULL,
            attempts INTEGER NOT NULL,
            since REAL NOT NULL,
            next_at REAL NOT NULL,
            PRIMARY KEY (etype, key)
        ) WITHOUT ROWID""",
        # A host taking a shard reads its suspended runs.
        "CREATE INDEX IF NOT EXISTS suspensions_shard ON suspensions (shard)",
    ),
    7: (),  # reserved for builds
    # Graceful shard hand-off (`_ops_handoff`): a host's request for a shard, then the
    # shard released to it; and which hosts are alive to receive shards.
    8: (
        """CREATE TABLE IF NOT EXISTS lease_handoffs (
            shard INTEGER PRIMARY KEY,
            requester TEXT NOT NULL,
            until REAL NOT NULL,
            released INTEGER NOT NULL
        )""",
        """CREATE TABLE IF NOT EXISTS shard_hosts (
            owner TEXT PRIMARY KEY,
            expires_at REAL NOT NULL
        ) WITHOUT ROWID""",
    ),
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


PRAGMAS = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=FULL",
    "PRAGMA busy_timeout=30000",
    "PRAGMA journal_size_limit=67108864",
    "PRAGMA foreign_keys=OFF",
)

DDL = """
CREATE TABLE IF NOT EXISTS meta (
    k TEXT PRIMARY KEY,
    v TEXT NOT NULL
) WITHOUT ROWID;

-- The latest run of each entity and the next journal sequence number.
CREATE TABLE IF NOT EXISTS entities (
    etype TEXT NOT NULL,
    key TEXT NOT NULL,
    shard INTEGER NOT NULL,
    run_id INTEGER NOT NULL,
    status TEXT NOT NULL,
    next_seq INTEGER NOT NULL,
    passivated_seq INTEGER,  -- set while snapshotted and evicted from memory
    PRIMARY KEY (etype, key)
) WITHOUT ROWID;

-- Every run ever started; `continued_from` links continue-as-new chains.
CREATE TABLE IF NOT EXISTS runs (
    etype TEXT NOT NULL,
    key TEXT NOT NULL,
    run_id INTEGER NOT NULL,
    status TEXT NOT NULL,
    start_input TEXT,
    result TEXT,
    error TEXT,
    started_at REAL NOT NULL,
    closed_at REAL,
    continued_from INTEGER,
    first_seq INTEGER NOT NULL,
    PRIMARY KEY (etype, key, run_id)
) WITHOUT ROWID;

-- Accepted messages. seq numbers an entity's messages across runs.
CREATE TABLE IF NOT EXISTS journal (
    pos INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: hosts tail by position
    etype TEXT NOT NULL,
    key TEXT NOT NULL,
    seq INTEGER NOT NULL,
    run_id INTEGER NOT NULL,
    shard INTEGER NOT NULL,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    message_id TEXT NOT NULL,
    payload TEXT NOT NULL,
    sender TEXT,
    accepted_at REAL NOT NULL,
    UNIQUE (etype, key, seq)
);

-- The dedupe window: one row per message id, outliving journal truncation.
CREATE TABLE IF NOT EXISTS dedupe (
    etype TEXT NOT NULL,
    key TEXT NOT NULL,
    message_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    run_id INTEGER NOT NULL,
    payload_hash BLOB NOT NULL,
    sender TEXT,
    accepted_at REAL NOT NULL,
    outcome TEXT,
    PRIMARY KEY (etype, key, message_id)
) WITHOUT ROWID;

-- Entity state (a JSON envelope, see runtime/_snapshot) covering the journal up to applied_seq.
CREATE TABLE IF NOT EXISTS snapshots (
    etype TEXT NOT NULL,
    key TEXT NOT NULL,
    run_id INTEGER NOT NULL,
    applied_seq INTEGER NOT NULL,
    state BLOB NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (etype, key, applied_seq)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS timers (
    etype TEXT NOT NULL,
    key TEXT NOT NULL,
    run_id INTEGER NOT NULL,
    timer_id TEXT NOT NULL,
    shard INTEGER NOT NULL,
    due_at REAL NOT NULL,
    PRIMARY KEY (etype, key, timer_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS timers_due ON timers (due_at);

CREATE TABLE IF NOT EXISTS dead_letters (
    id INTEGER PRIMARY KEY,
    etype TEXT NOT NULL,
    key TEXT NOT NULL,
    run_id INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    message_id TEXT NOT NULL,
    name TEXT NOT NULL,
    payload TEXT NOT NULL,
    sender TEXT,
    error TEXT NOT NULL,
    traceback TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    failed_at REAL NOT NULL
);
-- Recovery asks which entries of a run were dead-lettered; operators list per entity.
CREATE INDEX IF NOT EXISTS dead_letters_entity ON dead_letters (etype, key, run_id, seq);

-- One row per shard: who hosts it, until when, and its fencing epoch.
CREATE TABLE IF NOT EXISTS leases (
    shard INTEGER PRIMARY KEY,
    owner TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    expires_at REAL NOT NULL
);
"""
