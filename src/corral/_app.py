"""What the operator tools (`corral` CLI, dashboard) load with `--app module:attribute`.

The attribute names the application's entity classes, so that every write from an
operator tool is validated against the same models and goes through the same
`authorize` hook as the application's own code:

- a list (or tuple) of `Entity` subclasses;
- or an object with an `entities` attribute (that list) and optionally `authorize`
  (the `open_runtime` hook) and `authenticate` (the dashboard's: request -> operator
  name, or None to refuse);
- or a callable taking no arguments that returns either of those.

Example (`myapp/corral_app.py`):
    app = corral.App(entities=[TicketAgent, Cart], authorize=check_sender)
    # corral ls --app myapp.corral_app:app --store postgresql://...
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from corral._errors import InvalidArgumentError
from corral.actors import Entity

__all__ = ["App", "load_app"]


@dataclass(frozen=True)
class App:
    """An application as the operator tools see it.

    Attributes:
        entities: every entity type the tools may address.
        authorize: the `open_runtime` authorize hook (None: the claimed sender is kept).
        authenticate: the dashboard's hook: given the HTTP request, the operator's name,
            or None to refuse it (None here: a bearer token given at start).
    """

    entities: Sequence[type[Entity]]
    authorize: Callable[..., Any] | None = None
    authenticate: Callable[[Any], Any] | None = field(default=None)


def load_app(spec: str | None = None) -> App:
    """The `App` named by `spec` (`module:attribute`; default: `$CORRAL_APP`).

    The current directory is importable, as for `python -m`.

    Raises:
        InvalidArgumentError: no spec, a module or attribute that is not there, or an
            attribute that is not an application (see the module docstring).
    """
    spec = spec or os.environ.get("CORRAL_APP")
    if not spec:
        raise InvalidArgumentError(
            "which entity types? pass --app module:attribute (or set CORRAL_APP), naming "
            "a list of corral.Entity classes or a corral.App")
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise InvalidArgumentError(f"--app must be module:attribute, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise InvalidArgumentError(f"--app {spec}: cannot import {module_name!r}: {err}") from None
    try:
        value = getattr(module, attr)
    except AttributeError:
        raise InvalidArgumentError(f"--app {spec}: {module_name} has no {attr!r}") from None
    return _as_app(spec, value() if callable(value) and not isinstance(value, type) else value)


def _as_app(spec: str, value: Any) -> App:
    if isinstance(value, App):
        found: App = value
    elif isinstance(value, list | tuple):
        found = App(entities=tuple(value))
    elif hasattr(value, "entities"):
        found = App(entities=tuple(value.entities), authorize=getattr(value, "authorize", None),
                    authenticate=getattr(value, "authenticate", None))
    else:
        raise InvalidArgumentError(
            f"--app {spec}: expected a list of corral.Entity classes or a corral.App, got "
            f"{type(value).__name__}")
    bad = [e for e in found.entities if not (isinstance(e, type) and issubclass(e, Entity))]
    if bad or not found.entities:
        raise InvalidArgumentError(
            f"--app {spec}: {'no entity types' if not bad else f'not entity types: {bad!r}'}")
    return found
