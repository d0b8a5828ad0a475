"""corral on a Ray cluster of several nodes with PostgreSQL as its only store.

The cluster (a head and two workers, `ray.cluster_utils.Cluster`) runs in its own
driver process (`ray_pg_cluster.py`), so it never clashes with the session's Ray
instance. The shard actors are spread over both worker nodes and keep nothing in a
local file; 5,000 signals stream in from the driver and from Ray tasks while the node
of shard 0 is removed without grace. Every acknowledged signal must be applied exactly
once, and the lost shard must come back on the other node.
"""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from cluster_driver import run_driver
from pg import pg_url as pg_fixture  # noqa: F401 (fixtures, found by name)
from pg import postgres_url as cluster_fixture  # noqa: F401

TOTAL = 2500


@pytest.mark.slow
def test_a_multi_node_cluster_on_postgres_loses_a_node_mid_stream_and_no_acknowledged_signal(
        tmp_path: Path, pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    report = run_driver("ray_pg_cluster.py", ["--store", pg_url, "--total", str(TOTAL)],
                        tmp_path, timeout=240)
    placed, after = report["placed"], report["after"]
    assert len({p["node_id"] for p in placed.values()}) >= 2, "shards on two nodes at least"
    assert {p["store"] for p in [*placed.values(), *after.values()]} == {"postgresql"}
    assert not report["errors"], report["errors"][:5]
    assert after["0"]["node_id"] != report["lost_node"], "shard 0 came back elsewhere"
    assert after["0"]["epoch"] > placed["0"]["epoch"], "at a new lease epoch"
    acked: dict[str, set[str]] = collections.defaultdict(set)
    for key, mid in report["acked"]:
        acked[key].add(mid)
    assert sum(len(m) for m in acked.values()) >= TOTAL
    assert report["acked_after_recovery"] > 0, "the restarted shard took more of the stream"
    for key, items in report["applied"].items():
        twice = [i for i, n in collections.Counter(items).items() if n > 1]
        assert not twice, f"{key}: applied twice: {twice[:5]}"
        assert acked[key] <= set(items), f"{key}: acknowledged but never applied"
    assert report["settled"], "every accepted message was applied"
    with capsys.disabled():
        print(f"\n[postgres cluster] up in {report['cluster_start_s']:.1f} s; "
              f"{len({p['node_id'] for p in placed.values()})} nodes hosted "
              f"{len(placed)} shards; shard 0 answered from another node "
              f"{report['recovery_s']:.2f} s after its node was killed; "
              f"{sum(len(m) for m in acked.values())} acks (driver and Ray tasks), "
              f"0 lost, none applied twice")
