"""`corral metrics` as a real subprocess, scraped once over HTTP (the census tests of
`tests/operators/test_scrape.py` and the Ray deployment's of `tests/ray/test_ray_metrics.py`)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import urllib.request
from pathlib import Path

CORRAL = Path(sys.executable).with_name("corral")  # the console script of this venv


def scrape(url: str) -> str:
    """The body of one GET of `url`."""
    with urllib.request.urlopen(url, timeout=30) as reply:
        return str(reply.read().decode())


async def scrape_corral_metrics(*args: str) -> str:
    """Start `corral metrics --port 0 ARGS`, scrape its URL once, stop it with SIGTERM
    (it must exit 0); the exposition it served."""
    proc = await asyncio.create_subprocess_exec(
        str(CORRAL), "metrics", "--port", "0", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 90)).decode()
        url = line.removeprefix("corral metrics: ").strip()
        assert url.startswith("http://127.0.0.1:"), line
        text = await asyncio.to_thread(scrape, url)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return text
