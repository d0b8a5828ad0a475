"""OS file locks beside shard leases: the kernel tells at once that a holder died.

A host that holds a shard's lease also holds an exclusive `flock` on that shard's lock
file (`<store>-leases/shard-<k>.lock`). The kernel releases it the moment the process
dies, however it dies, so a process that obtains the lock knows no live process holds
the lease *with its lock*, and takes the lease at a new epoch at once instead of
waiting for it to expire. Epoch fencing stays the safety net: a holder that is alive
but hung keeps its lock, and is replaced only when its lease expires.

`flock` locks belong to an open file description: two stores opened in one process
exclude each other, and the descriptors are not inherited across `exec` (a process
that forks without exec shares them, and then the child holds the lock too).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from corral._errors import StoreError

__all__ = ["LeaseLocks"]


class LeaseLocks:
    """The shard lock files of one store, and which of them this store holds."""

    def __init__(self, store_path: str) -> None:
        self._dir = Path(f"{store_path}-leases")
        self._held: dict[int, int] = {}  # shard -> file descriptor holding its lock

    def try_lock(self, shard: int) -> bool:
        """Take the shard's lock if no live process holds it (never blocks).

        Raises:
            StoreError: the lock file cannot be opened or created (its cause the OS
                error): no space or inodes left, no permission, something in the way.
        """
        if shard in self._held:
            return True
        fd = self._open(self._dir / f"shard-{shard}.lock")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._held[shard] = fd
        return True

    def _open(self, path: Path) -> int:
        try:
            self._dir.mkdir(exist_ok=True)
            return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise StoreError(
                f"cannot create the lease lock file {str(path)!r}: {err}; the store keeps "
                f"one lock file per shard in {str(self._dir)!r}, beside the store: make it "
                "a directory this process can write, on a file system with free space and "
                "inodes") from err

    def unlock(self, shard: int) -> None:
        fd = self._held.pop(shard, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def unlock_all(self) -> None:
        for shard in list(self._held):
            self.unlock(shard)

    def holds(self, shard: int) -> bool:
        return shard in self._held
