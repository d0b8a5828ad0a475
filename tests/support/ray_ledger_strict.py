"""A release of `ray_workers.Ledger` whose entries refuse amounts below 2 (a validator:
the same schema, handlers and state fields, so the manifests are compatible, but a
stored snapshot holding an amount of 1 no longer restores). For `deploy`'s
`check_snapshots` (`tests/ray/test_ray_deploy.py`)."""

from __future__ import annotations

from pydantic import BaseModel, field_validator

import corral
from ray_workers import Start


class Entry(BaseModel):
    amount: int

    @field_validator("amount")
    @classmethod
    def _at_least_two(cls, amount: int) -> int:
        if amount < 2:
            raise ValueError("an amount is at least 2")
        return amount


class Ledger(corral.Entity):
    snapshots = corral.SnapshotPolicy(every=2, keep=1)
    entries: list[Entry]

    def __init__(self, init: Start) -> None:
        self.entries = []

    @corral.signal
    def book(self, entry: Entry) -> None:
        self.entries.append(entry)
