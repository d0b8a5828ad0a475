"""Handler decorators and the per-class definition validated when a class is defined.

Decorators attach a frozen `HandlerDefinition` under one private attribute
(`_corral_handler`); `Entity.__init_subclass__` collects them into an
`EntityDefinition` and rejects mistakes at once, with messages that say what to fix.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import inspect
import itertools
import json
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, overload

from pydantic import BaseModel

from corral._common import (
    DEFAULT_RUN_RETRY,
    ContinueAsNewPolicy,
    DedupeWindow,
    IdReusePolicy,
    Retention,
    RetryPolicy,
    SnapshotPolicy,
)
from corral._errors import EntityDefinitionError, FailRun

from ._code import code_of
from ._issues import DefinitionIssues
from ._state import StateSchema, build_state_schema
from ._waits import EARLY_SIGNALS, SignalWait, WaitDefinition

__all__ = [
    "EntityDefinition",
    "HandlerDefinition",
    "HandlerKind",
    "MailboxHandler",
    "MailboxSignal",
    "query",
    "signal",
    "update",
]

_ATTR = "_corral_handler"
F = TypeVar("F", bound=Callable[..., Any])
M = TypeVar("M", bound=BaseModel)


class HandlerKind(str, enum.Enum):
    SIGNAL = "signal"
    UPDATE = "update"
    QUERY = "query"


@dataclass(frozen=True, slots=True)
class HandlerDefinition:
    """One declared handler. `fn` is None for a mailbox signal (no handler body)."""

    kind: HandlerKind
    name: str
    fn: Callable[..., Any] | None
    input_type: type[BaseModel] | None
    output_type: Any = None
    is_async: bool = False
    renamed_from: tuple[str, ...] = ()
    """The names this handler had in earlier releases, oldest first (`renamed_from=`):
    journal entries, dead letters and senders of an old name reach it."""
    window: tuple[str, float] | None = None
    """A mailbox signal's reorder window (`order_by=`, `hold=`): the payload field its
    payloads are released to `run()` in the order of, and the seconds each is held."""

    def release_order(self, payload: Any, accepted_at: float) -> tuple[Any, float] | None:
        """(order key, release time) of a windowed mailbox payload accepted at
        `accepted_at` (the journal's time, so a recovery holds it until the same time);
        None without a window."""
        if self.window is None:
            return None
        field, hold = self.window
        return getattr(payload, field), accepted_at + hold


Owner = TypeVar("Owner")
Owner_contra = TypeVar("Owner_contra", contravariant=True)


class MailboxHandler(Protocol[Owner_contra, M]):
    """How the type checker sees a mailbox signal read off its class (`Ticket.inbox`):
    bound to that entity type `Owner_contra` and its payload model `M`, so `EntityRef`
    accepts it only for that type with that model. Never instantiated."""

    def _corral_deliver(self, owner: Owner_contra, payload: M, /) -> M: ...


class MailboxSignal(Generic[M]):
    """A signal without a handler body: each payload is appended to `self.mailbox`.

    Example:
        class Ticket(corral.Entity):
            customer_reply = corral.signal(Reply)   # run() drains self.mailbox
    """

    def __init__(self, model: type[M], *, renamed_from: tuple[str, ...] = (),
                 window: tuple[str, float] | None = None) -> None:
        self.model = model
        self.renamed_from = renamed_from
        self.window = window
        self.owner: type | None = None
        self._corral_handler: HandlerDefinition | None = None

    def __set_name__(self, owner: type, name: str) -> None:
        self.owner = owner
        self._corral_handler = HandlerDefinition(HandlerKind.SIGNAL, name, None, self.model,
                                                 renamed_from=self.renamed_from,
                                                 window=self.window)

    @overload
    def __get__(self, instance: None, owner: type[Owner]) -> MailboxHandler[Owner, M]: ...
    @overload
    def __get__(self, instance: Owner, owner: type[Owner]) -> MailboxHandler[Owner, M]: ...
    def __get__(self, instance: object, owner: type) -> Any:
        return self  # the declaration itself, on the class and on instances alike

    def __repr__(self) -> str:
        name = self._corral_handler.name if self._corral_handler else "?"
        return f"<mailbox signal {name}({self.model.__name__})>"


RenamedFrom = str | tuple[str, ...] | None
"""`renamed_from=`: the name (or names, oldest first) a handler or wait had before."""


@overload
def signal(fn_or_model: type[M], /, *, renamed_from: RenamedFrom = None,
           order_by: str | None = None, hold: float | None = None) -> MailboxSignal[M]: ...
@overload
def signal(fn_or_model: F, /, *, renamed_from: RenamedFrom = None) -> F: ...
@overload
def signal(*, renamed_from: RenamedFrom) -> Callable[[F], F]: ...
def signal(fn_or_model: Any = None, /, *, renamed_from: RenamedFrom = None,
           order_by: str | None = None, hold: float | None = None) -> Any:
    """Declare a signal: fire-and-forget, durable, applied once in acceptance order.

    Use as a decorator on a method taking one pydantic model (or nothing), or call it
    with a model class to declare a mailbox signal whose payloads go to `self.mailbox`.

    A handler that raises is retried with backoff under the class's `retry` policy;
    after the last attempt the message moves to the dead letters and the entity goes
    on with the next one (see `RetryPolicy`).

    `renamed_from` declares the name (or names, oldest first) the signal had in earlier
    releases: journal entries, dead letters and senders still using an old name reach
    this handler, and hosts on this code accept clients still on the old one.

    Example:
        @corral.signal(renamed_from="customer_reply")
        def reply_from_customer(self, reply: Reply) -> None: ...

        inbox = corral.signal(Msg, renamed_from="messages")   # a mailbox signal

    A mailbox signal may declare a reorder window: `order_by` names a payload field
    (a provider's timestamp) and `hold` the seconds each payload is held after it was
    accepted. `run()` then takes payloads in the order of that field: a payload is
    released once its hold ran out, together with every held one ordered before it. A
    payload ordered before one already released is delivered anyway, flagged
    `self.mailbox.late` (never dropped). Held payloads are journal entries like any
    other: they survive a crash and are held until the same time again.

        replies = corral.signal(Reply, order_by="at", hold=2.0)
    """
    old = _old_names(renamed_from, "signal")
    window = _window(fn_or_model, order_by, hold)
    if fn_or_model is None:
        return lambda fn: _mark(fn, HandlerKind.SIGNAL, old)
    if isinstance(fn_or_model, type) and issubclass(fn_or_model, BaseModel):
        return MailboxSignal(fn_or_model, renamed_from=old, window=window)
    return _mark(fn_or_model, HandlerKind.SIGNAL, old)


def _window(model: Any, order_by: str | None, hold: float | None) -> tuple[str, float] | None:
    """`signal(..., order_by=, hold=)` checked: a mailbox signal's field and a hold > 0."""
    if order_by is None and hold is None:
        return None
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise EntityDefinitionError("order_by= and hold= declare a mailbox signal's reorder "
                                    "window: pass the payload model, corral.signal(Model, ...)")
    if order_by not in model.model_fields:
        raise EntityDefinitionError(f"order_by must name a field of {model.__name__}, got "
                                    f"{order_by!r}")
    if isinstance(hold, bool) or not isinstance(hold, int | float) or not 0 < hold < 86_400:
        raise EntityDefinitionError(f"hold must be a number of seconds in (0, 86400), got "
                                    f"{hold!r}")
    return order_by, float(hold)


@overload
def update(fn: F, /, *, renamed_from: RenamedFrom = None) -> F: ...
@overload
def update(*, renamed_from: RenamedFrom) -> Callable[[F], F]: ...
def update(fn: Any = None, /, *, renamed_from: RenamedFrom = None) -> Any:
    """Declare an update: durable like a signal, and the caller receives its return value.

    A handler that raises is not retried and never dead-lettered: its error is recorded
    as the update's outcome and the caller (and every retry of the same update id) gets
    `UpdateFailedError`. `renamed_from` works as for `signal`.

    Example:
        @corral.update(renamed_from="assign")
        async def assign_agent(self, req: Assign) -> Assigned: ...
    """
    old = _old_names(renamed_from, "update")
    if fn is None:
        return lambda f: _mark(f, HandlerKind.UPDATE, old)
    return _mark(fn, HandlerKind.UPDATE, old)


def _old_names(renamed_from: object, what: str) -> tuple[str, ...]:
    if renamed_from is None:
        return ()
    names = (renamed_from,) if isinstance(renamed_from, str) else renamed_from
    if not isinstance(names, tuple) or not names or not all(
            isinstance(n, str) and n.isidentifier() for n in names):
        raise EntityDefinitionError(
            f"@corral.{what}(renamed_from=...) takes the old name, or a tuple of old names "
            f"(oldest first), each an identifier; got {renamed_from!r}")
    if len(set(names)) != len(names):
        raise EntityDefinitionError(
            f"@corral.{what}(renamed_from={renamed_from!r}) names one old name twice")
    return names


def query(fn: F, /) -> F:
    """Declare a query: a synchronous read of state that must not change it."""
    return _mark(fn, HandlerKind.QUERY)  # a query is never journaled: nothing to rename


def _mark(fn: F, kind: HandlerKind, renamed_from: tuple[str, ...] = ()) -> F:
    if not callable(fn) or isinstance(fn, type):
        raise EntityDefinitionError(
            f"@corral.{kind.value} decorates a method; got {fn!r}"
            + (" (to declare a mailbox signal, pass a pydantic model class)" if kind == "signal"
               else "")
        )
    # Unresolved until the class is defined: annotations may name later classes.
    setattr(fn, _ATTR, HandlerDefinition(kind, fn.__name__, fn, None,
                                         renamed_from=renamed_from))
    return fn


@dataclass(frozen=True, slots=True)
class EntityDefinition:
    """Everything the runtime needs to know about an entity class."""

    cls: type
    name: str
    start_type: type[BaseModel] | None
    result_type: Any
    handlers: Mapping[str, HandlerDefinition]
    id_reuse: IdReusePolicy
    has_run: bool
    """Whether the class defines its own `run()` (the default needs no task)."""
    snapshots: SnapshotPolicy
    continue_as_new: ContinueAsNewPolicy
    idle_timeout: float | None
    """Seconds without activity before the host passivates the entity (None: never)."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    """Retries of a raising signal handler before the message is dead-lettered."""
    placement: str = "shared"
    """Ray backend: `"shared"` (hosted in the key's shard actor) or `"dedicated"`."""
    ray_options: Mapping[str, Any] = field(default_factory=dict)
    """Ray resources of a dedicated entity's actor (`num_cpus`, `num_gpus`, ...)."""
    dedupe_window: DedupeWindow = field(default_factory=DedupeWindow)
    waits: Mapping[str, WaitDefinition] = field(default_factory=dict)
    """Declared durable signal waits (`corral.wait`), by name."""
    max_backlog: int | None = None
    """Signals accepted but not yet applied before a send is refused (None: unbounded)."""
    overflow: str = "refuse"
    retention: Retention | None = None
    """How long a closed run is kept before the hosts purge it (None: forever)."""
    """A signal over `max_backlog`: `"refuse"` it or keep it as a `"dead_letter"`."""
    early_signals: str = "buffer"
    """A delivery before `run()` waits: `"buffer"` it (it wins when `run()` gets there)
    or `"reject"` it (answered `not_waiting`, nothing kept)."""
    run_retry: RetryPolicy = DEFAULT_RUN_RETRY
    """How a suspended run (its `run()` raised, or its activation could not be built) is
    retried; `max_attempts=None` retries until a fix."""
    fail_on: tuple[type[BaseException], ...] = ()
    """Exception types that fail the run (besides `corral.FailRun`) instead of suspending it."""
    renamed: Mapping[str, str] = field(default_factory=dict)
    """Old handler names (`renamed_from=`) -> today's name."""
    renamed_waits: Mapping[str, str] = field(default_factory=dict)
    """Old wait names (`corral.wait(..., renamed_from=)`) -> today's name."""
    state: StateSchema = field(default_factory=StateSchema)
    """The declared state: `state_version`, annotated attributes, upgrade hooks."""

    def handler(self, name: str) -> HandlerDefinition | None:
        """The handler called `name` today or, through `renamed_from`, in an earlier
        release: the one place a journaled or sent name meets today's code."""
        found = self.handlers.get(name)
        if found is None and self.renamed:
            found = self.handlers.get(self.renamed.get(name, ""))
        return found

    def wait(self, name: str) -> WaitDefinition | None:
        """The wait called `name` today or in an earlier release (`renamed_from=`)."""
        return self.waits.get(self.renamed_waits.get(name, name))

    def fails_run(self, err: BaseException) -> bool:
        """Whether `err`, escaping `run()` or the building of an activation, fails the run
        (`corral.FailRun` or a type in `fail_on`) rather than suspending it."""
        return isinstance(err, (FailRun, *self.fail_on))

    @property
    def fingerprint(self) -> str:
        """A short hash of what callers and hosts must agree on: the type's name, its
        start and result types, each handler (name, kind, models, sync or async) and
        its policies. Handler bodies are not part of it."""
        return _fingerprint(self.cls, ())

    @property
    def code(self) -> str:
        """A short hash of the class's code (`_code.code_of`): its module's source, so
        a change of a handler's or `run()`'s body, or of a helper in the module, is a new
        build. Not part of `fingerprint`: the interface stays the same."""
        return code_of(self.cls)

    @property
    def compatible_fingerprints(self) -> frozenset[str]:
        """The fingerprints of the releases a host on this code accepts clients of: its
        own, and the same definition with declared renames undone (a client on the old
        code sends old names, which `handler()` resolves). Not the other way round: a
        host on old code refuses a client that sends names it does not know."""
        return _compatible(self.cls)


_MAX_VARIANTS = 64  # beyond: today's names, and every renamed name at its k-th old name


@functools.cache
def _compatible(cls: type) -> frozenset[str]:
    d: EntityDefinition = cls._corral_definition  # type: ignore[attr-defined]
    choices = [(h.name, *h.renamed_from) for h in d.handlers.values() if h.renamed_from]
    choices += [(w.name, *w.renamed_from) for w in d.waits.values() if w.renamed_from]
    if not choices:
        return frozenset({_fingerprint(cls, ())})
    count = 1
    for names in choices:
        count *= len(names)
    if count <= _MAX_VARIANTS:
        picks = list(itertools.product(*choices))
    else:
        depth = max(len(names) for names in choices)
        picks = [tuple(names[min(k, len(names) - 1)] for names in choices) for k in range(depth)]
    return frozenset(_fingerprint(cls, tuple(zip((c[0] for c in choices), p, strict=True)))
                     for p in picks)


@functools.cache
def _fingerprint(cls: type, names: tuple[tuple[str, str], ...]) -> str:
    """`names`: (today's name, the name to fingerprint it under) for undone renames."""
    d: EntityDefinition = cls._corral_definition  # type: ignore[attr-defined]
    as_named = dict(names)
    handlers = sorted(((as_named.get(h.name, h.name), h) for h in d.handlers.values()),
                      key=lambda pair: pair[0])
    waits = sorted(((as_named.get(w.name, w.name), w) for w in d.waits.values()),
                   key=lambda pair: pair[0])
    parts = [
        f"name={d.name}", f"start={_describe(d.start_type)}", f"result={_describe(d.result_type)}",
        *(f"handler={name}:{h.kind.value}:{_describe(h.input_type)}:"
          f"{_describe(h.output_type)}:{'async' if h.is_async else 'sync'}:"
          f"{'mailbox' if h.fn is None else 'body'}"
          + (f":window={h.window[0]}" if h.window else "")
          for name, h in handlers),
        *(f"wait={name}:{_describe(w.model)}:{w.max_timeout!r}" for name, w in waits),
        *(f"{attr}={getattr(d, attr)!r}" for attr in (
            "id_reuse", "snapshots", "continue_as_new", "idle_timeout", "retry",
            "placement", "dedupe_window", "early_signals")),
        f"ray_options={sorted(d.ray_options.items())!r}",
        # Annotations are not part of it: adding or removing an attribute is compatible
        # (restore validates against today's). A new state version is not: an older
        # host would refuse the snapshots a newer one writes.
        f"state_version={d.state.version}",
    ]
    return hashlib.blake2b("\n".join(parts).encode(), digest_size=8).hexdigest()


def _describe(annotation: Any) -> str:
    """A stable text for a model (its JSON schema) or another annotation."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        try:
            schema = annotation.model_json_schema()
        except Exception:  # a type without a JSON schema: its fields, as Python sees them
            return f"{annotation.__qualname__}{sorted(annotation.model_fields.items())!r}"
        return json.dumps(schema, sort_keys=True)
    return repr(annotation)


RESERVED_NAMES = frozenset({
    "checkpoint", "continue_as_new", "continue_as_new_suggested", "key", "mailbox", "run",
    "run_id", "sleep", "sleep_until", "wait_for", "wait_for_signal", "now", "early_signals",
    "state_version", "max_backlog", "overflow", "retention",
})
"""`Entity` members a handler may not be named after (they would be shadowed)."""


def define_entity(cls: type, localns: Mapping[str, Any], *, has_run: bool,
                  custom_state: bool = False) -> EntityDefinition:
    """Validate an entity class and build its definition (called by `__init_subclass__`).

    Every problem of the class is collected and raised at once as one
    `EntityDefinitionError`.
    """
    issues = DefinitionIssues(cls)
    name = cls.__dict__.get("name", cls.__name__)
    if not isinstance(name, str) or not name.isidentifier():
        issues.add(f"{cls.__name__}.name must be an identifier, got {name!r}")
    snapshots = _policy(issues, "snapshots", SnapshotPolicy)
    can_policy = _policy(issues, "continue_as_new_policy", ContinueAsNewPolicy)
    dedupe = _policy(issues, "dedupe_window", DedupeWindow)
    id_reuse = _policy(issues, "id_reuse", IdReusePolicy, IdReusePolicy.ALLOW_DUPLICATE)
    retry = _policy(issues, "retry", RetryPolicy, hint=(
        " (the class attribute `retry` is reserved for the retry policy; rename a handler "
        "called so)"))
    run_retry = _policy(issues, "run_retry", RetryPolicy, DEFAULT_RUN_RETRY)
    if retry.max_attempts is None:
        issues.add(f"{cls.__name__}.retry.max_attempts must be a number: a signal whose handler "
                   "keeps raising blocks every message behind it (None is for `run_retry`)")
    fail_on = _fail_on(cls, issues)
    idle_timeout = getattr(cls, "idle_timeout", None)
    if idle_timeout is not None and (
        isinstance(idle_timeout, bool) or not isinstance(idle_timeout, int | float)
        or idle_timeout <= 0
    ):
        issues.add(f"{cls.__name__}.idle_timeout must be a positive number of seconds or None, "
                   f"got {idle_timeout!r}")
        idle_timeout = None
    placement, ray_options = _placement(cls, issues)
    handlers = _handlers(cls, localns, issues)
    waits = _waits(cls, issues)
    early = getattr(cls, "early_signals", "buffer")
    if early not in EARLY_SIGNALS:
        issues.add(f"{cls.__name__}.early_signals must be 'buffer' or 'reject', got {early!r}")
        early = "buffer"
    max_backlog, overflow = _backlog(cls, issues)
    retention = getattr(cls, "retention", None)
    if retention is not None and not isinstance(retention, Retention):
        issues.add(f"{cls.__name__}.retention must be corral.Retention(closed_for=...) or "
                   f"None, got {retention!r}")
        retention = None
    init = cls.__init__  # type: ignore[misc]
    start_type = None if init is object.__init__ else _single_model(
        cls, init, "__init__", localns, issues, what="__init__ (the start input)"
    )
    run = cls.run  # type: ignore[attr-defined]
    result_type = None
    if not inspect.iscoroutinefunction(run):
        issues.add(f"{cls.__name__}.run must be `async def run(self)`")
    else:
        result_type = (_hints(cls, run, localns, issues) or {}).get("return")
    renamed = _renames(cls, issues, {h.name: h.renamed_from for h in handlers.values()},
                       "handler")
    renamed_waits = _renames(cls, issues, {w.name: w.renamed_from for w in waits.values()},
                             "wait")
    state = build_state_schema(cls, localns, issues, custom=custom_state)
    issues.raise_if_any()
    code_of(cls)  # read now, while the source on disk is the code being defined
    return EntityDefinition(
        cls, name, start_type, result_type, handlers, id_reuse, has_run, snapshots,
        can_policy, None if idle_timeout is None else float(idle_timeout),
        retry=retry, placement=placement, ray_options=ray_options, dedupe_window=dedupe,
        waits=waits, early_signals=early, max_backlog=max_backlog, overflow=overflow,
        retention=retention,
        run_retry=run_retry, fail_on=fail_on,
        renamed=renamed, renamed_waits=renamed_waits,
        state=state,
    )


OVERFLOWS = ("refuse", "dead_letter")


def _backlog(cls: type, issues: DefinitionIssues) -> tuple[int | None, str]:
    """The class's `max_backlog` and `overflow`, checked."""
    bound = getattr(cls, "max_backlog", None)
    if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int)
                              or bound < 1):
        issues.add(f"{cls.__name__}.max_backlog must be a positive int or None, got {bound!r}")
        bound = None
    overflow = getattr(cls, "overflow", "refuse")
    if overflow not in OVERFLOWS:
        issues.add(f"{cls.__name__}.overflow must be 'refuse' or 'dead_letter', "
                   f"got {overflow!r}")
        overflow = "refuse"
    return bound, overflow


def _renames(cls: type, issues: DefinitionIssues, declared: Mapping[str, tuple[str, ...]],
             what: str) -> dict[str, str]:
    """Old name -> today's name; an old name that is another handler's (or wait's) name
    today, or that two of them claim, is a problem naming both."""
    renamed: dict[str, str] = {}
    for name, old_names in sorted(declared.items()):
        for old in old_names:
            if old in declared:
                issues.add(f"{cls.__name__}.{name}: renamed_from={old!r} is the name of the "
                           f"{what} {cls.__name__}.{old} today; an old name must be free so "
                           "that old messages reach one handler (drop it or rename that one)")
            elif old in renamed:
                issues.add(f"{cls.__name__}.{name} and .{renamed[old]} both declare "
                           f"renamed_from={old!r}; an old name reaches one {what} only")
            else:
                renamed[old] = name
    return renamed


def _fail_on(cls: type, issues: DefinitionIssues) -> tuple[type[BaseException], ...]:
    """The class's `fail_on`: a tuple of exception classes."""
    value = getattr(cls, "fail_on", ())
    if isinstance(value, type):
        value = (value,)
    if not isinstance(value, tuple | list) or not all(
            isinstance(t, type) and issubclass(t, Exception) for t in value):
        issues.add(f"{cls.__name__}.fail_on must be a tuple of exception classes (the errors "
                   f"that fail the run instead of suspending it), got {value!r}")
        return ()
    return tuple(value)


def _waits(cls: type, issues: DefinitionIssues) -> dict[str, WaitDefinition]:
    """The waits declared on `cls` and its bases (`corral.wait`), by name."""
    waits: dict[str, WaitDefinition] = {}
    attrs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        for attr, value in vars(klass).items():
            if not isinstance(value, SignalWait):
                continue
            if attr in RESERVED_NAMES:
                issues.add(f"{klass.__name__}.{attr}: a wait cannot be named `{attr}`, which "
                           "`corral.Entity` uses; rename it")
                continue
            other = attrs.get(value.name)
            if other is not None and other != attr:
                issues.add(f"{klass.__name__}.{attr} and .{other} both declare the wait "
                           f"{value.name!r}; a wait name is unique in its entity type")
                continue
            waits[value.name] = value.definition
            attrs[value.name] = attr
    return waits


def _handlers(cls: type, localns: Mapping[str, Any], issues: DefinitionIssues
              ) -> dict[str, HandlerDefinition]:
    """The handlers of `cls` and its bases, the most derived declaration winning.

    An override must say what it is: a subclass method that replaces a handler without
    its decorator would otherwise keep the base handler and never be called, so it is
    refused, and so is an override that changes the handler's kind.
    """
    handlers: dict[str, HandlerDefinition] = {}
    declared_in: dict[str, type] = {}
    for klass in reversed(cls.__mro__):
        for attr, value in vars(klass).items():
            marked = getattr(value, _ATTR, None)
            base = handlers.get(attr)
            if isinstance(marked, HandlerDefinition):
                if base is not None and base.kind is not marked.kind:
                    issues.add(
                        f"{klass.__name__}.{attr} is a {marked.kind.value} handler, but it "
                        f"overrides the {base.kind.value} handler "
                        f"{declared_in[attr].__name__}.{attr}: a handler keeps its kind in "
                        "subclasses (rename one of them)")
                    continue
                if attr in RESERVED_NAMES:
                    issues.add(f"{klass.__name__}.{attr}: a handler cannot be named `{attr}`, "
                               "which `corral.Entity` uses; rename it")
                    continue
                handlers[attr] = _resolve(cls, marked, localns, issues)
                declared_in[attr] = klass
            elif base is not None:
                decorator = (f"corral.signal({base.input_type.__name__})"
                             if base.fn is None and base.input_type is not None
                             else f"@corral.{base.kind.value}")
                issues.add(
                    f"{klass.__name__}.{attr} overrides the {base.kind.value} handler "
                    f"{declared_in[attr].__name__}.{attr} without its decorator, so it would "
                    f"never be called: declare it with {decorator} as well")
    return handlers


P = TypeVar("P")


def _policy(issues: DefinitionIssues, attr: str, kind: type[P], default: P | None = None, *,
            hint: str = "") -> P:
    """The class's policy attribute `attr`, checked to be a `kind` (default: `kind()`)."""
    value = getattr(issues.cls, attr, default if default is not None else kind())
    if not isinstance(value, kind):
        issues.add(
            f"{issues.cls.__name__}.{attr} must be "
            f"{'an' if kind.__name__[0] in 'AEIOU' else 'a'} {kind.__name__}, got {value!r}{hint}"
        )
        return default if default is not None else kind()
    return value


RAY_OPTION_KEYS = frozenset(
    {"num_cpus", "num_gpus", "memory", "resources", "accelerator_type", "runtime_env"}
)
"""The Ray actor options an entity type may set in `ray_options` (dedicated placement)."""


def _placement(cls: type, issues: DefinitionIssues) -> tuple[str, dict[str, Any]]:
    try:
        return _check_placement(cls)
    except EntityDefinitionError as err:
        issues.add(str(err))
        return "shared", {}


def _check_placement(cls: type) -> tuple[str, dict[str, Any]]:
    placement = getattr(cls, "placement", "shared")
    if placement not in ("shared", "dedicated"):
        raise EntityDefinitionError(
            f"{cls.__name__}.placement must be 'shared' (the default: hosted with many "
            f"others in its key's shard) or 'dedicated' (its own Ray actor), got {placement!r}"
        )
    options = getattr(cls, "ray_options", None) or {}
    if not isinstance(options, Mapping):
        raise EntityDefinitionError(
            f"{cls.__name__}.ray_options must be a dict of Ray actor options, got {options!r}"
        )
    unknown = sorted(set(options) - RAY_OPTION_KEYS)
    if unknown:
        raise EntityDefinitionError(
            f"{cls.__name__}.ray_options: unknown option(s) {', '.join(unknown)}; allowed: "
            f"{', '.join(sorted(RAY_OPTION_KEYS))}"
        )
    if options and placement != "dedicated":
        raise EntityDefinitionError(
            f"{cls.__name__}.ray_options applies to dedicated actors only: set "
            "placement = 'dedicated' as well (shared shards take `ray_options` in "
            "open_runtime)"
        )
    for key in ("num_cpus", "num_gpus", "memory"):
        value = options.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                  or value < 0):
            raise EntityDefinitionError(
                f"{cls.__name__}.ray_options[{key!r}] must be a number >= 0, got {value!r}"
            )
    resources = options.get("resources")
    if resources is not None and not (
        isinstance(resources, Mapping) and all(
            isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool)
            and v >= 0 for k, v in resources.items())
    ):
        raise EntityDefinitionError(
            f"{cls.__name__}.ray_options['resources'] must map resource names to numbers "
            f">= 0, got {resources!r}"
        )
    return placement, dict(options)


