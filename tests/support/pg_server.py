"""A throwaway PostgreSQL cluster, without pytest: the one launcher of the test session
(`pg.py`) and of the benchmarks (`benchmarks/_pg.py`).

The cluster is made with the newest installed `initdb`/`pg_ctl` (Debian: `apt-get
install postgresql`; or `CORRAL_PG_BINDIR`) in a temp dir, listens on 127.0.0.1 at a
free port only, runs with `fsync=on` and `synchronous_commit=on` (the durability the
store promises is the real one), and is stopped and removed by its owner (or, if that
process was killed first, by the next one: `reap_stale`).

PostgreSQL refuses to run as root; as root the binaries run as the `postgres` system
user (`runuser -u postgres --`), in a temp dir handed to that user.
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
from pathlib import Path

__all__ = ["INSTALL_HINT", "SUPERUSER", "ServerUnavailable", "find_bindir", "make_dir",
           "reap_stale", "remove", "run_as_postgres", "start"]

INSTALL_HINT = ("PostgreSQL server binaries not found: install them with "
                "`apt-get install postgresql` (initdb and pg_ctl under "
                "/usr/lib/postgresql/<version>/bin), or set CORRAL_PG_BINDIR")
SUPERUSER = "postgres"


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
        raise ServerUnavailable(
            "running as root and there is no `postgres` system user to run the server as "
            "(`apt-get install postgresql` creates it)") from None
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


def _free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_dir(prefix: str) -> Path:
    """A temp dir owned by the user the server runs as (mode 0700, as initdb wants),
    beside a file naming this process (see `reap_stale`)."""
    _prefix()  # fail early, before making anything, when there is no user to run as
    temp = Path(tempfile.mkdtemp(prefix=prefix))
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


def remove(bindir: Path, temp: Path, *, mode: str = "fast") -> None:
    """Stop the cluster in `temp` (if it runs) and remove it."""
    if (temp / "data" / "postmaster.pid").exists():
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            run_as_postgres(bindir / "pg_ctl", "stop", "-D", temp / "data", "-m", mode,
                            "-w", "-t", "60")
    shutil.rmtree(temp, ignore_errors=True)
    Path(f"{temp}.owner").unlink(missing_ok=True)


def reap_stale(bindir: Path, prefix: str) -> None:
    """Stop and remove the clusters whose owner was killed before it removed them."""
    for owner in Path(tempfile.gettempdir()).glob(f"{prefix}*.owner"):
        try:
            if _alive(int(owner.read_text())):
                continue  # its owner is still running
        except (OSError, ValueError):
            continue
        remove(bindir, Path(str(owner)[: -len(".owner")]), mode="immediate")


def start(bindir: Path, temp: Path, *, settings: str = "") -> int:
    """Make a cluster in `temp` and start it (`settings`: more `-c name=value`); its port."""
    data, log = temp / "data", temp / "server.log"
    run_as_postgres(bindir / "initdb", "-D", data, "-U", SUPERUSER, "--auth=trust",
                    "--encoding=UTF8", "--locale=C", "--no-instructions")
    for attempt in range(5):  # another process may take the free port before we bind it
        port = _free_port()
        options = (f"-c listen_addresses=127.0.0.1 -c port={port} -c fsync=on "
                   f"-c synchronous_commit=on -c unix_socket_directories={temp} {settings}")
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
