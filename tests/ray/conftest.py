"""Fixtures of the Ray tests (the session's Ray instance is `tests/conftest.py`'s)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from corral.runtime.ray._connection import stop_hosts


@pytest.fixture
def namespace(ray_address: str) -> Iterator[str]:
    """A deployment of its own; its actors are stopped (leases released) afterwards."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    yield name
    stop_hosts(name)
