"""The options every operator command shares, and the runtime they open.

The CLI is a pure client (`host=False`): it validates and stores, and the
application's own hosts apply what it sends. It never creates, converts or migrates a
store (`corral.persistence.stored_shards`): a SQLite path that does not exist, a file
or database without corral's tables, and `:memory:` are errors, and the shard count
is the store's own.

A client's connection to where its entities live, as `corral.runtime.ray._connection`
is the Ray backend's to a deployment's host actors, hence the shared name.
"""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Any, TypeVar, cast

import typer

import corral
from corral._app import App, load_app, open_operator_runtime
from corral._errors import InvalidArgumentError, UnknownEntityTypeError
from corral.actors import Entity

from ._failure import execute
from ._input import read_payload

__all__ = ["AppOption", "Connection", "JsonFlag", "KeyArgument", "RayAddressOption",
           "RayNamespaceOption", "SenderOption", "ShardsOption", "StoreOption", "TypeArgument",
           "check_listen_host", "entity_class"]

T = TypeVar("T")

_PANEL = "Connection"

StoreOption = Annotated[str, typer.Option(
    "--store", envvar="CORRAL_STORE", show_envvar=True, metavar="STORE",
    rich_help_panel=_PANEL,
    help="The application's store: a SQLite file (or sqlite:///path) or a postgresql:// URL.")]
AppOption = Annotated[str, typer.Option(
    "--app", envvar="CORRAL_APP", show_envvar=True, metavar="MODULE:ATTRIBUTE",
    rich_help_panel=_PANEL,
    help="The application's entity types: a module attribute that is one corral.Entity "
         "class, a list of them, or a corral.App (the current directory is importable).")]
ShardsOption = Annotated[int | None, typer.Option(
    "--shards", envvar="CORRAL_SHARDS", show_envvar=True, min=1, rich_help_panel=_PANEL,
    help="The store's shard count, checked against the store (default: read from it).",
    show_default=False)]
RayNamespaceOption = Annotated[str, typer.Option(
    "--namespace", envvar="CORRAL_NAMESPACE", show_envvar=True, rich_help_panel=_PANEL,
    help="The Ray deployment's namespace (open_runtime's namespace=).")]
RayAddressOption = Annotated[str | None, typer.Option(
    "--address", envvar="RAY_ADDRESS", show_envvar=True, metavar="ADDRESS",
    rich_help_panel=_PANEL, help="The Ray cluster to connect to (default: auto).",
    show_default=False)]
JsonFlag = Annotated[bool, typer.Option(
    "--json", help="Print JSON for scripts instead of a table or a line.")]
TypeArgument = Annotated[str, typer.Argument(
    metavar="TYPE", help="An entity type of the application (its class name).",
    show_default=False)]
KeyArgument = Annotated[str, typer.Argument(
    metavar="KEY", help="The entity's key.", show_default=False)]
SenderOption = Annotated[str | None, typer.Option(
    "--sender", metavar="SENDER",
    help="The sender to claim; the application's authorize hook decides whether the command "
         "may run and, for a write, what is recorded.")]


@dataclass(frozen=True)
class Connection:
    """Where a command's runtime connects (`--store`, `--app`, `--shards`)."""

    store: str
    app: str
    shards: int | None = None

    @cached_property
    def application(self) -> App:
        """The `--app`, loaded once (its payload limit is needed before the runtime opens).

        Raises:
            InvalidArgumentError: it does not load or build (`load_app`).
        """
        return load_app(self.app)

    def payload(self, text: str | None, option: str = "--payload") -> Any:
        """The JSON value of a payload option (`_input.read_payload`), a file or stdin
        read up to the application's `Limits.max_payload_bytes`."""
        limits = self.application.limits or corral.Limits()
        return read_payload(text, option, max_bytes=limits.max_payload_bytes)

    def call(self, ctx: typer.Context, work: Callable[[corral.Runtime], Awaitable[T]]) -> T:
        """Open the runtime, call `work` on it and close it; errors as `execute` says."""
        return execute(ctx, self._call(work))

    async def _call(self, work: Callable[[corral.Runtime], Awaitable[T]]) -> T:
        async with open_operator_runtime(self.store, self.application,
                                         shards=self.shards) as rt:
            return await work(rt)


def entity_class(rt: corral.Runtime, name: str) -> type[Entity]:
    """The registered entity class named `name`.

    Raises:
        UnknownEntityTypeError: the `--app` has no type of that name (the message says
            which it has, and that `--app` names the application).
    """
    try:
        return cast("type[Entity]", rt.boundary.definition(name).cls)
    except UnknownEntityTypeError as err:
        raise UnknownEntityTypeError(
            f"the --app has no entity type {name!r} (its types: "
            f"{sorted(rt.boundary.definitions)}); pass --app module:attribute naming the "
            "application that declares it (or set CORRAL_APP)") from err


def check_listen_host(host: str) -> None:
    """Check `--host` of a command that serves (`ui`, `metrics`) before it opens anything.

    Raises:
        InvalidArgumentError: `host` is no address at all (`256.0.0.1`, a name that does
            not resolve). A resolver that cannot answer now (`EAI_AGAIN`) is left to the
            bind, a failure rather than bad input.
    """
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as err:
        if err.errno == socket.EAI_AGAIN:
            return
        raise InvalidArgumentError(f"--host {host}: not an address to listen on ({err})"
                                   ) from None
    except UnicodeError as err:  # a label of over 63 characters
        raise InvalidArgumentError(f"--host {host}: not an address to listen on ({err})"
                                   ) from None
