"""The PostgreSQL schema, its version, and the check every `PostgresStore` makes on open.

Same tables as the SQLite store (`_schema.py`), with two differences that come from
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

from ._schema import parse_schema_version

__all__ = ["NOTIFY_CHANNEL", "SCHEMA_VERSION", "ensure_schema"]

NOTIFY_CHANNEL = "corral_journal"  # payload: "<store token> <shard>,<shard>,..."
_LOCK_KEY = 0x636F7272616C  # "corral": serialises schema creation across processes

# {version: statements that take a store from the version before it to this one}.
# `DDL` below is version 1; a new store runs it and then every migration.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    2: (
        # Durable signal waits (`wait_for_signal` / `deliver`): one row per wait of a
        # run, retaining the one delivery that won it (see `_waits`).
        """CREATE TABLE IF NOT EXISTS signal_waits (
            etype text NOT NULL,
            key text NOT NULL,
            run_id bigint NOT NULL,
            name text NOT NULL,
            shard integer NOT NULL,
            status text NOT NULL,
            opened_at double precision,
            deadline double precision,
            delivery_key text,
            payload text,
            sender text,
            delivered_at double precision,
            PRIMARY KEY (etype, key, run_id, name))""",
        # A delivery's key is looked up across the entity's retained runs.
        "CREATE INDEX IF NOT EXISTS signal_waits_key ON signal_waits "
        "(etype, key, name, delivery_key)",
        # Operators list open waits oldest first.
        "CREATE INDEX IF NOT EXISTS signal_waits_open ON signal_waits "
        "(status, opened_at, etype, key, run_id, name)",
        # Operators see when an entity last accepted a message or changed status.
        "ALTER TABLE entities ADD COLUMN IF NOT EXISTS updated_at double precision",
    ),
    # The dedupe window is swept by seq (`_pg_txn._TRIM`): a sweep reads only the
    # ids it forgets, where it read every id of the entity's window. Partial, `WHERE
    # seq > 0` (every seq is): PostgreSQL uses a partial index only for a query whose
    # WHERE implies its predicate, so the message-id lookups (no seq in them) keep the
    # primary key. With a full index its planner, planning on a young table, picked
    # this one for them (a scan of the entity's window per id: 1 entity at 1,000
    # senders fell from ~10,000 to 1,000 acks/s).
    3: ("CREATE INDEX IF NOT EXISTS dedupe_sweep ON dedupe (etype, key, seq) WHERE seq > 0",),
    # Suspended runs (`_suspensions`): a run whose `run()` raised, or whose activation
    # could not be built, stays running and is retried; this row says so, durably.
    4: (
        """CREATE TABLE IF NOT EXISTS suspensions (
            etype text NOT NULL,
            key text NOT NULL,
            run_id bigint NOT NULL,
            shard integer NOT NULL,
            error text NOT NULL,
            attempts integer NOT NULL,
            since double precision NOT NULL,
            next_at double precision NOT NULL,
            PRIMARY KEY (etype, key))""",
        # A host taking a shard reads its suspended runs.
        "CREATE INDEX IF NOT EXISTS suspensions_shard ON suspensions (shard)",
    ),
    5: (),  # reserved for builds
    # Graceful shard hand-off (`_ops_handoff`): a host's request for a shard, then the
    # shard released to it; and which hosts are alive to receive shards.
    6: (
        """CREATE TABLE IF NOT EXISTS lease_handoffs (
            shard integer PRIMARY KEY,
            requester text NOT NULL,
            until double precision NOT NULL,
            released boolean NOT NULL)""",
        """CREATE TABLE IF NOT EXISTS shard_hosts (
            owner text PRIMARY KEY,
            expires_at double precision NOT NULL)""",
    ),
}
SCHEMA_VERSION = max(MIGRATIONS)
"""The schema this corral writes."""

DDL = (
    """CREATE TABLE IF NOT EXISTS meta (
        k text PRIMARY KEY,
        v text NOT NULL)""",
    # The latest run of each entity and the next journal sequence number.
    """CREATE TABLE IF NOT EXISTS entities (
        etype text NOT NULL,
        key text NOT NULL,
        shard integer NOT NULL,
        run_id bigint NOT NULL,
        status text NOT NULL,
        next_seq bigint NOT NULL,
        passivated_seq bigint,
        PRIMARY KEY (etype, key))""",
    "CREATE INDEX IF NOT EXISTS entities_running ON entities (shard) "
    "WHERE status = 'running'",
    # Operators list entities by status, type and key.
    "CREATE INDEX IF NOT EXISTS entities_status ON entities (status, etype, key)",
    """CREATE TABLE IF NOT EXISTS runs (
        etype text NOT NULL,
        key text NOT NULL,
        run_id bigint NOT NULL,
        status text NOT NULL,
        start_input text,
        result text,
        error text,
        started_at double precision NOT NULL,
        closed_at double precision,
        continued_from bigint,
        first_seq bigint NOT NULL,
        PRIMARY KEY (etype, key, run_id))""",
    # `tick` orders a shard's entries in commit order (0: re-inserted by continue-as-new,
    # not a new acceptance, never tailed).
    """CREATE TABLE IF NOT EXISTS journal (
        etype text NOT NULL,
        key text NOT NULL,
        seq bigint NOT NULL,
        run_id bigint NOT NULL,
        shard integer NOT NULL,
        tick bigint NOT NULL,
        kind text NOT NULL,
        name text NOT NULL,
        message_id text NOT NULL,
        payload text NOT NULL,
        sender text,
        accepted_at double precision NOT NULL,
        PRIMARY KEY (etype, key, seq))""",
    "CREATE INDEX IF NOT EXISTS journal_tail ON journal (shard, tick)",
    """CREATE TABLE IF NOT EXISTS dedupe (
        etype text NOT NULL,
        key text NOT NULL,
        message_id text NOT NULL,
        seq bigint NOT NULL,
        run_id bigint NOT NULL,
        payload_hash bytea NOT NULL,
        sender text,
        accepted_at double precision NOT NULL,
        outcome text,
        PRIMARY KEY (etype, key, message_id))""",
    """CREATE TABLE IF NOT EXISTS snapshots (
        etype text NOT NULL,
        key text NOT NULL,
        run_id bigint NOT NULL,
        applied_seq bigint NOT NULL,
        state bytea NOT NULL,
        created_at double precision NOT NULL,
        PRIMARY KEY (etype, key, applied_seq))""",
    """CREATE TABLE IF NOT EXISTS timers (
        etype text NOT NULL,
        key text NOT NULL,
        run_id bigint NOT NULL,
        timer_id text NOT NULL,
        shard integer NOT NULL,
        due_at double precision NOT NULL,
        PRIMARY KEY (etype, key, timer_id))""",
    # Durable timers are looked up per shard (due ones, and the next one).
    "CREATE INDEX IF NOT EXISTS timers_shard_due ON timers (shard, due_at)",
    """CREATE TABLE IF NOT EXISTS dead_letters (
        id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
        etype text NOT NULL,
        key text NOT NULL,
        run_id bigint NOT NULL,
        seq bigint NOT NULL,
        message_id text NOT NULL,
        name text NOT NULL,
        payload text NOT NULL,
        sender text,
        error text NOT NULL,
        traceback text NOT NULL,
        attempts integer NOT NULL,
        failed_at double precision NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS dead_letters_entity ON dead_letters (etype, key, run_id, seq)",
    """CREATE TABLE IF NOT EXISTS leases (
        shard integer PRIMARY KEY,
        owner text NOT NULL,
        epoch bigint NOT NULL,
        expires_at double precision NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS shard_ticks (
        shard integer PRIMARY KEY,
        tick bigint NOT NULL)""",
)


