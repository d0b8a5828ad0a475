"""An entity's state as data: declared by class annotations, versioned, upgraded by hooks.

The state of an entity is its instance attributes. Those annotated on the class
(`inbox: list[Reply]`, like a dataclass) are encoded to JSON through pydantic and
validated against today's annotations on restore, so a release may add an attribute
(it keeps its `__init__` value), add an optional field to a model (it takes its
default) or remove either (the stored value is dropped) with no code. Attributes that
are not annotated may hold plain JSON values (str, int, float, bool, None, and lists
and str-keyed dicts of them) and must be set by `__init__`; anything else must be
annotated. Other changes go through `state_version` and `@corral.upgrade` hooks: pure
functions over the stored state's dict, one per version step.

This module only declares; `corral.runtime.host._snapshot` reads and writes the JSON.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import TypeAdapter

from ._issues import DefinitionIssues

__all__ = ["StateSchema", "StateUpgrade", "UpgradeFn", "build_state_schema", "upgrade"]

UpgradeFn = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class StateUpgrade:
    """One step of an entity's state history: `fn` turns the saved state of version
    `from_version` into that of `from_version + 1`. Made by `@corral.upgrade`."""

    from_version: int
    fn: UpgradeFn

    def __call__(self, state: dict[str, Any]) -> dict[str, Any]:
        return self.fn(state)


def upgrade(*, from_version: int) -> Callable[[UpgradeFn], StateUpgrade]:
    """Declare, in an entity class body, how saved state of `from_version` becomes
    `from_version + 1`. The function takes and returns the state's dict (JSON values as
    stored: models are dicts), and is applied on restore, step by step, up to the class's
    `state_version`. Write it as a pure function: it may run more than once.

    Example:
        class Ticket(corral.Entity):
            state_version = 2
            priority: str          # was `urgent: bool` in version 1

            @corral.upgrade(from_version=1)
            def _urgent_to_priority(state: dict[str, Any]) -> dict[str, Any]:
                urgent = state.pop("urgent", False)
                return {**state, "priority": "high" if urgent else "normal"}
    """
    if isinstance(from_version, bool) or not isinstance(from_version, int) or from_version < 1:
        from corral._errors import EntityDefinitionError
        raise EntityDefinitionError(
            f"@corral.upgrade(from_version=...) takes a version >= 1, got {from_version!r}")

    def mark(fn: UpgradeFn) -> StateUpgrade:
        if not callable(fn):
            from corral._errors import EntityDefinitionError
            raise EntityDefinitionError(f"@corral.upgrade decorates a function; got {fn!r}")
        return StateUpgrade(from_version, fn)
    return mark


@dataclass(frozen=True, slots=True)
class StateSchema:
    """What a class declares about its state (built once, when the class is defined)."""

    version: int = 1
    """`state_version` of the class: the version its snapshots are written at."""
    fields: Mapping[str, TypeAdapter[Any]] = field(default_factory=dict)
    """The annotated attributes and how each is encoded and validated."""
    types: Mapping[str, Any] = field(default_factory=dict)
    """The annotation of each of `fields`, as declared (the manifest describes them)."""
    upgrades: Mapping[int, StateUpgrade] = field(default_factory=dict)
    """The declared hooks, by the version they upgrade from."""
    custom: bool = False
    """The class overrides `__getstate__`/`__setstate__`: its state is what they say."""


_NOT_STATE = frozenset({
    "id_reuse", "snapshots", "continue_as_new_policy", "retry", "dedupe_window",
    "idle_timeout", "early_signals", "placement", "ray_options", "mailbox", "name",
    "state_version",
})
"""Class attributes `Entity` reads as configuration: never part of the state."""


def build_state_schema(cls: type, localns: Mapping[str, Any], issues: DefinitionIssues, *,
                       custom: bool) -> StateSchema:
    """The state declared by `cls`: its version, annotated attributes and upgrade hooks.

    An annotation pydantic cannot encode, a bad `state_version` or a misplaced hook is
    added to `issues` (raised at class definition as one `EntityDefinitionError`).
    """
    version = getattr(cls, "state_version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        issues.add(f"{cls.__name__}.state_version must be an int >= 1, got {version!r}")
        version = 1
    declared = _types(cls, localns, issues)
    return StateSchema(version, fields={n: adapter for n, (_, adapter) in declared.items()},
                       types={n: hint for n, (hint, _) in declared.items()},
                       upgrades=_upgrades(cls, version, issues), custom=custom)


def _declared(cls: type) -> list[str]:
    """Names annotated in the class bodies of `cls` and its bases below `Entity`."""
    names: dict[str, None] = {}
    for klass in reversed(cls.__mro__):
        if klass.__module__ == "corral.actors._entity" or klass is object:
            continue
        for name in inspect.get_annotations(klass):
            if name not in _NOT_STATE and not name.startswith("_corral"):
                names[name] = None
    return list(names)


def _types(cls: type, localns: Mapping[str, Any], issues: DefinitionIssues
           ) -> dict[str, tuple[Any, TypeAdapter[Any]]]:
    """Each annotated attribute's annotation and its adapter."""
    names = _declared(cls)
    if not names:
        return {}
    try:
        hints = typing.get_type_hints(cls, localns={**localns, cls.__name__: cls},
                                      include_extras=True)
    except NameError as err:
        issues.add(f"{cls.__name__}: cannot resolve a state annotation ({err}); define the "
                   "model before the entity class, at module level")
        return {}
    fields: dict[str, tuple[Any, TypeAdapter[Any]]] = {}
    for name in names:
        hint: Any = hints.get(name)
        if typing.get_origin(hint) is ClassVar or hint is ClassVar:
            continue  # class-level, not state
        try:
            fields[name] = (hint, TypeAdapter(hint))
        except Exception as err:
            issues.add(
                f"{cls.__name__}.{name}: pydantic cannot encode `{_show(hint)}` in a snapshot "
                f"({type(err).__name__}: {str(err).splitlines()[0]}); annotate it with a "
                "pydantic model or JSON types, or mark it ClassVar if it is not state")
    return fields


def _upgrades(cls: type, version: int, issues: DefinitionIssues) -> dict[int, StateUpgrade]:
    found: dict[int, tuple[str, StateUpgrade]] = {}
    for klass in reversed(cls.__mro__):
        for attr, value in vars(klass).items():
            if not isinstance(value, StateUpgrade):
                continue
            step = value.from_version
            if step >= version:
                issues.add(
                    f"{klass.__name__}.{attr}: @corral.upgrade(from_version={step}) needs "
                    f"state_version > {step} (it is {version}); raise state_version to "
                    f"{step + 1}")
                continue
            other = found.get(step)
            if other is not None and other[0] != attr:
                issues.add(f"{cls.__name__}: two upgrades from version {step} (`{other[0]}` "
                           f"and `{attr}`); keep one")
            found[step] = (attr, value)
    return {step: up for step, (_, up) in sorted(found.items())}


def _show(hint: Any) -> str:
    return getattr(hint, "__qualname__", None) or repr(hint)
