"""The application of `tests/operators/test_cli_purge.py` (`--app retention_app:app`):
`Brief` keeps its closed runs half a second, `Kept` forever. `refusing` is the same
application with an `authorize` hook that refuses every call, noting each in `ASKED`."""

from __future__ import annotations

import corral
from entities import Inbox

__all__ = ["ASKED", "Brief", "Kept", "app", "refusing"]


class Brief(Inbox):
    retention = corral.Retention(closed_for=0.5)


class Kept(Inbox):
    pass


app = [Brief, Kept]

ASKED: list[corral.AuthRequest] = []
"""What `refusing`'s hook was asked, in this process."""


def refuse(request: corral.AuthRequest) -> bool:
    ASKED.append(request)
    return False


refusing = corral.App(entities=app, authorize=refuse)
