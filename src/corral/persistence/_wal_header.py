"""`WalHeader`: whether any connection may have committed to a SQLite file since the
last look, for the price of one `pread` (no statement, no thread hop).

An idle host polls for other processes' commits every few milliseconds
(`SqliteStore.foreign_commit_seen`); asking SQLite (`PRAGMA data_version`, in the
writer's thread) was 200 of an idle host's 213 statements a second. Every commit in
WAL mode rewrites the wal-index header at the start of the `-shm` file (its change
counter `iChange`, the last frame `mxFrame`, the salts and checksum: sqlite.org
"walformat.html", section 2.1), which every connection maps shared, so reading its
first 48 bytes tells "unchanged since the last look: nobody committed". Only when they
changed (or at least every `RECHECK` seconds, the safety net: a file whose `-shm` is
missing or unreadable, say) does the poll ask SQLite, whose answer stays the truth
(`data_version` tells another connection's commit from this one's own). A foreign
commit is seen at the same poll as before: the bound on a message's pickup is unchanged.
"""

from __future__ import annotations

import contextlib
import os
import time

__all__ = ["RECHECK", "WalHeader"]

RECHECK = 1.0
"""Seconds after which the poll asks SQLite even if the header looked unchanged."""

_HEADER = 48  # bytes: the first copy of the wal-index header


class WalHeader:
    """The wal-index header of the SQLite file at `path`, as last read."""

    def __init__(self, path: str) -> None:
        self._path = f"{path}-shm"
        self._fd: int | None = None
        self._last = b""
        self._asked = 0.0  # monotonic time `changed` last answered True

    def changed(self) -> bool:
        """Whether a commit may have happened since the last call that answered True."""
        now = time.monotonic()
        header = self._read()
        if header and header == self._last and now - self._asked < RECHECK:
            return False
        self._last, self._asked = header, now
        return True

    def _read(self) -> bytes:
        try:
            if self._fd is None:
                self._fd = os.open(self._path, os.O_RDONLY)
            return os.pread(self._fd, _HEADER, 0)
        except OSError:  # not there yet, or gone: ask SQLite
            self.close()
            return b""

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
