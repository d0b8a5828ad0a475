"""`run`: the dashboard as a blocking server, what `corral ui` starts."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
from types import FrameType

import uvicorn

import corral
from corral._app import open_operator_runtime

from ._auth import check_token
from ._routes import create_app

__all__ = ["run"]


class _Server(uvicorn.Server):
    """uvicorn's server, except that SIGINT and SIGTERM stop it and `run` returns (so the
    runtime closes), rather than being raised again once it stopped."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit:
            self.force_exit = True  # a second signal: stop waiting for open connections
        self.should_exit = True


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on `host:port` (raises `OSError` if it is taken)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


async def _serve(store: str, app: corral.App, host: str, port: int, token: str | None,
                 shards: int | None) -> None:
    async with open_operator_runtime(store, app, shards=shards) as rt:
        web = create_app(rt, authenticate=app.authenticate, token=token)
        with contextlib.closing(_bind(host, port)) as sock:
            bound = sock.getsockname()[1]
            shown = f"[{host}]" if ":" in host else host
            url = f"http://{shown}:{bound}/"
            print(f"corral dashboard: {url}", flush=True)
            if token is not None:
                print(f"token: {token}", flush=True)
                print(f"sign in: {url}login?token={token}", flush=True)
            config = uvicorn.Config(web, log_level="warning", lifespan="off",
                                    access_log=False, server_header=False)
            await _Server(config).serve(sockets=[sock])


def run(store: str, app: corral.App, *, host: str = "127.0.0.1", port: int = 8765,
        token: str | None = None, shards: int | None = None) -> None:
    """Serve the dashboard on `host:port` until interrupted (Ctrl-C or SIGTERM).

    Opens a pure client runtime on `store` (`host=False`: an operator tool hosts no
    shards; the application's processes apply what it delivers) with the application's
    entity types, `authorize` hook and `Limits`. The store must exist: the dashboard
    never creates or migrates one, and uses the shard count the store was created with
    (`shards`, if given, must be that count). Unless the application authenticates operators
    itself (`app.authenticate`), they sign in with a bearer token: `token`, or one made
    with `secrets.token_urlsafe` and printed with the URL. Port 0 picks a free port
    (the printed URL has it).

    Raises:
        ValueError: both `token` and `app.authenticate` were given, or a token shorter
            than 16 characters.
        OSError: the port is taken.
        InvalidArgumentError: no corral store at `store` (or not `shards` shards).

    Example:
        corral.dashboard.run("corral.db", corral.App(entities=[Order]), port=8765)
    """
    if app.authenticate is not None and token is not None:
        raise ValueError("the application authenticates operators itself "
                         "(app.authenticate); do not also pass a token")
    if app.authenticate is None and token is None:
        token = secrets.token_urlsafe(32)
    if token is not None:
        check_token(token)  # before the runtime opens
    asyncio.run(_serve(store, app, host, port, token, shards))
