"""Durable signal waits: the declaration on the class (`corral.wait`) and its checks.

A wait is a named, one-shot boundary of a run: `run()` waits for it with
`await self.wait_for_signal(Order.approval, timeout=...)`, a caller closes it with
`await ref.deliver(Order.approval, payload, key=...)`. It is declared on the class so
that a delivery is validated against its model at the caller's boundary, before
anything is stored, exactly like a signal's payload.

One of three modules named for waits, one per layer: this is the programming model's
side; the store decides deliveries and timeouts in `corral.persistence._waits`, and the
operator's `corral waits` and `corral deliver` are `corral._cli._waits`.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, overload

from pydantic import BaseModel

from corral._errors import EntityDefinitionError, InvalidArgumentError

__all__ = [
    "EARLY_SIGNALS",
    "MAX_WAIT_NAME",
    "MAX_WAIT_TIMEOUT",
    "MIN_WAIT_TIMEOUT",
    "SignalWait",
    "WaitDefinition",
    "WaitHandle",
    "check_wait_timeout",
]

M = TypeVar("M", bound=BaseModel)
Owner = TypeVar("Owner")
Owner_contra = TypeVar("Owner_contra", contravariant=True)

MIN_WAIT_TIMEOUT = 0.001
"""The shortest timeout of a wait, in seconds."""
MAX_WAIT_TIMEOUT = 7 * 86400.0
"""The longest timeout of a wait by default (7 days); `corral.wait(..., max_timeout=)`
raises it for one wait."""
MAX_WAIT_NAME = 200
"""The longest wait name, in characters."""
EARLY_SIGNALS = ("buffer", "reject")
"""What `Entity.early_signals` may say about a delivery made before `run()` waits."""


@dataclass(frozen=True, slots=True)
class WaitDefinition:
    """One declared wait, as the runtime sees it."""

    name: str
    model: type[BaseModel]
    max_timeout: float
    renamed_from: tuple[str, ...] = ()
    """The names the wait had in earlier releases, oldest first."""


class WaitHandle(Protocol[Owner_contra, M]):
    """How the type checker sees a wait read off its class (`Order.approval`): bound to
    that entity type and its payload model, so `EntityRef.deliver` accepts it only for
    that type, with that model. Never instantiated."""

    def _corral_wait(self, owner: Owner_contra, payload: M, /) -> M: ...


class SignalWait(Generic[M]):
    """A durable signal wait of an entity type, declared as a class attribute.

    Example:
        class Order(corral.Entity):
            approval = corral.wait(Decision)          # named "approval"

            async def run(self) -> Outcome:
                decision = await self.wait_for_signal(Order.approval, timeout=86400)
                ...

    Attributes:
        name: the wait's name (the attribute's, unless `name=` gave another).
        model: the payload model every delivery is validated against.
        max_timeout: the longest timeout `wait_for_signal` accepts for it.
        owner: the class that declared it.
    """

    def __init__(self, model: type[M], *, name: str | None = None,
                 max_timeout: float = MAX_WAIT_TIMEOUT,
                 renamed_from: str | tuple[str, ...] | None = None) -> None:
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise EntityDefinitionError(
                f"corral.wait takes the payload's pydantic model class, got {model!r}")
        if name is not None:
            _check_name(name)
        if isinstance(max_timeout, bool) or not isinstance(max_timeout, int | float) \
                or not MIN_WAIT_TIMEOUT <= max_timeout < float("inf"):
            raise EntityDefinitionError(
                f"corral.wait: max_timeout must be a number of seconds >= "
                f"{MIN_WAIT_TIMEOUT:g}, got {max_timeout!r}")
        self.model = model
        self.name = name or ""
        self.max_timeout = float(max_timeout)
        self.renamed_from = _old_names(renamed_from)
        self.owner: type | None = None

    def __set_name__(self, owner: type, attr: str) -> None:
        self.owner = owner
        if not self.name:
            self.name = attr

    @property
    def definition(self) -> WaitDefinition:
        return WaitDefinition(self.name, self.model, self.max_timeout, self.renamed_from)

    def belongs_to(self, cls: type) -> bool:
        """Whether this is a wait of the entity class `cls` (declared on it or a base)."""
        waits = getattr(getattr(cls, "_corral_definition", None), "waits", {})
        return isinstance(self.owner, type) and issubclass(cls, self.owner) \
            and waits.get(self.name) == self.definition

    @overload
    def __get__(self, instance: None, owner: type[Owner]) -> WaitHandle[Owner, M]: ...
    @overload
    def __get__(self, instance: Owner, owner: type[Owner]) -> WaitHandle[Owner, M]: ...
    def __get__(self, instance: object, owner: type) -> Any:
        return self  # the declaration itself, on the class and on instances alike

    def __repr__(self) -> str:
        return f"<signal wait {self.name or '?'}({self.model.__name__})>"


def wait(model: type[M], *, name: str | None = None, max_timeout: float = MAX_WAIT_TIMEOUT,
         renamed_from: str | tuple[str, ...] | None = None) -> SignalWait[M]:
    """Declare a durable signal wait on an entity class (see `SignalWait`).

    `name` defaults to the attribute's name; a wait name is 1-200 characters, with no
    surrounding whitespace and no control characters. `max_timeout` is the longest
    timeout `wait_for_signal` accepts for it (default 7 days). `renamed_from` names the
    wait had in earlier releases (oldest first): deliveries by an old name reach it.

    Example:
        approval = corral.wait(Decision, renamed_from="manager_ok")
    """
    return SignalWait(model, name=name, max_timeout=max_timeout, renamed_from=renamed_from)


def _old_names(renamed_from: object) -> tuple[str, ...]:
    if renamed_from is None:
        return ()
    names = (renamed_from,) if isinstance(renamed_from, str) else renamed_from
    if not isinstance(names, tuple) or not names:
        raise EntityDefinitionError(
            "corral.wait(renamed_from=...) takes the old name or a tuple of old names "
            f"(oldest first), got {renamed_from!r}")
    for old in names:
        _check_name(old)
    if len(set(names)) != len(names):
        raise EntityDefinitionError(f"corral.wait(renamed_from={renamed_from!r}) names one "
                                    "old name twice")
    return tuple(names)


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_WAIT_NAME:
        raise EntityDefinitionError(
            f"a wait name is a string of 1 to {MAX_WAIT_NAME} characters, got {name!r}")
    if name != name.strip():
        raise EntityDefinitionError(f"wait name {name!r} has surrounding whitespace")
    for ch in name:
        if unicodedata.category(ch) in ("Cc", "Cs"):
            raise EntityDefinitionError(
                f"wait name {name!r} holds a control character or lone surrogate "
                f"(U+{ord(ch):04X})")


def check_wait_timeout(wait: WaitDefinition, timeout: Any) -> float | None:
    """`timeout` checked against the wait's bounds (None: wait for ever)."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) \
            or not MIN_WAIT_TIMEOUT <= timeout <= wait.max_timeout:
        raise InvalidArgumentError(
            f"wait {wait.name!r}: timeout must be None or between {MIN_WAIT_TIMEOUT:g} s "
            f"and {wait.max_timeout:g} s, got {timeout!r}")
    return float(timeout)
