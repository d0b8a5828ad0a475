"""Opening a SQLite store whose lease lock files cannot be made (issue 21, item 5).

A host takes an OS lock per shard in `<store>-leases/` (`persistence/_locks.py`). When
that file cannot be created (no inodes left, something else in the way) `open_runtime`
fails with a `StoreError` saying which file and what to fix, its cause the OS error;
before, the `OSError` itself escaped. PostgreSQL has no lock files (advisory locks).
"""

from __future__ import annotations

import contextlib
import errno
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import corral
from entities import Ticket


@contextlib.contextmanager
def lock_directory_without_free_inodes(store: Path, where: Path) -> Iterator[None]:
    """`store`'s lock directory made a link to a tmpfs mounted at `where` with no
    inode left. Skips the test where mounting is not allowed (it needs root)."""
    where.mkdir()
    try:  # two inodes: the root of the mount and the directory
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,nr_inodes=2", "corral-test",
                        str(where)], check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as err:
        pytest.skip(f"cannot mount a tmpfs here (root needed): {err}")
    try:
        (where / "leases").mkdir()
        Path(f"{store}-leases").symlink_to(where / "leases")
        yield
    finally:
        subprocess.run(["umount", str(where)], check=True)


def put_a_file_in_the_way(path: Path) -> None:
    path.write_text("not a directory")


async def open_and_close(store: Path) -> None:
    async with corral.open_runtime(str(store), entities=[Ticket], shards=2):
        pass


async def test_a_lease_lock_file_that_cannot_be_created_for_want_of_inodes_fails_the_open_with_a_store_error(  # noqa: E501
    tmp_path: Path,
) -> None:
    store = tmp_path / "store.db"
    with (lock_directory_without_free_inodes(store, tmp_path / "full"),
          pytest.raises(corral.StoreError, match="cannot create the lease lock file") as caught):
        await open_and_close(store)
    assert isinstance(caught.value.__cause__, OSError)
    assert caught.value.__cause__.errno == errno.ENOSPC
    assert "shard-" in str(caught.value)  # which file
    assert "inodes" in str(caught.value)  # what to fix


async def test_a_file_in_the_way_of_the_lease_lock_directory_fails_the_open_with_a_store_error(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store.db"
    put_a_file_in_the_way(Path(f"{store}-leases"))
    with pytest.raises(corral.StoreError, match="cannot create the lease lock file") as caught:
        await open_and_close(store)
    assert isinstance(caught.value.__cause__, OSError)
    assert f"{store}-leases" in str(caught.value)
