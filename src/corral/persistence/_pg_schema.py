"""The PostgreSQL schema, its version, and the check every `PostgresStore` makes on open.

Same tables as the SQLite store (`_tables.py`), with two differences that come from
several writers sharing one server:

- `leases` and `shard_ticks` hold one row per shard from the start, so every lock a
  transaction takes on them is a lock on an existing row (two processes can never both
  insert "the first" lease of a shard).
- The journal is tailed per shard, not by a global position: `shard_ticks.tick` counts
  the entries accepted for a shard and is bumped under that row's lock inside the
  accepting transaction, so per shard the ticks become visible in commit order with no
  gaps (a global sequence is not: a transaction that drew a lower value can commit
  after one that drew a higher value, and a reader past the higher one skips it).

Opening a store creates the tables if needed under a transaction-scoped advisory lock
(concurrent `CREATE TABLE IF NOT EXISTS` is not safe in PostgreSQL), refuses a store
written by a newer corral, migrates an older one, and pins the shard count. A store
already at this version runs no DDL at all (see `ensure_schema`).
"""

from __future__ import annotations

from typing import Any

from corral._errors import StoreError

from ._census import RECOUNT
from ._schema import parse_schema_version, shard_count_error
from ._tables import create, create_all, set_storage

__all__ = ["NOTIFY_CHANNEL", "SCHEMA_VERSION", "ensure_schema"]

NOTIFY_CHANNEL = "corral_journal"  # payload: "<store token> <shard>,<shard>,..."
_LOCK_KEY = 0x636F7272616C  # "corral": serialises schema creation across processes

# {version: statements that take a store from the version before it to this one};
# a new store is created at `SCHEMA_VERSION` at once (`_tables.create_all`).
MIGRATIONS: dict[int, tuple[str, ...]] = {
    2: (*create("signal_waits", "postgres"),
        # Operators see when an entity last accepted a message or changed status.
        "ALTER TABLE entities ADD COLUMN IF NOT EXISTS updated_at double precision"),
    # The dedupe window is swept by seq (`_pg_txn._TRIM`): a sweep reads only the
    # ids it forgets, where it read every id of the entity's window. Partial, `WHERE
    # seq > 0` (every seq is): PostgreSQL uses a partial index only for a query whose
    # WHERE implies its predicate, so the message-id lookups (no seq in them) keep the
    # primary key. With a full index its planner, planning on a young table, picked
    # this one for them (a scan of the entity's window per id: 1 entity at 1,000
    # senders fell from ~10,000 to 1,000 acks/s).
    3: ("CREATE INDEX IF NOT EXISTS dedupe_sweep ON dedupe (etype, key, seq) WHERE seq > 0",),
    4: create("suspensions", "postgres"),
    # The registry of builds (`_build_registry`).
    5: (*create("builds", "postgres"), *create("build_processes", "postgres")),
    # Graceful shard hand-off (`_ops_handoff`).
    6: create("lease_handoffs", "postgres"),
    # Hosts' progress: applied watermarks and mailbox depths (`_progress`).
    7: create("progress", "postgres"),
    # Durable steps (`_ops_steps`) and the outbox of entity-to-entity sends (`_ops_outbox`).
    8: (*create("steps", "postgres"), *create("outbox", "postgres")),
    # Retention (`_ops_retention`) finds the runs closed longest ago per type.
    9: ("CREATE INDEX IF NOT EXISTS runs_closed ON runs (etype, closed_at)",),
    # Which cluster hosts the store: one Ray instance, or local hosts (`_hosting`).
    10: create("hosting", "postgres"),
    # A handler's send carries the message id derived from its cause (`_ops_outbox`).
    11: ("ALTER TABLE outbox ADD COLUMN IF NOT EXISTS message_id text",),
    # A key-prefix search of one type seeks an index under any collation (`_reads`).
    12: ("CREATE INDEX IF NOT EXISTS entities_key_prefix ON entities "
         "(etype, key text_pattern_ops)",),
    # Declared releases of each deployment (`_releases`).
    13: create("releases", "postgres"),
    # The census counts entities from counters its writers keep (`_census`): it
    # counted every row (1.0 s a scrape at 1,000,000 entities).
    # ... and the backlog from its hosts' summaries per shard (`_backlog`): it sought
    # every running entity.
    14: (*create("census_counts", "postgres"), *RECOUNT, *create("backlogs", "postgres"),
         # ... and operators page one type's or entity's dead letters by a seek.
         "CREATE INDEX IF NOT EXISTS dead_letters_type ON dead_letters (etype, id)",
         "CREATE INDEX IF NOT EXISTS dead_letters_key ON dead_letters (etype, key, id)"),
    # A hot entity's storage bounded by its snapshot policy: room for HOT updates of the
    # rows every acceptance updates, autovacuum's terms for the tables a snapshot deletes
    # from (`_tables`; the store vacuums those itself as well, `_pg_vacuum`).
    15: set_storage("postgres"),
    # Steps in an entity's history, with their attempts (`_ops_steps`).
    16: create("step_history", "postgres"),
    # A listing reads each entity's run's first seq from its own row, not one run
    # lookup per row (`_tables.first_seq_sql`; rows keep NULL until their next run).
    17: ("ALTER TABLE entities ADD COLUMN IF NOT EXISTS first_seq bigint",),
    # Traces (`corral._tracing`): a message's W3C traceparent, stored with its journal
    # entry, and a send's with its outbox row (8 created today's outbox: it may have it).
    18: ("ALTER TABLE journal ADD COLUMN IF NOT EXISTS trace text",
         "ALTER TABLE outbox ADD COLUMN IF NOT EXISTS trace text"),
    # Schedules (`_ops_schedules`).
    19: create("schedules", "postgres"),
}
SCHEMA_VERSION = max(MIGRATIONS)
"""The schema this corral writes."""


