"""A throwaway PostgreSQL cluster for the test session (`postgres_url`), and helpers.

A plain module, like `procs`: a test module or a conftest imports the fixtures
`postgres_url` (session) and `pg_url` (a fresh database per test; it needs
`postgres_url` imported too), under any name: they are registered by their own names,
so `from pg import pg_url as pg_fixture` keeps a test's `pg_url` parameter from
shadowing the import. The cluster is made with the newest installed `initdb`/`pg_ctl`
(Debian: `apt-get install postgresql`; PostgreSQL 15 here) in a temp dir, listens on
127.0.0.1 at a free port only, runs with `fsync=on` and `synchronous_commit=on` (the
durability the store promises is the real one), and is stopped (`pg_ctl stop -m fast`)
and removed at the end of the session (or, if that session was killed first, by the
next one).

PostgreSQL refuses to run as root; as root the binaries run as the `postgres` system
user (`runuser -u postgres --`), in a temp dir handed to that user.

Without the binaries the tests that use the fixture are skipped with a line saying how
to install them, unless `CORRAL_REQUIRE_POSTGRES=1`, which turns the skip into a failure.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

__all__ = [
    "create_database",
    "find_bindir",
    "pg_url",
    "postgres_url",
    "restart_postgres",
    "run_as_postgres",
]

INSTALL_HINT = ("PostgreSQL server binaries not found: install them with "
                "`apt-get install postgresql` (initdb and pg_ctl under "
                "/usr/lib/postgresql/<version>/bin), or set CORRAL_PG_BINDIR")
SUPERUSER = "postgres"
_PREFIX = "corral-pg-"
_CLUSTERS: dict[int, Path] = {}  # port -> temp dir of a cluster this session started


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
        _unavailable("running as root and there is no `postgres` system user to run the "
                     "server as (`apt-get install postgresql` creates it)")
    if shutil.which("runuser"):
        return ["runuser", "-u", SUPERUSER, "--"]
    return ["su", SUPERUSER, "-s", "/bin/sh", "-c", '"$0" "$@"']


def run_as_postgres(*argv: str | Path, timeout: float = 120.0) -> str:
    """Run one server tool (as `postgres` when we are root); its output, or a failure."""
    cmd = [*_prefix(), *(str(a) for a in argv)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False,
                          cwd="/")
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}:\n"
                           f"{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def _unavailable(why: str) -> None:
    if os.environ.get("CORRAL_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"CORRAL_REQUIRE_POSTGRES=1 but {why}", pytrace=False)
    pytest.skip(why)


def _free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _make_dir() -> Path:
    """A temp dir owned by the user the server runs as (mode 0700, as initdb wants),
    beside a file naming this process (see `_reap_stale`)."""
    temp = Path(tempfile.mkdtemp(prefix=_PREFIX))
    Path(f"{temp}.owner").write_text(str(os.getpid()))
    if os.geteuid() == 0:
        entry = pwd.getpwnam(SUPERUSER)
        os.chown(temp, entry.pw_uid, entry.pw_gid)
    temp.chmod(0o700)
    return temp


def _alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, killed but not yet waited for, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc here: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat.rpartition(")")[2].split()[0] != "Z"


def _reap_stale(bindir: Path) -> None:
    """Stop and remove the clusters of test sessions that were killed before their
    teardown ran (their owner process is gone)."""
    for owner in Path(tempfile.gettempdir()).glob(f"{_PREFIX}*.owner"):
        temp = Path(str(owner)[: -len(".owner")])
        try:
            if _alive(int(owner.read_text())):
                continue  # its session is still running
        except (OSError, ValueError):
            continue
        if (temp / "data" / "postmaster.pid").exists():
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                run_as_postgres(bindir / "pg_ctl", "stop", "-D", temp / "data", "-m",
                                "immediate", "-w", "-t", "30")
        shutil.rmtree(temp, ignore_errors=True)
        Path(f"{temp}.owner").unlink(missing_ok=True)
        owner.unlink(missing_ok=True)


def _start(bindir: Path, temp: Path) -> int:
    data, log = temp / "data", temp / "server.log"
    run_as_postgres(bindir / "initdb", "-D", data, "-U", SUPERUSER, "--auth=trust",
                    "--encoding=UTF8", "--locale=C", "--no-instructions")
    for attempt in range(5):  # another process may take the free port before we bind it
        port = _free_port()
        options = (f"-c listen_addresses=127.0.0.1 -c port={port} -c fsync=on "
                   f"-c synchronous_commit=on -c unix_socket_directories={temp} "
                   "-c max_connections=300 -c shared_buffers=64MB")
        try:
            run_as_postgres(bindir / "pg_ctl", "start", "-D", data, "-l", log, "-w",
                            "-t", "60", "-o", options)
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


def create_database(bindir: Path, port: int, name: str | None = None) -> str:
    """Create a fresh database on the session cluster; its `postgresql://` URL."""
    name = name or f"corral_{uuid.uuid4().hex[:12]}"
    run_as_postgres(bindir / "createdb", "-h", "127.0.0.1", "-p", str(port), "-U", SUPERUSER,
                    name)
    return f"postgresql://{SUPERUSER}@127.0.0.1:{port}/{name}"


@pytest.fixture(scope="session", name="postgres_url")
def postgres_url() -> Iterator[str]:
    """Start a PostgreSQL cluster for the session; yields the URL of a fresh database.

    Tests that need a database of their own (most do) use `pg_url` instead.
    """
    bindir = find_bindir()
    if bindir is None:
        _unavailable(INSTALL_HINT)
        raise AssertionError("unreachable")
    _reap_stale(bindir)
    temp = _make_dir()
    port: int | None = None
    try:
        port = _start(bindir, temp)
        _CLUSTERS[port] = temp
        yield create_database(bindir, port, "corral")
    finally:
        if port is not None:
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                run_as_postgres(bindir / "pg_ctl", "stop", "-D", temp / "data", "-m", "fast",
                                "-w", "-t", "60")
        shutil.rmtree(temp, ignore_errors=True)
        Path(f"{temp}.owner").unlink(missing_ok=True)


def restart_postgres(url: str) -> None:
    """Restart the session's cluster that serves `url` (fast: every connection drops)."""
    bindir, port = find_bindir(), urlsplit(url).port
    assert bindir is not None
    assert port in _CLUSTERS, f"{url} is not a cluster of this session"
    temp = _CLUSTERS[port]
    run_as_postgres(bindir / "pg_ctl", "restart", "-D", temp / "data", "-m", "fast", "-w",
                    "-t", "60", "-l", temp / "server.log")


@pytest.fixture(name="pg_url")
def pg_url(postgres_url: str) -> str:
    """A fresh, empty database on the session cluster for one test; its URL."""
    bindir = find_bindir()
    assert bindir is not None  # postgres_url skipped otherwise
    port = urlsplit(postgres_url).port
    assert port is not None
    return create_database(bindir, port)
