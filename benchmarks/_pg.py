"""A throwaway PostgreSQL server for the benchmarks, and fresh databases on it.

The approach of `tests/support/pg.py`, without pytest: a cluster made with the newest installed
`initdb`/`pg_ctl` (Debian: `apt-get install postgresql`; or `CORRAL_PG_BINDIR`) in a temp
dir, listening on 127.0.0.1 at a free port only, with `fsync=on` and
`synchronous_commit=on` (every commit waits for its WAL flush, as a real deployment's
does), stopped (`pg_ctl stop -m fast`) and removed on the way out of `throwaway_server`,
also on Ctrl-C or SIGTERM. A benchmark killed with SIGKILL leaves its cluster behind;
the next one stops and removes it (its owner process is gone).

PostgreSQL refuses to run as root; as root the binaries run as the `postgres` system
user (`runuser -u postgres --`), in a temp dir handed to that user.

    with throwaway_server() as server:
        run(main(server))   # server.database("x") -> a fresh database's URL
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import asyncpg

SUPERUSER = "postgres"
INSTALL_HINT = ("PostgreSQL server binaries not found: install them with "
                "`apt-get install postgresql` (initdb and pg_ctl under "
                "/usr/lib/postgresql/<version>/bin), or set CORRAL_PG_BINDIR")
_PREFIX = "corral-bench-pg-"
T = TypeVar("T")
# Printed with the results: what durability and sizing the numbers were measured under.
SHOWN_SETTINGS = ("server_version", "fsync", "synchronous_commit", "wal_sync_method",
                  "full_page_writes", "wal_level", "shared_buffers", "max_wal_size",
                  "checkpoint_timeout", "max_connections")


class ServerUnavailable(RuntimeError):
    """No server binaries, or no `postgres` user to run them as root."""


def find_bindir() -> Path | None:
    """The directory holding `initdb`, `pg_ctl` and `postgres`, newest version first."""
    candidates = [os.environ.get("CORRAL_PG_BINDIR", "")]
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                         key=lambda p: _version_key(Path(p).parent.name), reverse=True)
    found = shutil.which("pg_ctl")
    if found:
        candidates.append(str(Path(found).parent))
    for c in candidates:
        if c and all((Path(c) / tool).is_file() for tool in ("initdb", "pg_ctl", "postgres")):
            return Path(c)
    return None


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(p) for p in name.split(".") if p.isdigit())


def _prefix() -> list[str]:
    """How to run a server binary: as ourselves, or as `postgres` when we are root."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam(SUPERUSER)
    except KeyError:
        raise ServerUnavailable("running as root and there is no `postgres` system user to "
                                "run the server as (`apt-get install postgresql` creates it)"
                                ) from None
    if shutil.which("runuser"):
        return ["runuser", "-u", SUPERUSER, "--"]
    return ["su", SUPERUSER, "-s", "/bin/sh", "-c", '"$0" "$@"']


def _run(*argv: str | Path, timeout: float = 120.0) -> str:
    cmd = [*_prefix(), *(str(a) for a in argv)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False,
                          cwd="/")
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}:\n"
                           f"{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def _free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _make_dir() -> Path:
    """A temp dir (mode 0700, owned by the server's user) beside a file naming us."""
    temp = Path(tempfile.mkdtemp(prefix=_PREFIX))
    Path(f"{temp}.owner").write_text(str(os.getpid()))
    if os.geteuid() == 0:
        entry = pwd.getpwnam(SUPERUSER)
        os.chown(temp, entry.pw_uid, entry.pw_gid)
    temp.chmod(0o700)
    return temp


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):  # a zombie (killed, not yet waited for) is gone
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    return True


def _remove(bindir: Path, temp: Path) -> None:
    if (temp / "data" / "postmaster.pid").exists():
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            _run(bindir / "pg_ctl", "stop", "-D", temp / "data", "-m", "fast", "-w",
                 "-t", "60")
    shutil.rmtree(temp, ignore_errors=True)
    Path(f"{temp}.owner").unlink(missing_ok=True)


def _reap_stale(bindir: Path) -> None:
    """Stop and remove the clusters of benchmarks killed before their cleanup ran."""
    for owner in Path(tempfile.gettempdir()).glob(f"{_PREFIX}*.owner"):
        try:
            if _alive(int(owner.read_text())):
                continue
        except (OSError, ValueError):
            continue
        _remove(bindir, Path(str(owner)[: -len(".owner")]))


def _start(bindir: Path, temp: Path) -> int:
    data, log = temp / "data", temp / "server.log"
    _run(bindir / "initdb", "-D", data, "-U", SUPERUSER, "--auth=trust", "--encoding=UTF8",
         "--locale=C", "--no-instructions")
    for attempt in range(5):  # another process may take the free port before we bind it
        port = _free_port()
        options = (f"-c listen_addresses=127.0.0.1 -c port={port} -c fsync=on "
                   f"-c synchronous_commit=on -c unix_socket_directories={temp} "
                   "-c max_connections=200")
        try:
            _run(bindir / "pg_ctl", "start", "-D", data, "-l", log, "-w", "-t", "60",
                 "-o", options)
            return port
        except RuntimeError:
            if attempt == 4:
                raise RuntimeError(f"postgres did not start:\n{_read(log)}") from None
    raise AssertionError("unreachable")


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError as err:
        return f"(cannot read {path}: {err})"


@dataclass(frozen=True)
class Server:
    """A running throwaway server; `database()` makes fresh databases on it."""

    bindir: Path
    temp: Path
    port: int

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

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
def throwaway_server(bindir: Path | None = None) -> Iterator[Server]:
    """Start a server in a temp dir; stop and remove it on the way out (Ctrl-C included).

    Raises:
        ServerUnavailable: no server binaries (see `INSTALL_HINT`), or root without a
            `postgres` user.
    """
    bindir = bindir or find_bindir()
    if bindir is None:
        raise ServerUnavailable(INSTALL_HINT)
    _prefix()  # fail early, before making anything, when there is no user to run as
    _reap_stale(bindir)
    previous = signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM cleans up like Ctrl-C
    temp = _make_dir()
    try:
        yield Server(bindir, temp, _start(bindir, temp))
    finally:
        _remove(bindir, temp)
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


def run_and_write(main: Callable[[Server | None], Coroutine[Any, Any, Any]], *,
                  postgres: bool, out: Path) -> None:
    """`run(main(server))` with a throwaway server (or None without `postgres`), then
    its result written to `out` as JSON; no server binaries stops with the hint."""
    try:
        server_cm = throwaway_server() if postgres else contextlib.nullcontext(None)
        with server_cm as server:
            data = run(main(server))
    except ServerUnavailable as err:
        raise SystemExit(f"{err}; or pass --no-postgres") from None
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1))
    print(f"wrote {out}")