_CODE_POINTS = (
    "SELECT CASE WHEN c.collname = 'default' THEN d.datcollate IN ('C', 'POSIX') AND "
    "coalesce(to_jsonb(d) ->> 'datlocprovider', 'c') = 'c' "
    "ELSE c.collname IN ('C', 'POSIX') END FROM pg_attribute a "
    "JOIN pg_collation c ON c.oid = a.attcollation CROSS JOIN pg_database d "
    "WHERE a.attrelid = 'entities'::regclass AND a.attname = 'key' "
    "AND d.datname = current_database()")


async def keys_in_code_points(conn: Any) -> bool:
    """Whether `entities.key` is ordered by code point: its collation, or the
    database's, is "C" (or "POSIX") from the C library (an ICU or other locale's
    order is not; nor, to the planner, "C.utf8", whatever its order)."""
    return bool(await conn.fetchval(_CODE_POINTS))


async def ensure_schema(conn: Any, shards: int, *, where: str) -> None:
    """Create or migrate the schema and check the shard count, in one transaction.

    Raises:
        StoreError: the store was written by a newer corral (both versions named).
        ShardCountError: the store was created with another shard count.
    """
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
        found = None
        if await conn.fetchval("SELECT to_regclass('meta') IS NOT NULL"):
            found = await conn.fetchval("SELECT v FROM meta WHERE k = 'schema_version'")
        version = 0 if found is None else parse_schema_version(found, where)
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"store {where} has schema version {version}, written by a newer corral; "
                f"this corral supports schema versions up to {SCHEMA_VERSION}: upgrade corral"
            )
        # DDL only when needed: even `CREATE INDEX IF NOT EXISTS` takes a table lock,
        # which would deadlock against other processes already writing.
        statements = create_all("postgres") if found is None else tuple(
            s for step in range(max(version, 1) + 1, SCHEMA_VERSION + 1)
            for s in MIGRATIONS[step])
        for statement in statements:
            await conn.execute(statement)
        await conn.execute(
            "INSERT INTO meta (k, v) VALUES ('schema_version', $1), ('shards', $2) "
            "ON CONFLICT (k) DO UPDATE SET v = excluded.v WHERE meta.k = 'schema_version'",
            str(SCHEMA_VERSION), str(shards),
        )
        pinned = await conn.fetchval("SELECT v FROM meta WHERE k = 'shards'")
        if pinned != str(shards):
            raise shard_count_error(f"store {where}", pinned, shards)
        await conn.execute(
            "INSERT INTO leases (shard, owner, epoch, expires_at) "
            "SELECT s, '', 0, 0 FROM generate_series(0, $1 - 1) s ON CONFLICT DO NOTHING",
            shards,
        )
        await conn.execute(
            "INSERT INTO shard_ticks (shard, tick) SELECT s, 0 FROM generate_series(0, $1 - 1) s "
            "ON CONFLICT DO NOTHING", shards,
        )
