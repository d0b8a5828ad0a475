"""Shared fixtures. SQLite files live under tmp_path; nothing touches the home directory."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


@pytest.fixture
def db_path(tmp_path: Path) -> str:
    """A fresh store file for one test."""
    return str(tmp_path / "corral.db")


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
