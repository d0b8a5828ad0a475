"""Shared fixtures. SQLite files live under tmp_path; nothing touches the home directory.

The tests mirror the layers of `src/corral`: `actors/` (definitions, typing, state
versions and upgrades), `persistence/` (the store: `test_store_contract.py` runs every
store op on both engines; the engine-specific tests say their engine in their name),
`runtime/` (hosts, activations, the client, on both stores), `ray/` (the Ray backend),
`operators/` (the `corral` command, the dashboard, metrics, lifecycle logs) and
`examples/` (the examples, the README's and docs' snippets, the peers benchmark). Every helper
module and worker script is in `support/`, which this file puts on `sys.path`: tests
import helpers by name (`from stores import sql`), as worker scripts run by path do
(their own folder is on their `sys.path`; `procs.Worker` adds `support/` to a
subprocess's `PYTHONPATH`).

`db_path` is where a test's store lives, and every test that takes it runs once per
store: `[sqlite]`, a fresh file under `tmp_path`, and `[postgres]`, a database on the
session's PostgreSQL cluster (`tests/support/pg.py`, started only if a test asks for it),
emptied before the test. Reading a store directly goes through `tests/support/stores.py`, which
takes either location. Tests about SQLite itself (its schema migrations, a schema-1 file
made by an earlier corral) make their own file under `tmp_path`.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

SUPPORT = str(Path(__file__).resolve().parent / "support")
if SUPPORT not in sys.path:  # the helpers, imported by name as worker scripts import them
    sys.path.insert(0, SUPPORT)

from pg import _unavailable, create_database, find_bindir  # noqa: E402
from pg import postgres_url as cluster_fixture  # noqa: E402, F401 (a fixture, found by name)
from stores import reset_postgres  # noqa: E402

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

STORES = ("sqlite", "postgres")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run every test that takes `db_path` on both stores, except the Ray suites
    (`test_ray_*.py`), which stay on SQLite (a Ray test on PostgreSQL uses `pg_url`)."""
    if "db_path" in metafunc.fixturenames and \
            not metafunc.module.__name__.startswith("test_ray_"):
        metafunc.parametrize("db_path", STORES, indirect=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test by what it runs on, from the fixtures it uses: `postgres` (the
    session's PostgreSQL server) and `ray` (the session's Ray instance). scripts/check
    runs them all; scripts/test-versions leaves them out on the other Python versions,
    but for those marked `every_version`."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)
        # `db_path` and test_dashboard.py's module fixture take a store by param
        on_postgres = callspec is not None and "postgres" in callspec.params.values()
        if on_postgres or "postgres_url" in names:  # pg_url and the store URL need it
            item.add_marker(pytest.mark.postgres)
        if "ray_address" in names:
            item.add_marker(pytest.mark.ray)


@pytest.fixture(scope="session")
def postgres_store_url(postgres_url: str) -> str:
    """The one database on the session's cluster that `db_path` empties for each test
    (`stores.reset_postgres`: ~10 ms, where creating a database takes ~200 ms)."""
    bindir, port = find_bindir(), urlsplit(postgres_url).port
    assert bindir is not None  # postgres_url skipped otherwise
    assert port is not None
    return create_database(bindir, port, "corral_store")


@pytest.fixture
def db_path(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where this test's store lives, fresh and empty: a SQLite file under `tmp_path`
    (`[sqlite]`), or a `postgresql://` URL (`[postgres]`)."""
    if getattr(request, "param", "sqlite") == "sqlite":
        return str(tmp_path / "corral.db")
    if importlib.util.find_spec("asyncpg") is None:
        _unavailable("asyncpg is not installed: `pip install -e '.[dev]'`")
    url: str = request.getfixturevalue("postgres_store_url")
    reset_postgres(url)
    return url


# -- Ray: one instance for the whole session (ray.init costs seconds; see RAY_NOTES) ---


@pytest.fixture(scope="session")
def ray_address() -> Iterator[str]:
    """Start one local Ray instance for the session; yields its GCS address.

    Loopback only, no dashboard, its session files in a short temp dir (Ray's socket
    paths must stay under ~107 bytes) removed afterwards; `tests/` is on the workers'
    `PYTHONPATH`, so shard actors import the test entity modules by name.
    """
    import shutil
    import tempfile

    import ray

    from ray_workers import RUNTIME_ENV

    temp = tempfile.mkdtemp(prefix="corral-ray-")
    os.environ["RAY_TMPDIR"] = temp
    context = ray.init(_node_ip_address="127.0.0.1", include_dashboard=False,
                       _temp_dir=temp, runtime_env=RUNTIME_ENV, namespace="corral-tests",
                       log_to_driver=False)
    try:
        yield str(context.address_info["gcs_address"])
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
