"""Values the client API returns, and decoding of stored JSON results."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, TypeAdapter
from pydantic_core import to_jsonable_python

from corral._common import RunStatus
from corral.persistence import canonical_json

__all__ = ["Ack", "EntityDescription", "RunSummary", "decode_value", "encode_value"]


@dataclass(frozen=True, slots=True)
class Ack:
    """The answer to a send, given only after the message is durably committed.

    Attributes:
        status: `"accepted"` for a new message, `"duplicate"` when its message id was
            accepted before (then `run_id` and `seq` are the original acceptance's).
        run_id: the run the message was delivered to.
        seq: the message's position in the entity's journal.
        started: whether this call started the run.
    """

    status: Literal["accepted", "duplicate"]
    run_id: int
    seq: int
    started: bool


@dataclass(frozen=True, slots=True)
class RunSummary:
    """One run of an entity, as `EntityDescription.runs` lists it (oldest first)."""

    run_id: int
    status: RunStatus
    started_at: float
    closed_at: float | None
    error: str | None
    continued_from: int | None = None


@dataclass(frozen=True, slots=True)
class EntityDescription:
    """A snapshot of an entity's state as the store and (if hosted here) its host see it.

    `status` is `RunStatus.NEVER_STARTED` (with `run_id` 0 and no runs) for an entity
    that never ran. `hosted_here` says whether the process answering holds a live
    activation of the entity: this process on the local backend, the entity's shard (or
    dedicated) actor on the Ray backend, which answers `describe`. `applied_seq` and
    `mailbox_depth` come from that live activation and are None without one (a
    passivated entity, one hosted by another process, or a run that has closed: a
    completed run applied everything accepted before it closed).
    """

    entity_type: str
    key: str
    shard: int
    status: RunStatus
    run_id: int
    accepted_seq: int
    applied_seq: int | None
    mailbox_depth: int | None
    hosted_here: bool
    runs: tuple[RunSummary, ...]


def encode_value(value: Any) -> str:
    """JSON for a handler's return value (models anywhere inside, by their JSON dump)."""
    if isinstance(value, BaseModel):
        return value.model_dump_json(by_alias=True)
    return canonical_json(to_jsonable_python(value, by_alias=True))


@functools.lru_cache(maxsize=256)
def _adapter(expected: Any) -> TypeAdapter[Any]:
    return TypeAdapter(expected)


def decode_value(text: str | None, expected: Any) -> Any:
    """Inverse of `encode_value`: rebuild the annotated return type (models, lists of them)."""
    if text is None:
        return None
    if expected is None or expected is Any or expected is type(None):
        return json.loads(text)
    try:
        return _adapter(expected).validate_json(text)
    except TypeError:  # an annotation pydantic cannot adapt (or not hashable): plain JSON
        return json.loads(text)
