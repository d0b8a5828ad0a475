"""The client boundary: every check that happens before anything is stored.

Untrusted input stops here with a typed error: unknown types or handlers, bad keys,
payloads that fail their model, are too large or are not JSON, and senders the
`authorize` hook rejects.
"""

from __future__ import annotations

import inspect
import os
import re
import struct
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from corral._common import RunStatus
from corral._errors import (
    InvalidArgumentError,
    InvalidKeyError,
    InvalidPayloadError,
    UnauthorizedError,
    UnknownEntityTypeError,
    UnknownHandlerError,
)
from corral.actors import (
    EntityDefinition,
    HandlerDefinition,
    HandlerKind,
    SignalWait,
    WaitDefinition,
)
from corral.persistence import DERIVED_ID_PREFIXES

from .._payloads import encode_model, encode_start

__all__ = [
    "AuthRequest",
    "Authorize",
    "Boundary",
    "Limits",
    "check_dead_letter_id",
    "check_limit",
    "check_timeout",
    "new_message_id",
]

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_FORBIDDEN = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")  # either, in one search


@dataclass(frozen=True, slots=True)
class Limits:
    """Input limits enforced at the client boundary.

    Attributes:
        max_payload_bytes: largest canonical JSON payload or start input (256 KiB).
        max_key_length: longest entity key, message id, update id or sender, in
            characters.
        key_pattern: regular expression a whole entity key must match.
        max_delivery_key_bytes: longest idempotency key of a `deliver`, in UTF-8 bytes.
    """

    max_payload_bytes: int = 256 * 1024
    max_key_length: int = 256
    key_pattern: str = r"[A-Za-z0-9][A-Za-z0-9_.:@/+=#-]*"
    max_delivery_key_bytes: int = 512


@dataclass(frozen=True, slots=True)
class AuthRequest:
    """What the `authorize` hook sees. `sender` is what the caller *claims*.

    `kind` says what the call does, `name` which handler, wait or read:

    - writes to one entity: "start", "signal", "update", "deliver" (`name`: the
      wait), "terminate", "resume", "replay", "discard" (a dead letter);
    - "query": a query handler;
    - "read": a read of what is stored, `name` saying which: "describe", "history",
      "state", "result" and "dead_letters" of one entity; "entities", "signal_waits",
      "dead_letters" and "purgeable" (`corral purge --dry-run`) across entities, with
      `key` "" (and `entity_type` "" when not given one type);
    - "purge": deleting a type's closed runs past its retention (`corral purge`;
      `key` is "");
    - "schedule": a write to a schedule of `entity_type` `key` (its target), `name`
      the operation: "create", "update", "pause", "resume", "delete", "trigger",
      "backfill" (`Runtime.schedules`); reading schedules is "read", "schedules".

    A read or a purge records nothing, so only a refusal (False, or
    `UnauthorizedError`) matters there: a returned sender is checked and dropped.
    """

    sender: str | None
    entity_type: str
    key: str
    kind: str
    name: str


Authorize = Callable[[AuthRequest], "str | bool | Awaitable[str | bool | None] | None"]
"""Returns the authenticated sender to record (None for anonymous); raising
`UnauthorizedError` or returning False rejects the call."""


def new_message_id() -> str:
    """A time-ordered id (keeps the dedupe index append-mostly) with 64 random bits."""
    try:
        (bits,) = next(_random_words)
    except StopIteration:
        bits = _refill()
    return f"{time.time_ns():016x}-{bits:016x}"


# The random bits come from os.urandom 4 KiB at a time, not 8 bytes a call: every call
# of os.urandom is a system call that releases the GIL, so a host's event loop handed the
# GIL to its store's writer thread once per message and waited to get it back (10,000
# entities, 1,000 senders: 12% fewer acks/s). `next()` on a C iterator is atomic under
# the GIL, so two threads never take the same word; two threads that both find it empty
# each start a buffer of their own. A forked child must not repeat its parent's words.
_random_words: Iterator[tuple[int]] = iter(())


def _refill() -> int:
    global _random_words
    words = struct.iter_unpack("<Q", os.urandom(4096))
    (bits,) = next(words)
    _random_words = words
    return int(bits)


def _forget_random_words() -> None:
    global _random_words
    _random_words = iter(())


