"""The journal positions a SQLite store committed itself, so that its host's tail does
not read back what its own process had in hand when it committed.

A store's commits are recorded as position ranges (first, last]: every position in one
was written by that one transaction of this store (AUTOINCREMENT positions, one writer
at a time holds the file). A tail at `pos` may then jump over a range that starts at or
before `pos` (nothing foreign lies between), and leaves the ranges further on out of
its read. A range not recorded (too many, or committed before another process was seen
sharing the file) is only read again, as before: skipping is never needed for
correctness, and a position is skipped only if this store committed it.
"""

from __future__ import annotations

import collections
import sqlite3

__all__ = ["OwnCommits"]

_KEPT = 4096  # ranges remembered; the oldest are forgotten (then read again, harmless)
_EXCLUDED = 32  # ranges left out of one tail read by its SQL (later ones are read)


class OwnCommits:
    """The position ranges of this store's commits, appended by its writer thread and
    read by the event loop's tail (a deque's append and copy are each atomic)."""

    def __init__(self) -> None:
        self._ranges: collections.deque[tuple[int, int]] = collections.deque(maxlen=_KEPT)

    @staticmethod
    def last_position(db: sqlite3.Connection) -> int:
        """The journal's last position handed out (in the writer's transaction)."""
        row = db.execute("SELECT seq FROM sqlite_sequence WHERE name='journal'").fetchone()
        return 0 if row is None else int(row[0])

    def committed(self, first: int, last: int) -> None:
        """This store committed positions (first, last] (called after its COMMIT)."""
        if last > first:
            self._ranges.append((first, last))

    def ahead(self, pos: int) -> tuple[int, list[tuple[int, int]]]:
        """`pos` moved over this store's ranges that start at or before it, and the
        ranges after it (in order): what a tail read at that position leaves out."""
        ranges = list(self._ranges)  # one atomic copy, whatever the writer appends
        while self._ranges and self._ranges[0][1] <= pos:  # behind every tail: forget
            self._ranges.popleft()
        later = []
        for first, last in ranges:
            if first <= pos:
                pos = max(pos, last)
            else:
                later.append((first, last))
        return pos, later[:_EXCLUDED]
