"""An ASGI app on the Ray backend stops cleanly on SIGTERM (issue 25).

A real uvicorn process serves `examples/webhook_ingress.py`'s endpoint
(`tests/support/ray_asgi_app.py`); its lifespan opens a runtime with `backend="ray"`,
which starts a Ray instance of the process's own (its own temp dir: never the
session's). Webhooks stream in over real HTTP; a SIGTERM arrives mid-stream. Then the
process must end as uvicorn ends the same app without Ray: a graceful shutdown (the
lifespan closed the runtime, no traceback), and every delivery answered 200 applied
once when the store is opened again.

uvicorn (0.29 and later) raises the SIGTERM again once it has shut down gracefully,
with the handler that was there before it started, so the process ends killed by
SIGTERM (status -15, 143 in a shell) after a clean shutdown, with or without Ray; the
control run on the local backend checks exactly that.
"""

from __future__ import annotations

import asyncio
import collections
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pytest

import corral
from ray_workers import TESTS_DIR
from webhook_traffic import EXAMPLES, PATH, SECRET, applied_by_ticket, event_body, load_example

BEFORE_SIGTERM = 12
"""Deliveries answered 200 before the SIGTERM is sent (more keep coming after it)."""
TICKETS = 3


def _start(backend: str, store: str, temp: str, sock: socket.socket) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(PYTHONPATH=f"{TESTS_DIR}:{EXAMPLES}", RAY_TMPDIR=temp, RAY_AUTH_MODE="disabled",
               CORRAL_ASGI_STORE=store, CORRAL_ASGI_BACKEND=backend)
    return subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--factory", "ray_asgi_app:build",
         "--fd", str(sock.fileno()), "--timeout-graceful-shutdown", "20"],
        env=env, pass_fds=[sock.fileno()], stdout=subprocess.PIPE, stderr=subprocess.PIPE)


async def _stream_then_sigterm(url: str, proc: subprocess.Popen[bytes]) -> list[str]:
    """Post deliveries (4 senders) until the server stops answering; SIGTERM once
    BEFORE_SIGTERM were answered 200. The event ids answered 200."""
    example = load_example()
    acked: list[str] = []
    sent = 0

    async def sender(client: httpx.AsyncClient, who: int) -> None:
        nonlocal sent
        n = 0
        while True:
            mid = f"evt-{who}-{n}"
            body = event_body(mid, 1 + n % TICKETS)
            n += 1
            try:
                reply = await client.post(PATH, content=body,
                                          headers=example.sign(SECRET, body))
            except httpx.TransportError:  # not started yet, or gone
                if acked or proc.poll() is not None:
                    return  # stopped (a refused connection after the first ack)
                await asyncio.sleep(0.1)
                continue
            if reply.status_code == 200:
                acked.append(mid)
                if len(acked) == BEFORE_SIGTERM:
                    proc.send_signal(signal.SIGTERM)
            else:
                assert reply.status_code == 503, reply.text  # never acknowledged
            sent += 1

    async with httpx.AsyncClient(base_url=url, timeout=60.0) as client:
        await asyncio.wait_for(asyncio.gather(*(sender(client, w) for w in range(4))), 90)
    return acked


async def _applied(store: str) -> dict[str, list[str]]:
    """What each ticket applied, read with the local backend after the process is gone."""
    example = load_example()
    async with corral.open_runtime(store, entities=[example.Ticket], shards=2) as rt:
        return await applied_by_ticket(rt, example, {f"ticket-{t}" for t in
                                                     range(1, TICKETS + 1)})


@pytest.mark.parametrize("backend", ["local", "ray"])
async def test_sigterm_to_a_uvicorn_app_on_ray_runs_its_lifespan_shutdown_and_loses_nothing(
        backend: str, tmp_path: Path) -> None:
    temp = tempfile.mkdtemp(prefix="corral-sig-")  # short: Ray's socket paths are limited
    store = str(tmp_path / "webhooks.db")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    proc = _start(backend, store, temp, sock)
    try:
        sock.close()  # the server holds its own copy
        acked = await _stream_then_sigterm(url, proc)
        _, err = await asyncio.to_thread(proc.communicate, timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(temp, ignore_errors=True)
    stderr = err.decode(errors="replace")
    assert proc.returncode == -signal.SIGTERM, stderr[-3000:]  # uvicorn's, see above
    assert "Traceback" not in stderr, stderr[-3000:]
    assert "SIGTERM received" not in stderr, stderr[-3000:]  # Ray's C++ failure handler
    assert "runtime closed" in stderr, stderr[-3000:]  # the lifespan's close ran
    assert "Application shutdown complete" in stderr, stderr[-3000:]
    assert len(acked) >= BEFORE_SIGTERM
    applied = await _applied(store)
    counts = collections.Counter(mid for ids in applied.values() for mid in ids)
    assert not [m for m, n in counts.items() if n > 1], "applied twice"
    assert set(acked) <= set(counts), "acknowledged but never applied"