async def ensure_schema(conn: Any, shards: int, *, where: str) -> None:
    """Create or migrate the schema and check the shard count, in one transaction.

    Raises:
        StoreError: the store was written by a newer corral (both versions named), or
            created with another shard count.
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
        if found is None or version < SCHEMA_VERSION:
            # DDL only when needed: even `CREATE INDEX IF NOT EXISTS` takes a table lock,
            # which would deadlock against other processes already writing.
            for statement in DDL:  # version 1 (a no-op where it exists)
                await conn.execute(statement)
            for step in range(max(version, 1) + 1, SCHEMA_VERSION + 1):
                for statement in MIGRATIONS[step]:
                    await conn.execute(statement)
        await conn.execute(
            "INSERT INTO meta (k, v) VALUES ('schema_version', $1), ('shards', $2) "
            "ON CONFLICT (k) DO UPDATE SET v = excluded.v WHERE meta.k = 'schema_version'",
            str(SCHEMA_VERSION), str(shards),
        )
        pinned = await conn.fetchval("SELECT v FROM meta WHERE k = 'shards'")
        if pinned != str(shards):
            raise StoreError(
                f"store {where} was created with shards={pinned}, this runtime uses "
                f"{shards}; the shard count is fixed when a store is created"
            )
        await conn.execute(
            "INSERT INTO leases (shard, owner, epoch, expires_at) "
            "SELECT s, '', 0, 0 FROM generate_series(0, $1 - 1) s ON CONFLICT DO NOTHING",
            shards,
        )
        await conn.execute(
            "INSERT INTO shard_ticks (shard, tick) SELECT s, 0 FROM generate_series(0, $1 - 1) s "
            "ON CONFLICT DO NOTHING", shards,
        )
