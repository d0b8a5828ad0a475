"""PostgreSQL's journal tail, and its position: one opaque int packing a tick per shard
(every other read is shared with SQLite: `_reads`).

The tail never goes by a global sequence (see `_pg_schema`): per shard, ticks become
visible in commit order with no gaps, so "every entry of shard k with tick > t" read
twice can only grow, and nothing committed late is skipped. A position packs the last
tick seen of every shard into one int, 64 bits per shard (`pack_position`). A shard
the caller does not tail jumps to its current tick, so a position never lags far
behind for shards it does not own, unless the store is acquiring or holding it: then
it keeps its place, so a host that registers the shard just after a tail still gets
what was accepted for it meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ._reads import ENTRY_COLUMNS, tail_entries
from ._records import JournalEntry

__all__ = ["current_ticks", "pack_position", "read_tail", "unpack_position"]

_TICK_BITS = 64
_TICK_MASK = (1 << _TICK_BITS) - 1


def pack_position(ticks: Sequence[int]) -> int:
    """One int holding each shard's last tick seen (shard k in bits 64k..64k+63)."""
    pos = 0
    for shard, tick in enumerate(ticks):
        pos |= (tick & _TICK_MASK) << (_TICK_BITS * shard)
    return pos


def unpack_position(pos: int, shards: int) -> list[int]:
    return [(max(pos, 0) >> (_TICK_BITS * s)) & _TICK_MASK for s in range(shards)]


async def current_ticks(conn: Any, shards: int) -> list[int]:
    """Every shard's committed tick (entries accepted so far), shard by shard."""
    ticks = [0] * shards
    for r in await conn.fetch("SELECT shard, tick FROM shard_ticks WHERE shard < $1", shards):
        if r[0] >= 0:
            ticks[r[0]] = r[1]
    return ticks


_TAIL = f"""
SELECT j.shard, j.tick, {", ".join("j." + c for c in ENTRY_COLUMNS.split(", "))}
FROM unnest($1::int[], $2::bigint[]) AS c(shard, after)
CROSS JOIN LATERAL (
    SELECT * FROM journal WHERE journal.shard = c.shard AND journal.tick > c.after
    ORDER BY journal.tick LIMIT $3
) AS j
ORDER BY j.shard, j.tick
"""


async def read_tail(conn: Any, cursor: list[int], tailed: Iterable[int], held: Iterable[int],
                    limit: int) -> tuple[int, list[JournalEntry]]:
    """Entries after `cursor` of the `tailed` shards, and the position after them.

    A shard neither tailed nor `held` (being acquired or hosted through this store)
    jumps to its current tick; a held shard that is not tailed yet keeps its place, so
    a host that registers a shard just after this read still gets what was accepted
    for it meanwhile.
    """
    n = len(cursor)
    tailed = sorted(s for s in set(tailed) if 0 <= s < n)
    keep = set(tailed) | {s for s in held if 0 <= s < n}
    new = list(cursor)
    for shard, tick in enumerate(await current_ticks(conn, n)):
        if shard not in keep:
            new[shard] = max(new[shard], tick)
    entries: list[JournalEntry] = []
    if tailed:
        per_shard = max(1, -(-limit // len(tailed)))
        rows = await conn.fetch(_TAIL, tailed, [cursor[s] for s in tailed], per_shard)
        for r in rows:
            new[r[0]] = max(new[r[0]], r[1])
        entries = tail_entries([r[2:] for r in rows])
    return pack_position(new), entries
