"""Durable storage behind the `Store` protocol; `SqliteStore` is the embedded default."""

from ._codec import canonical_json, payload_hash
from ._records import (
    Acceptance,
    AcceptResult,
    DeadLetter,
    EntryKind,
    JournalEntry,
    RunRecord,
    UpdateOutcome,
)
from ._sqlite import SqliteStore, open_sqlite_store
from ._store import Store
from ._txn import Fence

__all__ = [
    "AcceptResult",
    "Acceptance",
    "DeadLetter",
    "EntryKind",
    "Fence",
    "JournalEntry",
    "RunRecord",
    "SqliteStore",
    "Store",
    "UpdateOutcome",
    "canonical_json",
    "open_sqlite_store",
    "payload_hash",
]
