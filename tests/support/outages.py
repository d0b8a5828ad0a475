"""Real store outages a test can begin and end: a full disk under a SQLite file, a
PostgreSQL database that refuses every connection, a PostgreSQL crash restart.

No fake store: the SQLite file lives on a small tmpfs mounted over the test's
`tmp_path` (so `db_path` stays where it always is) and the disk is filled with a real
file until the kernel answers ENOSPC; PostgreSQL's database is closed to connections
(`ALLOW_CONNECTIONS false`) and every session on it terminated, from the server's
maintenance database. Mounting needs root (CI runs as root); elsewhere the SQLite
variant is skipped with a line saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from stores import is_postgres

__all__ = ["Outage", "outage_for"]

_FILL_CHUNK = 64 * 1024


class Outage:
    """One store's outage: `begin()` makes every write fail, `end()` heals it."""

    async def begin(self) -> None:
        raise NotImplementedError

    async def end(self) -> None:
        raise NotImplementedError


class FullDisk(Outage):
    """The filesystem under a SQLite store, filled to the last byte."""

    def __init__(self, mount: Path) -> None:
        self._filler = mount / "filler"

    async def begin(self) -> None:
        await asyncio.to_thread(self._fill)

    def _fill(self) -> None:
        chunk = b"\0" * _FILL_CHUNK
        with open(self._filler, "wb", buffering=0) as f:
            size = _FILL_CHUNK
            while size:  # down to single bytes: not one block may stay free
                try:
                    f.write(chunk[:size])
                except OSError:
                    size //= 2

    async def end(self) -> None:
        self._filler.unlink(missing_ok=True)


class ClosedDatabase(Outage):
    """A PostgreSQL database that refuses connections, its sessions terminated."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self._name = parts.path.lstrip("/")
        self._admin = urlunsplit(parts._replace(path="/postgres"))

    async def _run(self, *statements: str) -> None:
        conn = await asyncpg.connect(self._admin)
        try:
            for statement in statements:
                await conn.execute(statement)
        finally:
            await conn.close()

    async def begin(self) -> None:
        await self._run(
            f'ALTER DATABASE "{self._name}" ALLOW_CONNECTIONS false',
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            f"WHERE datname = '{self._name}'")

    async def end(self) -> None:
        await self._run(f'ALTER DATABASE "{self._name}" ALLOW_CONNECTIONS true')


@contextlib.contextmanager
def outage_for(db_path: str, tmp_path: Path) -> Iterator[Outage]:
    """The outage of the store `db_path` names (a SQLite file under `tmp_path`, mounted
    on a 16 MiB tmpfs for the duration, or a PostgreSQL URL). Use it from a sync
    fixture: healing the database at teardown runs its own event loop."""
    if is_postgres(db_path):
        outage = ClosedDatabase(db_path)
        try:
            yield outage
        finally:  # never leave the session's database closed for the next test
            asyncio.run(outage.end())
        return
    if os.geteuid() != 0:
        pytest.skip("a full disk is a tmpfs mount: run as root (CI does)")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(tmp_path)],
                   check=True)
    try:
        yield FullDisk(tmp_path)
    finally:
        subprocess.run(["umount", "-l", str(tmp_path)], check=True)
