"""`corral metrics`: the store's census as Prometheus series, one scrape for the whole
deployment (see `corral._scrape`); with `--namespace`, a Ray deployment's host actors'
series too (`corral.runtime.ray._host_metrics`)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from typing import Annotated

import typer

from corral._scrape import HostSeries, serve_census
from corral.persistence import open_store, stored_shards
from corral.runtime.client._options import check_namespace

from ._connection import StoreOption, check_listen_host
from ._failure import guard

__all__ = ["serve_metrics"]


def serve_metrics(
    ctx: typer.Context,
    store: StoreOption,
    port: Annotated[int, typer.Option(
        "--port", min=0, max=65535, help="The port to listen on (0: a free one).")] = 9464,
    host: Annotated[str, typer.Option(
        "--host", help="The address to listen on (loopback only by default).")] = "127.0.0.1",
    namespace: Annotated[str | None, typer.Option(
        "--namespace", envvar="CORRAL_NAMESPACE", show_envvar=True,
        help="A Ray deployment's namespace (open_runtime's namespace=): also serve the "
             "series of its host actors, pulled at each scrape and labelled host.",
        show_default=False)] = None,
    address: Annotated[str | None, typer.Option(
        "--address", envvar="RAY_ADDRESS", show_envvar=True, metavar="ADDRESS",
        help="With --namespace: the Ray cluster to connect to (default: auto).",
        show_default=False)] = None,
) -> None:
    """Serve the deployment's numbers from its store at http://HOST:PORT/metrics.

    Entities by type and status, backlog and the age of the oldest unapplied message,
    dead letters, open waits, suspended runs, live hosts and their builds: the
    corral_store_* series, read from the store at each scrape (a few aggregate queries),
    whatever backend hosts the entities. On Ray (--namespace), also what each host actor
    counts (messages accepted and applied, activations, resident entities...): the
    series a local host serves itself, under the same names, labelled host with the
    actor's name. Needs no --app. Runs until interrupted.
    """
    with guard(ctx, OSError):  # a bad namespace or host, no store there, a port taken
        check_listen_host(host)
        if namespace is not None:
            check_namespace(namespace)
        asyncio.run(_serve(store, host, port, namespace, address))


async def _serve(location: str, host: str, port: int, namespace: str | None,
                 address: str | None) -> None:
    store = await open_store(location, shards=await stored_shards(location))
    try:
        hosts: HostSeries | None = None
        if namespace is not None:
            hosts = _ray_hosts(namespace, address)
        bound = serve_census(store.census, port, host, hosts=hosts)
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


def _reachable(address: str | None) -> None:
    """A `host:port` with nothing listening fails at once (`ray.init` would retry for
    minutes); "auto", `ray://` and the environment's address are left to Ray."""
    if not address or address == "auto" or "://" in address:
        return
    where, _, port = address.rpartition(":")
    if not port.isdigit():
        return
    try:
        socket.create_connection((where.strip("[]"), int(port)), timeout=5).close()
    except OSError as err:
        raise ConnectionError(f"no Ray cluster answers at {address}: {err}") from None


def _ray_hosts(namespace: str, address: str | None) -> HostSeries:
    """Join the Ray cluster (a driver of its own); what pulls `namespace`'s host actors."""
    import ray  # only with --namespace: the other commands never import Ray

    from corral.runtime.client._options import check_address
    from corral.runtime.ray._host_metrics import pull_hosts

    if address is not None:
        check_address(address)
    _reachable(address)
    # On the main thread, before the handlers below: SIGTERM stays this command's.
    ray.init(address=address or "auto", namespace=namespace, log_to_driver=False)
    return lambda: pull_hosts(namespace)
