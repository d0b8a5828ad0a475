"""The peers' servers: started on 127.0.0.1 for one benchmark run, stopped by process id."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from ._setup import ROOT

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode} before listening on :{port}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"not listening on :{port} after {timeout:.0f} s")


def _port_taken(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class Server:
    """Processes of one peer's server side; `stop()` ends them by pid (group) only."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.procs: list[subprocess.Popen[bytes]] = []
        self.tmp = tempfile.mkdtemp(prefix=f"corral-peers-{name}-")
        self.env: dict[str, str] = {}

    def spawn(self, args: list[str], env: dict[str, str] | None = None,
              cwd: str | None = None) -> subprocess.Popen[bytes]:
        log = open(os.path.join(self.tmp, f"{len(self.procs)}.log"), "wb")  # noqa: SIM115
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                                env={**os.environ, **(env or {})}, start_new_session=True)
        self.procs.append(proc)
        return proc

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.poll() is None]

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)  # its own session: only what it started
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)


def start_temporal() -> Server:
    srv = Server("temporal")
    port, http = free_port(), free_port()
    binary = ROOT / "temporal" / "bin" / "temporal"
    proc = srv.spawn([str(binary), "server", "start-dev", "--ip", "127.0.0.1", "--headless",
                      "--port", str(port), "--http-port", str(http),
                      "--metrics-port", str(free_port()),
                      "--db-filename", os.path.join(srv.tmp, "temporal.db"),
                      "--log-level", "warn"])
    try:
        _wait_port(port, proc, 60)
    except RuntimeError:
        srv.stop()
        raise
    srv.env = {"TEMPORAL_ADDRESS": f"127.0.0.1:{port}"}
    return srv


def start_restate() -> Server:
    srv = Server("restate")
    for port in (8080, 9070, 5122, 5123):
        if _port_taken(port):
            raise RuntimeError(f"port {port} is taken by another process")
    binary = (ROOT / "restate" / "npm" / "node_modules" / "@restatedev"
              / "restate-server-linux-x64" / "bin" / "restate-server")
    proc = srv.spawn([str(binary), "--base-dir", os.path.join(srv.tmp, "data"),
                      "--node-name", "peers"],
                     env={"RESTATE_DISABLE_TELEMETRY": "true", "RESTATE_BIND_IP": "127.0.0.1",
                          "RESTATE_ADVERTISED_HOST": "127.0.0.1",
                          "RESTATE_LISTEN_MODE": "tcp"})
    try:
        _wait_port(9070, proc, 60)
        _wait_port(8080, proc, 60)
        svc_port = free_port()
        py = ROOT / "restate" / "bin" / "python"
        svc = srv.spawn([str(py), "-m", "hypercorn", "--keep-alive", "3600", "--bind",
                         f"127.0.0.1:{svc_port}", "restate_service:app"], cwd=str(HERE))
        _wait_port(svc_port, svc, 60)
        _register_restate(f"http://127.0.0.1:{svc_port}")
    except (RuntimeError, OSError):
        srv.stop()
        raise
    srv.env = {"RESTATE_INGRESS": "http://127.0.0.1:8080"}
    return srv


def _register_restate(uri: str) -> None:
    import json
    import urllib.request

    req = urllib.request.Request("http://127.0.0.1:9070/deployments", method="POST",
                                 data=json.dumps({"uri": uri}).encode(),
                                 headers={"content-type": "application/json"})
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                resp.read()
            return
        except OSError as err:
            if time.monotonic() > deadline:
                raise RuntimeError(f"registering {uri} failed: {err}") from err
            time.sleep(0.5)
