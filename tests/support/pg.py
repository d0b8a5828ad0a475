"""A throwaway PostgreSQL cluster for the test session (`postgres_url`), and helpers.

A plain module, like `procs`: a test module or a conftest imports the fixtures
`postgres_url` (session) and `pg_url` (a fresh database per test; it needs
`postgres_url` imported too), under any name: they are registered by their own names,
so `from pg import pg_url as pg_fixture` keeps a test's `pg_url` parameter from
shadowing the import. The cluster (`pg_server`) is stopped at the end of the session.

Without the binaries the tests that use the fixture are skipped with a line saying how
to install them, unless `CORRAL_REQUIRE_POSTGRES=1`, which turns the skip into a failure.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from pg_server import (
    INSTALL_HINT,
    SUPERUSER,
    ServerUnavailable,
    find_bindir,
    make_dir,
    reap_stale,
    remove,
    run_as_postgres,
    start,
)

__all__ = [
    "create_database",
    "find_bindir",
    "pg_url",
    "postgres_url",
    "restart_postgres",
    "run_as_postgres",
]

_PREFIX = "corral-pg-"
_CLUSTERS: dict[int, Path] = {}  # port -> temp dir of a cluster this session started


def _unavailable(why: str) -> None:
    if os.environ.get("CORRAL_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"CORRAL_REQUIRE_POSTGRES=1 but {why}", pytrace=False)
    pytest.skip(why)


def create_database(bindir: Path, port: int, name: str | None = None) -> str:
    """Create a fresh database on the session cluster; its `postgresql://` URL."""
    name = name or f"corral_{uuid.uuid4().hex[:12]}"
    run_as_postgres(bindir / "createdb", "-h", "127.0.0.1", "-p", str(port), "-U", SUPERUSER,
                    name)
    return f"postgresql://{SUPERUSER}@127.0.0.1:{port}/{name}"


@pytest.fixture(scope="session", name="postgres_url")
def postgres_url() -> Iterator[str]:
    """Start a PostgreSQL cluster for the session; yields the URL of a fresh database.

    Tests that need a database of their own (most do) use `pg_url` instead.
    """
    bindir = find_bindir()
    if bindir is None:
        _unavailable(INSTALL_HINT)
        raise AssertionError("unreachable")
    try:
        reap_stale(bindir, _PREFIX)
        temp = make_dir(_PREFIX)
    except ServerUnavailable as err:
        _unavailable(str(err))
        raise
    try:
        port = start(bindir, temp, settings="-c max_connections=300 -c shared_buffers=64MB")
        _CLUSTERS[port] = temp
        yield create_database(bindir, port, "corral")
    finally:
        remove(bindir, temp)


def restart_postgres(url: str) -> None:
    """Restart the session's cluster that serves `url` (fast: every connection drops)."""
    bindir, port = find_bindir(), urlsplit(url).port
    assert bindir is not None
    assert port in _CLUSTERS, f"{url} is not a cluster of this session"
    temp = _CLUSTERS[port]
    run_as_postgres(bindir / "pg_ctl", "restart", "-D", temp / "data", "-m", "fast", "-w",
                    "-t", "60", "-l", temp / "server.log")


@pytest.fixture(name="pg_url")
def pg_url(postgres_url: str) -> str:
    """A fresh, empty database on the session cluster for one test; its URL."""
    bindir = find_bindir()
    assert bindir is not None  # postgres_url skipped otherwise
    port = urlsplit(postgres_url).port
    assert port is not None
    return create_database(bindir, port)
