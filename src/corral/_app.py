"""What the operator tools (`corral` CLI, dashboard) load with `--app module:attribute`.

The attribute names the application's entity classes, so that every write from an
operator tool is validated against the same models and goes through the same
`authorize` hook as the application's own code:

- one `Entity` subclass;
- a list (or tuple) of `Entity` subclasses;
- or an object with an `entities` attribute (that list) and optionally `authorize`
  (the `open_runtime` hook), `limits` (the application's `Limits`) and `authenticate`
  (the dashboard's: request -> operator name, or None to refuse);
- or a callable taking no arguments that returns either of those.

Whatever goes wrong while loading it (the module raises or does not compile, the
callable raises or needs arguments, `entities` is not a list of entity types) is an
`InvalidArgumentError` naming `--app`, with the original error as its `__cause__`.

Example (`myapp/corral_app.py`):
    app = corral.App(entities=[TicketAgent, Cart], authorize=check_sender)
    # corral ls --app myapp.corral_app:app --store postgresql://...
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from corral._errors import InvalidArgumentError
from corral.actors import Entity
from corral.persistence import stored_shards
from corral.runtime import Limits, Runtime, open_runtime
from corral.runtime._app_path import import_attribute

__all__ = ["App", "load_app", "open_operator_runtime"]


@dataclass(frozen=True)
class App:
    """An application as the operator tools see it.

    Attributes:
        entities: every entity type the tools may address.
        authorize: the `open_runtime` authorize hook (None: the claimed sender is kept).
        authenticate: the dashboard's hook: given the HTTP request, the operator's name,
            or None to refuse it (None here: a bearer token given at start).
        limits: the application's input limits (`open_runtime(limits=...)`), so the
            tools accept and refuse what the application does (None: the defaults).
    """

    entities: Sequence[type[Entity]]
    authorize: Callable[..., Any] | None = None
    authenticate: Callable[[Any], Any] | None = field(default=None)
    limits: Limits | None = None


def load_app(spec: str | None = None) -> App:
    """The `App` named by `spec` (`module:attribute`; default: `$CORRAL_APP`).

    The current directory is importable, as for `python -m`.

    Raises:
        InvalidArgumentError: no spec, a module or attribute that is not there, a module
            or callable that raises, or an attribute that is not an application (see
            the module docstring).
    """
    spec = spec or os.environ.get("CORRAL_APP")
    if not spec:
        raise InvalidArgumentError(
            "which entity types? pass --app module:attribute (or set CORRAL_APP), naming "
            "a corral.Entity class, a list of them or a corral.App")
    return _as_app(spec, import_attribute(spec))


def _as_app(spec: str, value: Any) -> App:
    try:
        found = _found_app(value)
    except TypeError as err:  # `entities` is not iterable
        raise InvalidArgumentError(f"--app {spec}: {err}") from err
    if found is None:
        raise InvalidArgumentError(
            f"--app {spec}: expected a corral.Entity class, a list of them or a corral.App, "
            f"got {type(value).__name__}")
    bad = [e for e in found.entities if not (isinstance(e, type) and issubclass(e, Entity))]
    if bad or not found.entities:
        raise InvalidArgumentError(
            f"--app {spec}: {'no entity types' if not bad else f'not entity types: {bad!r}'}")
    names = [e._corral_definition.name for e in found.entities]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise InvalidArgumentError(f"--app {spec}: two entity types are named {twice[0]!r}")
    if found.limits is not None and not isinstance(found.limits, Limits):
        raise InvalidArgumentError(
            f"--app {spec}: limits must be a corral.Limits, got {type(found.limits).__name__}")
    return found


def _found_app(value: Any) -> App | None:
    """`value` as an `App` (its entities a tuple), or None if it is not one."""
    if isinstance(value, type) and issubclass(value, Entity):
        return App(entities=(value,))
    if isinstance(value, App):
        return App(entities=_entity_tuple(value.entities), authorize=value.authorize,
                   authenticate=value.authenticate, limits=value.limits)
    if isinstance(value, list | tuple):
        return App(entities=tuple(value))
    if hasattr(value, "entities"):
        return App(entities=_entity_tuple(value.entities),
                   authorize=getattr(value, "authorize", None),
                   authenticate=getattr(value, "authenticate", None),
                   limits=getattr(value, "limits", None))
    return None


def _entity_tuple(entities: Any) -> tuple[Any, ...]:
    if isinstance(entities, str | bytes) or not hasattr(entities, "__iter__"):
        raise TypeError(f"entities must be a list of entity types, got "
                        f"{type(entities).__name__}")
    return tuple(entities)


@contextlib.asynccontextmanager
async def open_operator_runtime(store: str, app: App, *, shards: int | None = None
                                ) -> AsyncIterator[Runtime]:
    """A pure client runtime (`host=False`) on the application's existing store, with
    its entity types, `authorize` hook and `Limits`: what the operator tools write
    through.

    The store must already be there (`stored_shards`): an operator tool never creates
    a store, adds corral's tables to another database or migrates one, and never
    opens `:memory:`, which would be gone (with whatever was written) when it exits.
    Its shard count is the store's own; `shards`, if given, must be that count.

    Raises:
        InvalidArgumentError: no corral store at `store`, or another shard count.
        StoreError: the store cannot be read, or has another schema version.
    """
    found = await stored_shards(store)
    if shards is not None and shards != found:
        raise InvalidArgumentError(
            f"--shards {shards}: the store was created with {found} shards (leave "
            f"--shards out to use the store's own count)")
    async with open_runtime(store, entities=app.entities, authorize=app.authorize,
                            limits=app.limits, shards=found, host=False) as rt:
        yield rt
