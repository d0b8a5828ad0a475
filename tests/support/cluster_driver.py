"""Run a multi-node cluster driver script (`ray_pg_cluster.py`, `ray_roll_cluster.py`,
`ray_placement_cluster.py`) in its own process, so its `ray.cluster_utils.Cluster`
never clashes with the test session's Ray instance; its JSON report."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import corral

TESTS_DIR = str(Path(__file__).resolve().parent)
CORRAL_DIR = str(Path(corral.__file__).resolve().parents[1])
"""The corral under test (a checkout's `src` run beside an installed corral, say): the
driver imports this one too."""


def run_driver(script: str, argv: list[str], tmp_path: Path, *, timeout: float) -> dict[str, Any]:
    """`python tests/support/<script> <argv> --temp T --out F`; what it wrote to F.
    Fails the test with the tail of its output if it exits non-zero."""
    temp = tempfile.mkdtemp(prefix="corral-c-")  # short: Ray's socket paths are limited
    out, log = tmp_path / "result.json", tmp_path / "cluster.log"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join([TESTS_DIR, CORRAL_DIR]), "RAY_TMPDIR": temp,
           # Every node is on loopback; without this, Ray resolves "127.0.0.1" to the
           # machine's external address when a driver connects.
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    try:
        with log.open("wb") as sink:
            proc = subprocess.run(
                [sys.executable, str(Path(TESTS_DIR) / script), *argv, "--temp", temp,
                 "--out", str(out)],
                env=env, stdout=sink, stderr=subprocess.STDOUT, timeout=timeout, check=False)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert proc.returncode == 0, log.read_text()[-5000:]
    report: dict[str, Any] = json.loads(out.read_text())
    return report