os.register_at_fork(after_in_child=_forget_random_words)


class Boundary:
    """Validates and authorizes calls against the registered entity types."""

    def __init__(self, definitions: Mapping[str, EntityDefinition], limits: Limits,
                 authorize: Authorize | None) -> None:
        self.definitions = definitions
        self.limits = limits
        self._authorize = authorize
        self.authorizes = authorize is not None  # else a send without a sender skips `sender`
        self._key_re = re.compile(limits.key_pattern)
        # Handlers found before, by (type name, id of the handler object): the entry
        # holds the object, so its id is not reused while it is here. Only declared
        # handlers get in, so it stays as small as the registered classes.
        self._handlers: dict[tuple[str, int], tuple[object, HandlerDefinition]] = {}

    def definition(self, entity_type: type | str) -> EntityDefinition:
        if isinstance(entity_type, str):
            found = self.definitions.get(entity_type)
        else:
            own = getattr(entity_type, "_corral_definition", None)
            found = own if own is not None and self.definitions.get(own.name) is own else None
        if found is None:
            raise UnknownEntityTypeError(
                f"entity type {getattr(entity_type, '__name__', entity_type)!r} is not "
                f"registered; pass it in open_runtime(entities=[...]) "
                f"(registered: {sorted(self.definitions)})"
            )
        return found

    def check_key(self, key: object) -> str:
        key = self.check_identifier(key, "entity key")
        if not self._key_re.fullmatch(key):
            raise InvalidKeyError(
                f"entity key {key!r} must match {self.limits.key_pattern!r}"
            )
        return key

    def check_message_id(self, message_id: object, what: str = "message id") -> str:
        """The caller's idempotency key, or a fresh one for None.

        An id beginning as the ones corral derives (`DERIVED_ID_PREFIXES`: `send:`,
        `replay:`, `schedule:`) is refused, so no caller can take the id of an entity's
        send, of a dead letter's replay or of a schedule's tick before it is made."""
        if message_id is None:
            return new_message_id()
        checked = self.check_identifier(message_id, what)
        if checked.startswith(DERIVED_ID_PREFIXES):
            prefix = next(p for p in DERIVED_ID_PREFIXES if checked.startswith(p))
            raise InvalidKeyError(
                f"{what} {checked!r:.80} begins with {prefix!r}, which corral keeps for the "
                "ids it derives (entity sends, dead-letter replays, schedule ticks); "
                "choose another")
        return checked

    def check_identifier(self, value: object, what: str) -> str:
        """A key, id or sender: a non-empty str of at most `max_key_length` characters,
        with no control characters and no lone surrogates (whatever `key_pattern` says).

        Checked here so that a bad one never joins a group-commit batch.
        """
        limit = self.limits.max_key_length
        if not isinstance(value, str):
            raise InvalidKeyError(f"{what} must be a str, got {type(value).__name__}")
        if not value:
            raise InvalidKeyError(f"{what} is empty")
        if len(value) > limit:
            raise InvalidKeyError(f"{what} is {len(value)} characters; the limit is {limit}")
        bad = _FORBIDDEN.search(value)
        if bad is not None:
            kind = "a control character" if _CONTROL.match(bad.group()) else "a lone surrogate"
            raise InvalidKeyError(
                f"{what} {value!r} holds {kind} ({bad.group()!r} at {bad.start()})"
            )
        return value

    def check_delivery_key(self, key: object) -> str:
        """A delivery's idempotency key: 1 to `max_delivery_key_bytes` UTF-8 bytes, with
        no control characters and no lone surrogates."""
        if not isinstance(key, str):
            raise InvalidKeyError(f"delivery key must be a str, got {type(key).__name__}")
        bad = _FORBIDDEN.search(key)
        if bad is not None:
            kind = "a control character" if _CONTROL.match(bad.group()) else "a lone surrogate"
            raise InvalidKeyError(
                f"delivery key {key!r:.80} holds {kind} ({bad.group()!r} at {bad.start()})")
        size, limit = len(key.encode()), self.limits.max_delivery_key_bytes
        if not 1 <= size <= limit:
            raise InvalidKeyError(
                f"delivery key is {size} UTF-8 bytes; it must be 1 to {limit}")
        return key

    def wait(self, definition: EntityDefinition, wait: object) -> WaitDefinition:
        """The declared wait `wait` is (`Order.approval`), checked to be `definition`'s."""
        if isinstance(wait, str):
            raise UnknownHandlerError(
                f"pass the wait itself, not its name: {definition.name}.{wait} rather than "
                f"{wait!r} (its waits: {sorted(definition.waits)})",
                entity_type=definition.name)
        if not isinstance(wait, SignalWait) or not wait.belongs_to(definition.cls):
            raise UnknownHandlerError(
                f"{wait!r} is not a wait of {definition.name} (its waits: "
                f"{sorted(definition.waits)}); declare it with corral.wait(Model)",
                entity_type=definition.name)
        return wait.definition

    def wait_payload(self, wait: WaitDefinition, payload: object) -> str:
        return encode_model(wait.model, payload, max_bytes=self.limits.max_payload_bytes,
                            what=f"delivery to wait {wait.name!r}")

    def check_reason(self, reason: object) -> str:
        """A termination reason: free text (newlines allowed) within the payload limit."""
        if not isinstance(reason, str):
            raise InvalidArgumentError(f"reason must be a str, got {type(reason).__name__}")
        bad = _SURROGATE.search(reason)
        if bad is not None:
            raise InvalidArgumentError(f"reason holds a lone surrogate at {bad.start()}")
        if len(reason.encode()) > self.limits.max_payload_bytes:
            raise InvalidArgumentError(
                f"reason is longer than {self.limits.max_payload_bytes} bytes")
        return reason

    def handler(self, definition: EntityDefinition, handler: object,
                kinds: tuple[HandlerKind, ...]) -> HandlerDefinition:
        """The declared handler `handler` is, checked to belong to `definition`'s type
        (itself or inherited) and to be of one of `kinds`."""
        seen = self._handlers.get((definition.name, id(handler)))
        if seen is not None and seen[0] is handler and seen[1].kind in kinds:
            return seen[1]
        marked = _marked(handler)
        if marked is not None:
            found = definition.handler(marked.name)
            if found is not None and found.kind in kinds and \
                    _declared(definition.cls, marked.name) is handler:
                self._handlers[(definition.name, id(handler))] = (handler, found)
                return found
        raise _not_a_handler(definition, handler, kinds, marked)

    def payload(self, handler: HandlerDefinition, payload: object) -> str:
        if handler.input_type is None:
            if payload is not None:
                raise InvalidPayloadError(f"{handler.kind.value} {handler.name!r} takes no payload")
            return "null"
        return encode_model(handler.input_type, payload, max_bytes=self.limits.max_payload_bytes,
                            what=f"{handler.kind.value} {handler.name!r} payload")

    def start_input(self, definition: EntityDefinition, start: object) -> str:
        if definition.start_type is not None and start is None:
            raise InvalidPayloadError(
                f"{definition.name} needs a start input ({definition.start_type.__name__})"
            )
        return encode_start(definition, start, max_bytes=self.limits.max_payload_bytes)

    async def sender(self, claimed: object, definition: EntityDefinition, key: str, kind: str,
                     name: str) -> str | None:
        """The sender to record: the hook's authenticated answer, or the claim if no hook.

        The claim is checked like an id (`check_identifier`), and so is the hook's
        answer: both are recorded and compared for deduplication.
        """
        return await self._authorized(claimed, definition.name, key, kind, name)

    async def permit(self, claimed: object, entity_type: str, key: str, kind: str,
                     name: str) -> None:
        """Ask the hook about an operator read (kind "read") or a purge ("purge") of
        `entity_type` `key` ("": all of them); `UnauthorizedError` if it refuses.
        Without a hook only the claim is checked."""
        await self._authorized(claimed, entity_type, key, kind, name)

    async def _authorized(self, claimed: object, entity_type: str, key: str, kind: str,
                          name: str) -> str | None:
        if claimed is not None:
            claimed = self.check_identifier(claimed, "sender")
        if self._authorize is None:
            return claimed
        decision: Any = self._authorize(AuthRequest(claimed, entity_type, key, kind, name))
        if inspect.isawaitable(decision):
            decision = await decision
        if decision is False:
            target = f"{entity_type} {key!r}" if key else entity_type or "every entity type"
            raise UnauthorizedError(f"{kind} {name!r} to {target} rejected",
                                    entity_type=entity_type or None, key=key or None)
        if decision is not None and not isinstance(decision, str):
            raise TypeError(
                f"authorize must return the sender (str or None) or False, got {decision!r}"
            )
        return None if decision is None else self.check_identifier(
            decision, "the sender authorize returned")


