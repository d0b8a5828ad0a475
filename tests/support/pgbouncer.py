"""A throwaway PgBouncer in transaction mode in front of a test database (`bouncer`).

It runs as the `postgres` system user when we are root (PgBouncer refuses root), from
an ini and a user list written to a temp dir, on a free port, with `auth_type = trust`
as the session's cluster has. Without the binary the test is skipped with a line saying
how to install it, unless `CORRAL_REQUIRE_PGBOUNCER=1` (CI), which fails it instead.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from pg_server import SUPERUSER, make_dir

__all__ = ["POOL_SIZE", "bouncer"]

POOL_SIZE = 4  # server connections per database and user: what every host shares
INSTALL_HINT = "PgBouncer is not installed: `apt-get install pgbouncer`"


def _binary() -> str | None:
    return shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.path.isfile(p)), None)


def _free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_INI = """\
[databases]
* = host={host} port={port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen}
unix_socket_dir =
auth_type = trust
auth_file = {dir}/userlist.txt
pool_mode = transaction
default_pool_size = {pool}
max_client_conn = 1000
server_lifetime = 3600
logfile = {dir}/pgbouncer.log
pidfile = {dir}/pgbouncer.pid
"""


@contextlib.contextmanager
def bouncer(url: str) -> Iterator[str]:
    """Start PgBouncer in front of the database at `url`; yields the URL through it,
    with corral's `?pool=transaction`; stopped (and its files removed) on exit."""
    binary = _binary()
    if binary is None:
        if os.environ.get("CORRAL_REQUIRE_PGBOUNCER") == "1":
            pytest.fail(f"CORRAL_REQUIRE_PGBOUNCER=1 but {INSTALL_HINT}", pytrace=False)
        pytest.skip(INSTALL_HINT)
    server = urlsplit(url)
    temp = make_dir("corral-pgbouncer-")
    listen = _free_port()
    ini = temp / "pgbouncer.ini"
    ini.write_text(_INI.format(host=server.hostname, port=server.port, listen=listen,
                               dir=temp, pool=POOL_SIZE))
    (temp / "userlist.txt").write_text(f'"{SUPERUSER}" ""\n')
    if os.geteuid() == 0:  # PgBouncer runs as `postgres` and reads them
        for path in (ini, temp / "userlist.txt"):
            shutil.chown(path, SUPERUSER)
    as_user = ["-u", SUPERUSER] if os.geteuid() == 0 else []
    proc = subprocess.Popen([binary, *as_user, str(ini)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # it logs to its logfile
    try:
        _wait_listening(listen, proc, temp)
        yield f"postgresql://{SUPERUSER}@127.0.0.1:{listen}{server.path}?pool=transaction"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(temp, ignore_errors=True)
        Path(f"{temp}.owner").unlink(missing_ok=True)


def _wait_listening(port: int, proc: subprocess.Popen[bytes], temp: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log = temp / "pgbouncer.log"
            raise RuntimeError(f"pgbouncer exited with {proc.returncode}: "
                               f"{log.read_text() if log.exists() else '(no log)'}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        time.sleep(0.05)
    raise RuntimeError("pgbouncer did not listen within 30 s")
