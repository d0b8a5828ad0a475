"""The options every operator command shares, and the runtime they open.

The CLI is a pure client (`host=False`): it validates and stores, and the
application's own hosts apply what it sends. It never creates a store: a SQLite path
that does not exist is an error rather than a new, empty store.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, TypeVar, cast

import typer

import corral
from corral._app import load_app
from corral._errors import InvalidArgumentError
from corral.actors import Entity
from corral.persistence import is_postgres_url

from ._errors import execute

__all__ = ["AppOption", "Connection", "JsonFlag", "KeyArgument", "SenderOption", "ShardsOption",
           "StoreOption", "TypeArgument", "entity_class", "existing_store"]

T = TypeVar("T")

_PANEL = "Connection"
_MEMORY = (":memory:", "sqlite://:memory:", "sqlite:///:memory:")

StoreOption = Annotated[str, typer.Option(
    "--store", envvar="CORRAL_STORE", show_envvar=True, metavar="STORE",
    rich_help_panel=_PANEL,
    help="The application's store: a SQLite file (or sqlite:///path) or a postgresql:// URL.")]
AppOption = Annotated[str, typer.Option(
    "--app", envvar="CORRAL_APP", show_envvar=True, metavar="MODULE:ATTRIBUTE",
    rich_help_panel=_PANEL,
    help="The application's entity types: a list of corral.Entity classes or a corral.App "
         "(the current directory is importable).")]
ShardsOption = Annotated[int, typer.Option(
    "--shards", envvar="CORRAL_SHARDS", show_envvar=True, min=1, rich_help_panel=_PANEL,
    help="The store's shard count, as the application opens it.")]
JsonFlag = Annotated[bool, typer.Option(
    "--json", help="Print JSON for scripts instead of a table.")]
TypeArgument = Annotated[str, typer.Argument(
    metavar="TYPE", help="An entity type of the application (its class name).",
    show_default=False)]
KeyArgument = Annotated[str, typer.Argument(
    metavar="KEY", help="The entity's key.", show_default=False)]
SenderOption = Annotated[str | None, typer.Option(
    "--sender", metavar="SENDER",
    help="The sender to claim; the application's authorize hook decides what is recorded.")]


@dataclass(frozen=True)
class Connection:
    """Where a command's runtime connects (`--store`, `--app`, `--shards`)."""

    store: str
    app: str
    shards: int = 16

    def run(self, ctx: typer.Context, work: Callable[[corral.Runtime], Awaitable[T]]) -> T:
        """Open the runtime, run `work` on it and close it; errors as `execute` says."""
        return execute(ctx, self._run(work))

    async def _run(self, work: Callable[[corral.Runtime], Awaitable[T]]) -> T:
        store = existing_store(self.store)
        app = load_app(self.app)
        async with corral.open_runtime(store, entities=app.entities, authorize=app.authorize,
                                       shards=self.shards, host=False) as rt:
            return await work(rt)


def existing_store(location: str) -> str:
    """`location`, checked to name a store that may exist: a PostgreSQL URL, or a
    SQLite file that is there (opening a missing one would create an empty store).

    Raises:
        InvalidArgumentError: the SQLite file does not exist.
    """
    if is_postgres_url(location) or location in _MEMORY:
        return location
    path = location[len("sqlite:///"):] if location.startswith("sqlite:///") else location
    if not os.path.isfile(path):
        raise InvalidArgumentError(
            f"--store {location}: no such SQLite file (a store is created by the "
            f"application that first opens it, never by this command)")
    return location


def entity_class(rt: corral.Runtime, name: str) -> type[Entity]:
    """The registered entity class named `name`.

    Raises:
        UnknownEntityTypeError: the application registers no type of that name.
    """
    return cast("type[Entity]", rt.boundary.definition(name).cls)
