"""Stable routing of entity identities to shards."""

from __future__ import annotations

import hashlib

from ._options import check_shards

__all__ = ["Router"]


class Router:
    """Maps (entity type, key) to one of `shards` shards.

    Uses blake2b, never Python's `hash()` (salted per process), so every process,
    Ray worker and node computes the same shard for the same entity.
    """

    __slots__ = ("shards",)

    def __init__(self, shards: int) -> None:
        self.shards = check_shards(shards)

    def shard_of(self, entity_type: str, key: str) -> int:
        digest = hashlib.blake2b(f"{entity_type}\0{key}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") % self.shards
