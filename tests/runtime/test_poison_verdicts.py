"""`_poison` decides and writes nothing: applying an entry on a live host returns a
verdict (`Applied`, `Poisoned`) that the activation acts on. These run the decision
alone, on an entity built with a read-only context: no store, no shard, no activation.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel

import corral
from corral.persistence import EntryKind, JournalEntry, UpdateOutcome
from corral.runtime.host._apply import ReplicaContext, instantiate
from corral.runtime.host._poison import Applied, Poisoned, apply_live


class Item(BaseModel):
    v: int


class Picky(corral.Entity):
    """Raises for odd items; counts every call."""

    retry = corral.RetryPolicy(max_attempts=3, initial_backoff=0.001, max_backoff=0.002)
    calls: ClassVar[list[int]] = []

    def __init__(self) -> None:
        self.total = 0

    @corral.signal
    def add(self, it: Item) -> None:
        type(self).calls.append(it.v)
        if it.v % 2:
            raise ValueError(f"odd item {it.v}")
        self.total += it.v

    @corral.update
    def take(self, it: Item) -> int:
        if it.v % 2:
            raise ValueError(f"odd item {it.v}")
        self.total -= it.v
        return self.total


DEFINITION = Picky._corral_definition


def entry(kind: EntryKind, name: str, payload: str, seq: int = 1) -> JournalEntry:
    return JournalEntry("Picky", "k", seq, 1, kind, name, f"m-{seq}", payload, None, 0.0)


def picky() -> Picky:
    entity = instantiate(DEFINITION, None, ReplicaContext("Picky", "k", 1))
    assert isinstance(entity, Picky)
    return entity


async def test_a_signal_whose_handler_returns_is_applied_with_no_outcome() -> None:
    entity = picky()
    assert await apply_live(DEFINITION, entity, entry(EntryKind.SIGNAL, "add", '{"v": 2}')) \
        == Applied()
    assert entity.total == 2


async def test_a_signal_whose_handler_keeps_raising_is_a_dead_letter_after_every_attempt(
) -> None:
    Picky.calls.clear()
    verdict = await apply_live(DEFINITION, picky(), entry(EntryKind.SIGNAL, "add", '{"v": 3}'))
    assert isinstance(verdict, Poisoned)
    assert (verdict.attempts, verdict.error, verdict.outcome) == (
        3, "ValueError: odd item 3", None)
    assert "raise ValueError" in verdict.traceback
    assert Picky.calls == [3, 3, 3]


async def test_an_update_is_applied_with_its_outcome_and_never_retried() -> None:
    entity = picky()
    good = await apply_live(DEFINITION, entity, entry(EntryKind.UPDATE, "take", '{"v": 4}'))
    assert good == Applied(UpdateOutcome("-4", None))
    bad = await apply_live(DEFINITION, entity, entry(EntryKind.UPDATE, "take", '{"v": 1}'))
    assert bad == Applied(UpdateOutcome(None, "ValueError: odd item 1"))


async def test_an_entry_this_code_cannot_apply_is_a_dead_letter_with_no_attempt() -> None:
    unknown = await apply_live(DEFINITION, picky(), entry(EntryKind.SIGNAL, "gone", "{}"))
    assert isinstance(unknown, Poisoned)
    assert (unknown.attempts, unknown.outcome) == (0, None)
    assert "no signal handler 'gone'" in unknown.error
    refused = await apply_live(DEFINITION, picky(), entry(EntryKind.UPDATE, "take", '{"v": "x"}'))
    assert isinstance(refused, Poisoned)
    assert refused.attempts == 0
    assert refused.outcome is not None
    assert refused.outcome.error == f"DeadLettered: {refused.error}"
