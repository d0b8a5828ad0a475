"""What a SQLite store saw of the shard leases it asks for, and since when.

A lease row's `expires_at` is written on its holder's wall clock. Comparing it with the
acquirer's wall clock judges the holder by two clocks: an acquirer whose clock reads
30 s ahead (or a clock stepped forward by NTP or by hand) finds every live lease
expired and takes it from a holder that is renewing (fencing keeps that safe, but the
churn need not happen); one whose clock reads behind waits the difference too long for
a hung holder's shards.

So a SQLite store judges another holder's lease by the holder's *renewals* as it sees
them: each row it reads, with the time it first saw the row in that state on its own
monotonic clock. A row unchanged for a full lease term of that clock is *stale*: its
holder has not renewed for a term, whatever any wall clock says, and `AcquireLeasesOp`
takes the shard only if the row still matches what was seen, in the acquiring
transaction. A holder renews every third of a term, so a live one changes its row
twice over before its lease could look stale. A released lease (`expires_at` 0) is
free at once, and a dead holder's shards are taken at once through their OS locks
(`_locks`): the observation is only for a holder alive but silent (hung, or cut off).

The term is the acquirer's own `ttl`: hosts sharing a store are expected to lease with
the same term (a holder whose term is over three times the acquirer's would look
silent between its renewals). PostgreSQL needs none of this: the database server's
clock judges every lease (`_pg_txn`), one clock for every process.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from ._txn import Lease, Txn

__all__ = ["LeaseSightings", "lease_rows"]


async def lease_rows(q: Txn, shards: Iterable[int]) -> dict[int, Lease | None]:
    """{shard: (owner, epoch, expires_at) or None} of `shards` (a read)."""
    found: dict[int, Lease | None] = dict.fromkeys(shards)
    listed = ",".join(str(int(s)) for s in sorted(found))  # ints only: safe inline
    rows = await q.fetchall("SELECT shard, owner, epoch, expires_at FROM leases "
                            f"WHERE shard IN ({listed})")
    found.update({r[0]: (r[1], r[2], r[3]) for r in rows})
    return found


class LeaseSightings:
    """Each lease row as this store last saw it, and when it first saw it so."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[Lease, float]] = {}

    def stale(self, rows: Mapping[int, Lease | None], term: float) -> dict[int, Lease]:
        """Record `rows` as seen now; return those seen unchanged for `term` seconds."""
        now = time.monotonic()
        stale: dict[int, Lease] = {}
        for shard, row in rows.items():
            seen = self._seen.get(shard)
            if row is None:
                self._seen.pop(shard, None)
            elif seen is None or seen[0] != row:
                self._seen[shard] = (row, now)
            elif now - seen[1] >= term:
                stale[shard] = row
        return stale
