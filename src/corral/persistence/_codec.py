"""The stored form of payloads: canonical JSON (never pickle for anything a caller
sends) and the hash that says whether two messages are the same."""

from __future__ import annotations

import hashlib
import json
from typing import Any

__all__ = ["canonical_json", "payload_hash"]


def canonical_json(value: Any) -> str:
    """Compact, key-sorted JSON; NaN and infinities are refused (they are not JSON)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False,
                      ensure_ascii=False)


def payload_hash(name: str, payload: str) -> bytes:
    """What "the same message" means for deduplication: the same handler and payload."""
    return hashlib.blake2b(f"{name}\0{payload}".encode(), digest_size=16).digest()
