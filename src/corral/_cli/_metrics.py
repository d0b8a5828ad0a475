"""`corral metrics`: the store's census as Prometheus series, one scrape for the whole
deployment (see `corral._scrape`)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from typing import Annotated

import typer

from corral._scrape import serve_census
from corral.persistence import open_store, stored_shards

from ._connection import StoreOption
from ._errors import guard

__all__ = ["serve_metrics"]


def serve_metrics(
    ctx: typer.Context,
    store: StoreOption,
    port: Annotated[int, typer.Option(
        "--port", min=0, max=65535, help="The port to listen on (0: a free one).")] = 9464,
    host: Annotated[str, typer.Option(
        "--host", help="The address to listen on (loopback only by default).")] = "127.0.0.1",
) -> None:
    """Serve the deployment's numbers from its store at http://HOST:PORT/metrics.

    Entities by type and status, backlog and the age of the oldest unapplied message,
    dead letters, open waits, suspended runs, live hosts and their builds: the
    corral_store_* series, read from the store at each scrape (a few aggregate queries),
    whatever backend hosts the entities. Needs no --app. Runs until interrupted.
    """
    with guard(ctx, OSError):  # no store there, a port taken
        asyncio.run(_serve(store, host, port))


async def _serve(location: str, host: str, port: int) -> None:
    store = await open_store(location, shards=await stored_shards(location))
    try:
        bound = serve_census(store.census, port, host)
        shown = f"[{host}]" if ":" in host else host
        print(f"corral metrics: http://{shown}:{bound}/metrics", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):  # not on Windows
                loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await store.close()
