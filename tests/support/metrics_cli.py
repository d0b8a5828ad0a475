"""`corral metrics` as a real subprocess, scraped once over HTTP, and the series the
shipped alert rules and Grafana dashboard name (`deploy/`): for the census tests of
`tests/operators/test_scrape.py` and the Ray deployment's of `tests/ray/test_ray_metrics.py`."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

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


DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SERIES = re.compile(r"\b[a-z_]*corral_[a-z0-9_]+\b")
"""A series name in a PromQL expression (with any prefix, so a `ray_corral_*` is caught)."""


def expressions() -> list[tuple[str, str]]:
    """(where, PromQL expression) of every alert rule and Grafana panel target of
    `deploy/`."""
    found: list[tuple[str, str]] = []
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert {"alert", "expr", "labels", "annotations"} <= set(rule), rule
            assert rule["annotations"]["summary"]
            found.append((f"alert {rule['alert']}", str(rule["expr"])))
    dashboard: dict[str, Any] = json.loads((DEPLOY / "grafana" / "corral.json").read_text())
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        found.extend((f"panel {panel['title']!r}", t["expr"]) for t in panel["targets"])
    return found


def unknown_series(text: str) -> list[tuple[str, str]]:
    """(where, name) of each series an alert rule or Grafana panel names that the
    exposition `text` does not export (a family declared with no sample yet counts:
    a counter nothing has counted yet is still exported)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    exported = {f"{f.name}{end}" for f in text_string_to_metric_families(text)
                for end in suffixes.get(f.type, ("",))}  # a family even with no sample yet
    unknown = []
    for where, expr in expressions():
        names = SERIES.findall(expr)
        assert names, f"{where}: {expr} names no corral series"
        unknown += [(where, n) for n in names if n not in exported]
    return unknown
