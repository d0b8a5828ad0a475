"""Durable storage behind the `Store` protocol: `SqliteStore` (the embedded default) and
`PostgresStore` (`corral.persistence._postgres`, a shared database for clusters of
several machines; imported only when a `postgresql://` store is opened).

One store core for both engines: every write op (`_ops_*`) and every read (`_reads`;
an entity's history: `_entity_history`) is written once against the shared transaction
`_txn.Txn`, `_store_core.StoreCore` holds the `Store` methods both stores share,
`_batch` their group commit and `_tables` every table (each engine keeps its own
migrations). Each engine implements only its
primitives: `_sqlite_txn` / `_sqlite` (a `sqlite3` connection in a thread of its own,
ops driven to completion there) and `_pg_txn` / `_pg_writer` / `_postgres` (asyncpg,
the batch's global lock order, set-based flush, NOTIFY, advisory locks, `_pg_tail`).
"""

from ._backlog import ShardBacklog
from ._backup import backup, restore
from ._build_registry import (
    BuildCheck,
    BuildFacts,
    BuildProcess,
    BuildRecord,
    BuildRegistry,
    newest_build,
)
from ._census import Census, TypeBacklog
from ._codec import canonical_encoder, canonical_json, payload_hash, plain_canonical_json
from ._existing import stored_shards
from ._hosting import HostingClaim, HostingRegistry
from ._housekeeping import housekeeping
from ._migrate import Copied, TableCheck, Verification, migrate, verify
from ._open import open_store
from ._ops_outbox import OutboxRow, Send, handler_send_id, send_message_id
from ._ops_retention import Purged
from ._ops_schedules import (
    DueSchedule,
    Fired,
    FireOp,
    ScheduleRow,
    tick_message_id,
    trigger_message_id,
)
from ._ops_steps import (
    STEP_ERROR_CHARS,
    STEP_HISTORY_PER_RUN,
    STEP_RESULT_CHARS,
    STEP_TRACEBACK_CHARS,
    StepAttempts,
    StepRecord,
    StepStatus,
    storable_text,
)
from ._records import (
    DERIVED_ID_PREFIXES,
    Acceptance,
    AcceptResult,
    DeadLetter,
    DeliveryRequest,
    DeliveryResult,
    EntityDetails,
    EntityRecord,
    EntryKind,
    JournalEntry,
    MessageRecord,
    Progress,
    RunRecord,
    Suspension,
    TimerRecord,
    UnreadableRow,
    UpdateOutcome,
    WaitRecord,
)
from ._releases import ReleaseRecord, ReleaseRegistry
from ._rows import Row, stored_json
from ._schedule_store import ScheduleStore
from ._sqlite import SqliteStore, open_sqlite_store
from ._store import AcceptStore, HostStore, ReadStore, Store
from ._txn import Fence
from ._urls import is_postgres_url
from ._waits import WaitPosition, delivery_run, timer_id

__all__ = [
    "DERIVED_ID_PREFIXES",
    "STEP_ERROR_CHARS",
    "STEP_HISTORY_PER_RUN",
    "STEP_RESULT_CHARS",
    "STEP_TRACEBACK_CHARS",
    "AcceptResult",
    "AcceptStore",
    "Acceptance",
    "BuildCheck",
    "BuildFacts",
    "BuildProcess",
    "BuildRecord",
    "BuildRegistry",
    "Census",
    "Copied",
    "DeadLetter",
    "DeliveryRequest",
    "DeliveryResult",
    "DueSchedule",
    "EntityDetails",
    "EntityRecord",
    "EntryKind",
    "Fence",
    "FireOp",
    "Fired",
    "HostStore",
    "HostingClaim",
    "HostingRegistry",
    "JournalEntry",
    "MessageRecord",
    "OutboxRow",
    "Progress",
    "Purged",
    "ReadStore",
    "ReleaseRecord",
    "ReleaseRegistry",
    "Row",
    "RunRecord",
    "ScheduleRow",
    "ScheduleStore",
    "Send",
    "ShardBacklog",
    "SqliteStore",
    "StepAttempts",
    "StepRecord",
    "StepStatus",
    "Store",
    "Suspension",
    "TableCheck",
    "TimerRecord",
    "TypeBacklog",
    "UnreadableRow",
    "UpdateOutcome",
    "Verification",
    "WaitPosition",
    "WaitRecord",
    "backup",
    "canonical_encoder",
    "canonical_json",
    "delivery_run",
    "handler_send_id",
    "housekeeping",
    "is_postgres_url",
    "migrate",
    "newest_build",
    "open_sqlite_store",
    "open_store",
    "payload_hash",
    "plain_canonical_json",
    "restore",
    "send_message_id",
    "storable_text",
    "stored_json",
    "stored_shards",
    "tick_message_id",
    "timer_id",
    "trigger_message_id",
    "verify",
]