def _declared(cls: type, name: str) -> object:
    """What `cls` (or the base it inherits it from) declares under `name`."""
    for klass in cls.__mro__:
        if name in vars(klass):
            return vars(klass)[name]
    return None


def _marked(handler: object) -> HandlerDefinition | None:
    """The handler definition a decorated handler carries, if `handler` is one."""
    try:
        marked = getattr(handler, "_corral_handler", None)
    except Exception:  # an object whose attribute access raises: not a handler
        return None
    return marked if isinstance(marked, HandlerDefinition) else None


def _not_a_handler(definition: EntityDefinition, handler: object,
                   kinds: tuple[HandlerKind, ...], marked: HandlerDefinition | None
                   ) -> UnknownHandlerError:
    """Why `handler` is not one of `definition`'s handlers of `kinds`, said for a person."""
    wanted = " or ".join(k.value for k in kinds)
    known = sorted(h.name for h in definition.handlers.values() if h.kind in kinds)
    if isinstance(handler, str):
        return UnknownHandlerError(
            f"pass the handler itself, not its name: {definition.name}.{handler} "
            f"rather than {handler!r} (its {wanted}s: {known})", entity_type=definition.name)
    if marked is None:
        return UnknownHandlerError(
            f"{handler!r} is not a corral handler; pass one of {definition.name}'s "
            f"{wanted}s {known}", entity_type=definition.name)
    found = definition.handler(marked.name)
    if found is None or _declared(definition.cls, marked.name) is not handler:
        return UnknownHandlerError(
            f"{_owner_name(handler)}.{marked.name} is not a handler of "
            f"{definition.name} (its {wanted}s: {known})", entity_type=definition.name)
    return UnknownHandlerError(
        f"{definition.name}.{found.name} is {_a(found.kind.value)}, not {_a(wanted)} "
        f"(its {wanted}s: {known})", entity_type=definition.name)


