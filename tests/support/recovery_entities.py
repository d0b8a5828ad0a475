"""The entities of tests/runtime/test_recovery_order.py, shared with its worker process
(`recovery_worker.py`): both register the same names against the shared store."""

from __future__ import annotations

import corral
from corral.metrics import REGISTRY

SEEN_AT_APPLY: list[int] = []
"""`Idle` activations this process had loaded when a `Ledger` applied a signal here."""


def idle_activations() -> int:
    """`Idle` entities this process loaded so far (`corral_activations_total`)."""
    return int(REGISTRY.get_sample_value("corral_activations_total",
                                         {"entity_type": "Idle"}) or 0)


class Idle(corral.Entity):
    """A running entity with nothing pending once it applied its start and one poke."""

    def __init__(self) -> None:
        self.pokes = 0

    @corral.signal
    def poke(self) -> None:
        self.pokes += 1


class Ledger(corral.Entity):
    """The entity with a backlog: its handler notes how far the recovery had got."""

    def __init__(self) -> None:
        self.notes = 0

    @corral.signal
    def note(self) -> None:
        self.notes += 1
        SEEN_AT_APPLY.append(idle_activations())

    @corral.query
    def count(self) -> int:
        return self.notes