def _resolve(cls: type, h: HandlerDefinition, localns: Mapping[str, Any],
             issues: DefinitionIssues) -> HandlerDefinition:
    if h.fn is None:  # mailbox signal: the model was given explicitly
        return h
    kind = h.kind.value
    is_async = inspect.iscoroutinefunction(h.fn)
    if h.kind is HandlerKind.QUERY and is_async:
        issues.add(f"query handler `{h.name}` must be a plain `def`: a query reads state and "
                   "never waits")
    input_type = _single_model(cls, h.fn, h.name, localns, issues,
                               what=f"{kind} handler `{h.name}`")
    output = (_hints(cls, h.fn, localns, issues) or {}).get("return")
    return HandlerDefinition(h.kind, h.name, h.fn, input_type, output, is_async,
                             renamed_from=h.renamed_from)


def _single_model(
    cls: type, fn: Callable[..., Any], name: str, localns: Mapping[str, Any],
    issues: DefinitionIssues, *, what: str
) -> type[BaseModel] | None:
    params = list(inspect.signature(fn).parameters.values())[1:]  # drop self
    if not params:
        return None
    if len(params) > 1 or params[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD
    ):
        issues.add(
            f"{what} of {cls.__name__} must take one pydantic model or nothing, "
            f"got {len(params)} args ({', '.join(p.name for p in params)}); "
            "put the fields in one model so senders can evolve without breaking"
        )
        return None
    hints = _hints(cls, fn, localns, issues)
    if hints is None:  # an unresolvable annotation, reported already
        return None
    hint = hints.get(params[0].name)
    if not (isinstance(hint, type) and issubclass(hint, BaseModel)):
        issues.add(
            f"{what} of {cls.__name__}: parameter `{params[0].name}` must be annotated "
            f"with a pydantic BaseModel subclass, got {hint!r}"
        )
        return None
    return hint


def _hints(cls: type, fn: Callable[..., Any], localns: Mapping[str, Any],
           issues: DefinitionIssues) -> dict[str, Any] | None:
    """`fn`'s resolved annotations; None (and an issue) if one cannot be resolved."""
    ns = {**localns, cls.__name__: cls}
    try:
        return typing.get_type_hints(fn, localns=ns)
    except NameError as err:
        issues.add(
            f"{cls.__name__}.{fn.__name__}: cannot resolve annotation ({err}); define the "
            "model before the entity class, at module level"
        )
        return None
