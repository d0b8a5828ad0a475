"""Shared fixtures. SQLite files live under tmp_path; nothing touches the home directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


@pytest.fixture
def db_path(tmp_path: Path) -> str:
    """A fresh store file for one test."""
    return str(tmp_path / "corral.db")
