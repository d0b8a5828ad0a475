"""Durable storage behind the `Store` protocol: `SqliteStore` (the embedded default) and
`PostgresStore` (`corral.persistence._postgres`, a shared database for clusters of
several machines; imported only when a `postgresql://` store is opened)."""

from ._codec import canonical_encoder, canonical_json, payload_hash, plain_canonical_json
from ._existing import stored_shards
from ._open import is_postgres_url, open_store
from ._records import (
    Acceptance,
    AcceptResult,
    DeadLetter,
    DeliveryRequest,
    DeliveryResult,
    EntityDetails,
    EntityRecord,
    EntryKind,
    JournalEntry,
    RunRecord,
    Suspension,
    UpdateOutcome,
    WaitRecord,
)
from ._sqlite import SqliteStore, open_sqlite_store
from ._store import Store
from ._txn import Fence
from ._waits import WaitPosition, delivery_run

__all__ = [
    "AcceptResult",
    "Acceptance",
    "DeadLetter",
    "DeliveryRequest",
    "DeliveryResult",
    "EntityDetails",
    "EntityRecord",
    "EntryKind",
    "Fence",
    "JournalEntry",
    "RunRecord",
    "SqliteStore",
    "Store",
    "Suspension",
    "UpdateOutcome",
    "WaitPosition",
    "WaitRecord",
    "canonical_encoder",
    "canonical_json",
    "delivery_run",
    "is_postgres_url",
    "open_sqlite_store",
    "open_store",
    "payload_hash",
    "plain_canonical_json",
    "stored_shards",
]
