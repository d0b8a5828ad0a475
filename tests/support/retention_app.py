"""The application of `tests/operators/test_cli_purge.py` (`--app retention_app:app`):
`Brief` keeps its closed runs half a second, `Kept` forever."""

from __future__ import annotations

import corral
from entities import Inbox

__all__ = ["Brief", "Kept", "app"]


class Brief(Inbox):
    retention = corral.Retention(closed_for=0.5)


class Kept(Inbox):
    pass


app = [Brief, Kept]
