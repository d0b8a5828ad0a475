"""Node loss on a multi-node Ray cluster (`ray.cluster_utils.Cluster`: a head + 2 workers).

The cluster runs in its own process (`ray_workers.py node-loss`), so it never clashes
with the session's Ray instance: a driver can be connected to one cluster only. Shard
actors are pinned to the worker nodes by a custom resource; the node hosting shard 0 is
removed without grace (its processes are killed) while 8 senders stream signals. Ray
detects the dead node through fast health checks and restarts the shard actor on the
other worker node, where it takes a new lease epoch at once; every acknowledged signal
must be applied exactly once.
"""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from cluster_driver import run_driver


@pytest.mark.slow
def test_losing_the_node_of_a_shard_mid_stream_loses_no_acknowledged_signal(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = run_driver("ray_workers.py", [
        "node-loss", "--store", str(tmp_path / "corral.db"), "--before-loss", "200",
        "--after-recovery", "200", "--senders", "8"], tmp_path, timeout=110)

    assert not report["errors"], report["errors"][:5]
    before, after = report["before"], report["after"]
    assert after["node_id"] != before["node_id"], "shard 0 must come back on another node"
    assert after["epoch"] > before["epoch"], "the new incarnation takes a new lease epoch"
    acked: dict[str, set[str]] = collections.defaultdict(set)
    for key, mid in report["acked"]:
        acked[key].add(mid)
    assert report["acked_after_recovery"] >= 200, "the restarted shard took over the stream"
    for key, items in report["applied"].items():
        counts = collections.Counter(items)
        assert not [i for i, n in counts.items() if n > 1], f"{key}: applied twice"
        assert acked[key] <= set(items), f"{key}: acknowledged but never applied"
    assert report["settled"], "every accepted message was applied"
    with capsys.disabled():
        print(f"\n[node loss] cluster up in {report['cluster_start_s']:.1f} s; shard 0 answered "
              f"from another node {report['recovery_s']:.2f} s after its node was killed; "
              f"longest pause between acks: {report['longest_gap_s']:.2f} s; "
              f"{len(report['acked'])} acks, {report['acked_after_recovery']} of them after "
              f"the restart; 0 lost, none applied twice")