def _a(noun: str) -> str:
    return f"an {noun}" if noun[:1] in "aeiou" else f"a {noun}"


def _owner_name(handler: object) -> str:
    owner = getattr(handler, "owner", None)  # a mailbox signal knows its class
    if isinstance(owner, type):
        return owner.__name__
    qualname = getattr(handler, "__qualname__", "")
    return qualname.rpartition(".")[0] or "?"


def check_dead_letter_id(dead_letter_id: object) -> int:
    if isinstance(dead_letter_id, bool) or not isinstance(dead_letter_id, int) \
            or not 0 < dead_letter_id < 2**63:
        raise InvalidArgumentError(f"a dead letter id is a positive int, got {dead_letter_id!r}")
    return dead_letter_id


def check_run_id(run_id: object) -> int:
    if isinstance(run_id, bool) or not isinstance(run_id, int) or not 1 <= run_id < 2**62:
        raise InvalidArgumentError(f"run id must be a positive int, got {run_id!r}")
    return run_id


def check_after_id(after: object) -> int:
    """A dead-letter cursor: the last id of the previous page (None or 0: from the start)."""
    if after is None or (type(after) is int and after == 0):
        return 0
    return check_dead_letter_id(after)


def check_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100_000:
        raise InvalidArgumentError(f"limit must be an int from 1 to 100000, got {limit!r}")
    return limit


def check_timeout(timeout: object) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) \
            or not 0 <= timeout < float("inf"):
        raise InvalidArgumentError(
            f"timeout must be None or a finite number of seconds >= 0, got {timeout!r}")
    return float(timeout)


def check_status(status: object) -> RunStatus:
    """A run status to filter by (a `RunStatus` or its value, e.g. "running")."""
    try:
        found = RunStatus(status)
    except ValueError:
        found = None
    if found is None or found is RunStatus.NEVER_STARTED:
        known = [s.value for s in RunStatus if s is not RunStatus.NEVER_STARTED]
        raise InvalidArgumentError(f"status must be one of {known}, got {status!r}")
    return found
