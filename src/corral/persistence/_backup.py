"""A store as a file (`backup`) and back (`restore`): the copy of `_migrate`, into and
out of a SQLite corral store, the portable format (its `meta` says what it is:
`backup.format`, `backup.engine`, `backup.source`, `backup.taken_at`).

A backup reads a live store in one snapshot (its hosts go on) and claims nothing; a
restore claims its target like `migrate` does (until a restore into it completes).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path

from corral._errors import InvalidArgumentError, StoreError

from ._copy_ends import open_end
from ._copy_plan import META
from ._existing import stored_shards
from ._migrate import (
    Copied,
    CopyProgress,
    _check_batch,
    _check_target,
    _claimed_copy,
    _copy,
    _identity,
    _nothing,
    _where,
    refuse_partial,
)
from ._open import open_store
from ._schema import SCHEMA_VERSION as SQLITE_SCHEMA_VERSION
from ._schema import parse_schema_version

__all__ = ["BACKUP_FORMAT", "backup", "restore"]

BACKUP_FORMAT = 1
"""The version of the backup file's format (a SQLite corral store; `backup.*` meta)."""


async def backup(store: str, file: str | Path, *, batch: int = 1000,
                 progress: CopyProgress | None = None) -> Copied:
    """Copy the store at `store`, live (its hosts go on), as it is at one instant into a
    new file `file`: a SQLite corral store whose `meta` says `backup.format` (this
    format's version, `BACKUP_FORMAT`), `backup.engine`, `backup.source` and
    `backup.taken_at`. `restore` copies it into a store.

    Raises:
        InvalidArgumentError: `file` exists; `store` is not a corral store.
        StoreError: `store` is at another schema version than this corral's.
    """
    _check_batch(batch)
    path = os.fspath(file)
    if os.path.lexists(path):  # noqa: ASYNC240 (one stat, before any work)
        raise InvalidArgumentError(f"backup file {path!r} exists: name a new file")
    shards = await stored_shards(store)
    taken_at = time.time()
    async with AsyncExitStack() as stack:
        src = await open_end(store, readonly=True)
        stack.push_async_callback(src.close)
        await refuse_partial(src)  # before the file is made
        await (await open_store(path, shards=shards)).close()
        dst = await open_end(path)
        stack.push_async_callback(dst.close)
        state = await _check_target(dst, _identity(store), resume=False)
        copied = await _copy(src, dst, state, batch=batch, progress=progress,
                             on_batch=_nothing)
        await dst.write(META, ("k", "v"), [
            ("backup.format", str(BACKUP_FORMAT)), ("backup.engine", src.engine),
            ("backup.source", _where(store)), ("backup.taken_at", repr(taken_at))], None)
    return copied


async def restore(file: str | Path, store: str, *, batch: int = 1000, resume: bool = False,
                  progress: CopyProgress | None = None) -> Copied:
    """Copy the backup `file` (`backup`) into the empty store at `store` (created if
    missing, with the backup's shard count), claimed meanwhile like `migrate`'s target.
    The file is never written: one of an older schema is brought to this corral's on a
    temporary copy.

    Raises:
        StoreError: the backup was written by a newer corral (schema or format).
        InvalidArgumentError: `file` is not a corral backup; `store` holds data.
        ShardCountError: `store` exists with another shard count (both named).
        StoreHostedElsewhereError: a live host holds `store`.
    """
    _check_batch(batch)
    path = os.fspath(file)
    shards = await stored_shards(path, any_version=True)
    meta = await _file_meta(path)
    version = parse_schema_version(meta.get("schema_version", "1"), repr(path))
    fmt = parse_schema_version(meta.get("backup.format", "1"), repr(path))
    if version > SQLITE_SCHEMA_VERSION or fmt > BACKUP_FORMAT:
        raise StoreError(
            f"backup {path!r} has schema version {version} (format {fmt}), written by a "
            f"newer corral; this corral reads schema versions up to "
            f"{SQLITE_SCHEMA_VERSION} (format {BACKUP_FORMAT}): upgrade corral to restore it")
    with tempfile.TemporaryDirectory(prefix="corral-restore-") as temp:
        if version < SQLITE_SCHEMA_VERSION:
            upgraded = os.path.join(temp, "backup.db")
            shutil.copyfile(path, upgraded)
            await (await open_store(upgraded, shards=shards)).close()
            path = upgraded
        return await _claimed_copy(path, store, shards, "restore", claim=None,
                                   batch=batch, resume=resume, progress=progress,
                                   on_batch=_nothing, named=_identity(os.fspath(file)))
    raise AssertionError("unreachable")


async def _file_meta(path: str) -> dict[str, str]:
    end = await open_end(path, readonly=True)
    try:
        return await end.meta()
    finally:
        await end.close()

