"""Entity classes named by import path (`"pkg.module:attribute"`): how a release names
its code, so that every process of a Ray deployment imports it for itself.

A Ray host actor never receives entity classes from a client: it imports them from
the release's app path inside the release's `runtime_env` (`ray._release`), so the
code it runs is the release's, whoever declared it. The operator tools' `--app`
(`corral._app.load_app`) reads the same paths.

An app path is one `module:attribute` naming an Entity class, a list of them, an
object with an `entities` list (a `corral.App`), or a callable returning one; or
several such paths joined by "," (what `open_runtime(..., deploy=True)` declares for
the caller's classes, `app_path`).

Example:
    load_entities("ticketdesk.agent:app")      # (TicketAgent, Cart)
    app_path([TicketAgent, Cart])              # "ticketdesk.agent:TicketAgent,..."
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

from corral._errors import InvalidArgumentError
from corral.actors import Entity

__all__ = ["app_path", "import_attribute", "load_entities"]


def import_attribute(spec: str, *, option: str = "--app") -> Any:
    """The attribute `spec` (`module:attribute`) names, called if it is a function.
    The current directory is importable, as for `python -m`.

    Raises:
        InvalidArgumentError: naming `option`: not `module:attribute`, a module or
            attribute that is not there, or a module or callable that raises.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise InvalidArgumentError(f"{option} must be module:attribute, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise InvalidArgumentError(
            f"{option} {spec}: cannot import {module_name!r}: {err}") from err
    except Exception as err:  # the application's module itself fails
        raise InvalidArgumentError(
            f"{option} {spec}: importing {module_name!r} raised {_named(err)}") from err
    try:
        value = getattr(module, attr)
    except AttributeError:
        raise InvalidArgumentError(f"{option} {spec}: {module_name} has no {attr!r}") from None
    if callable(value) and not isinstance(value, type):
        try:
            value = value()
        except Exception as err:
            raise InvalidArgumentError(
                f"{option} {spec}: calling {attr}() raised {_named(err)}") from err
    return value


def _named(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


def load_entities(spec: str) -> tuple[type[Entity], ...]:
    """The entity classes an app path names (several paths: all of their classes).

    Raises:
        InvalidArgumentError: a path that does not import, or names no entity classes,
            or two types of one name.
    """
    found: list[type[Entity]] = []
    for part in spec.split(","):
        value = import_attribute(part.strip(), option="app")
        if isinstance(value, type) and issubclass(value, Entity):
            found.append(value)
            continue
        entities = getattr(value, "entities", value)
        if isinstance(entities, str | bytes) or not isinstance(entities, Sequence):
            raise InvalidArgumentError(
                f"app {part}: expected a corral.Entity class, a list of them or a "
                f"corral.App, got {type(value).__name__}")
        bad = [e for e in entities if not (isinstance(e, type) and issubclass(e, Entity))]
        if bad or not entities:
            raise InvalidArgumentError(
                f"app {part}: {'no entity types' if not bad else f'not entity types: {bad!r}'}")
        found.extend(entities)
    names = [cls._corral_definition.name for cls in found]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise InvalidArgumentError(f"app {spec}: two entity types are named {twice[0]!r}")
    return tuple(found)


def app_path(entities: Sequence[type[Entity]]) -> str:
    """The app path of `entities` (each `module:QualName`, joined by ","): what a Ray
    host imports to run them.

    Raises:
        InvalidArgumentError: a class another process cannot import by name (defined in
            `__main__`, i.e. a script, or inside a function), naming the fix.
    """
    if not entities:
        raise InvalidArgumentError("a release needs at least one entity type")
    paths = []
    for cls in entities:
        if cls.__module__ == "__main__" or "<locals>" in cls.__qualname__:
            where = "a script (__main__)" if cls.__module__ == "__main__" else "a function"
            raise InvalidArgumentError(
                f"{cls.__qualname__} is defined in {where}: Ray hosts import a release's "
                f"entity classes by module path, so define it at the top level of a "
                f"module (and run your script with the module importable)")
        paths.append(f"{cls.__module__}:{cls.__qualname__}")
    return ",".join(paths)
