"""A step running as a Ray task on a `ray.cluster_utils.Cluster` node with a custom
resource, the node removed without grace mid-task: Ray runs the task again on the other
node of that resource, the host records that result, and `run()` goes on with it; its
history says it ran as a Ray task on that node, and both tasks ran in the trace of the
start that caused them (traces across nodes and a node's loss)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ray_workers import CORRAL_DIR, TESTS_DIR

SCRIPT = str(Path(TESTS_DIR) / "step_cluster.py")


@pytest.mark.slow
def test_a_step_whose_node_dies_mid_task_runs_again_on_another_node(tmp_path: Path) -> None:
    temp = tempfile.mkdtemp(prefix="corral-sc-")  # short: Ray's socket paths are limited
    out, log = tmp_path / "report.json", tmp_path / "cluster.log"
    # The corral under test, whichever checkout the interpreter's install points at.
    env = {**os.environ, "RAY_AUTH_MODE": "disabled",
           "PYTHONPATH": os.pathsep.join([TESTS_DIR, CORRAL_DIR]),
           "RAY_TMPDIR": temp, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    try:
        with log.open("wb") as sink:
            proc = subprocess.run([sys.executable, SCRIPT, str(tmp_path / "corral.db"), temp,
                                   str(out)], env=env, stdout=sink, stderr=subprocess.STDOUT,
                                  timeout=240, check=False)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert proc.returncode == 0, log.read_text()[-5000:]
    report = json.loads(out.read_text())
    first, *again = report["calls"]
    assert first == report["removed"]
    assert len(again) == 1, report["calls"]  # run again once, on the other node
    assert again[0] != first
    assert report["result"] == again[0]  # run() got the surviving node's answer
    assert report["records"] == 0  # the run ended: its record went with it
    # Its history names the node the answer came from (one attempt: Ray ran it again).
    assert report["steps"] == [{"name": "model", "status": "completed", "attempts": 1,
                                "ray_task": True, "node": again[0]}]
    # Both tasks, on the node removed and on the other, ran in the trace of the start
    # that caused them (its context continued on whichever node: issue 43).
    assert report["task_traces"] == [[node, report["accept_trace"]] for node in report["calls"]]
