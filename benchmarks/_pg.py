"""A throwaway PostgreSQL server for the benchmarks, and fresh databases on it.

The tests' launcher (`tests/support/pg_server.py`), without pytest: a cluster with
`fsync=on` and `synchronous_commit=on` (every commit waits for its WAL flush, as a real
deployment's does), stopped and removed on the way out of `throwaway_server`, also on
Ctrl-C or SIGTERM. A benchmark killed with SIGKILL leaves its cluster behind; the next
one stops and removes it (its owner process is gone).

    with throwaway_server() as server:
        run(main(server))   # server.database("x") -> a fresh database's URL
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import asyncpg

# The tests' launcher, one for both.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
import pg_server as launcher
from pg_server import ServerUnavailable

__all__ = ["SHOWN_SETTINGS", "Server", "ServerUnavailable", "arguments", "machine", "on_stores",
           "run", "run_and_write", "throwaway_server"]

_PREFIX = "corral-bench-pg-"
T = TypeVar("T")
# Printed with the results: what durability and sizing the numbers were measured under.
SHOWN_SETTINGS = ("server_version", "fsync", "synchronous_commit", "wal_sync_method",
                  "full_page_writes", "wal_level", "shared_buffers", "max_wal_size",
                  "checkpoint_timeout", "max_connections")


@dataclass(frozen=True)
class Server:
    """A running throwaway server; `database()` makes fresh databases on it."""

    bindir: Path
    temp: Path
    port: int

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{launcher.SUPERUSER}@127.0.0.1:{self.port}/{database}"

    async def settings(self) -> dict[str, str]:
        """The live values of `SHOWN_SETTINGS` (as the server reports them)."""
        conn = await asyncpg.connect(self.url())
        try:
            return {name: await conn.fetchval(f"SHOW {name}") for name in SHOWN_SETTINGS}
        finally:
            await conn.close()

    @contextlib.asynccontextmanager
    async def database(self, name: str) -> AsyncIterator[str]:
        """A fresh, empty database `name` (its URL), dropped on the way out."""
        await self._admin(f'CREATE DATABASE "{name}"')
        try:
            yield self.url(name)
        finally:
            await self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    async def _admin(self, statement: str) -> None:
        conn = await asyncpg.connect(self.url())
        try:
            await conn.execute(statement)
        finally:
            await conn.close()


@contextlib.contextmanager
def throwaway_server(bindir: Path | None = None, *, settings: str = "") -> Iterator[Server]:
    """Start a server in a temp dir; stop and remove it on the way out (Ctrl-C included).

    `settings`: more `-c name=value` (`scale.py` loads `pg_stat_statements` so).

    Raises:
        ServerUnavailable: no server binaries (see `INSTALL_HINT`), or root without a
            `postgres` user.
    """
    bindir = bindir or launcher.find_bindir()
    if bindir is None:
        raise ServerUnavailable(launcher.INSTALL_HINT)
    temp = launcher.make_dir(_PREFIX)  # fails early when there is no user to run as
    launcher.reap_stale(bindir, _PREFIX)
    previous = signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM cleans up like Ctrl-C
    try:
        port = launcher.start(bindir, temp, settings=f"-c max_connections=200 {settings}")
        yield Server(bindir, temp, port)
    finally:
        launcher.remove(bindir, temp)
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)`, with SIGTERM cancelling `main` the way Ctrl-C does (then
    KeyboardInterrupt), so every `finally` and `async with` exit runs: raising from a
    signal handler at an arbitrary point could leave a store's thread running, and the
    process would hang at exit."""

    async def guarded() -> T:
        loop, task = asyncio.get_running_loop(), asyncio.current_task()
        assert task is not None
        terminated: list[bool] = []

        def terminate() -> None:
            terminated.append(True)
            task.cancel()

        previous = signal.getsignal(signal.SIGTERM)
        loop.add_signal_handler(signal.SIGTERM, terminate)
        try:
            return await main
        except asyncio.CancelledError:
            if terminated:
                raise KeyboardInterrupt("SIGTERM") from None
            raise
        finally:
            loop.remove_signal_handler(signal.SIGTERM)
            signal.signal(signal.SIGTERM, previous)

    return asyncio.run(guarded())


def arguments(doc: str | None, quick: str) -> argparse.ArgumentParser:
    """The options every benchmark takes (`--quick`, described by `quick`; `--no-postgres`;
    `--out`), with `doc`'s first line as its description; add a script's own to it."""
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--no-postgres", action="store_true",
                        help="SQLite only (no PostgreSQL server is started)")
    parser.add_argument("--out", help="where to write the JSON results (default: "
                        "results/<benchmark>.json, or <benchmark>-quick.json with --quick)")
    return parser


async def on_stores(name: str, server: Server | None,
                    measure: Callable[[str], Awaitable[T]]) -> dict[str, T]:
    """`measure(store)` on a fresh SQLite file, then (with a server) on a fresh database
    named `name`; the results by store ("sqlite", "postgres")."""
    results: dict[str, T] = {}
    with tempfile.TemporaryDirectory(prefix=f"corral-{name}-db-") as tmp:
        print("sqlite:", flush=True)
        results["sqlite"] = await measure(str(Path(tmp) / f"{name}.db"))
    if server is not None:
        print("postgres:", flush=True)
        async with server.database(name) as url:
            results["postgres"] = await measure(url)
    return results


def machine(**more: Any) -> dict[str, Any]:
    """What a result was measured on: CPUs, Python, the load average now, and `more`."""
    return {"cpus": os.cpu_count(), "python": platform.python_version(), **more,
            "load_avg": os.getloadavg()}


def run_and_write(main: Callable[[Server | None], Coroutine[Any, Any, Any]], *,
                  args: argparse.Namespace, name: str) -> None:
    """`run(main(server))` with a throwaway server (or None with `--no-postgres`), then
    its result written as JSON to `--out` (default `results/<name>.json`, with `--quick`
    `results/<name>-quick.json`: a smoke run never overwrites a full one); no server
    binaries stops with the hint."""
    results = Path(__file__).resolve().parent / "results"
    out = Path(args.out) if args.out else \
        results / (f"{name}-quick.json" if getattr(args, "quick", False) else f"{name}.json")
    try:
        server_cm = throwaway_server() if not args.no_postgres else contextlib.nullcontext(None)
        with server_cm as server:
            data = run(main(server))
    except ServerUnavailable as err:
        raise SystemExit(f"{err}; or pass --no-postgres") from None
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1))
    print(f"wrote {out}")
