"""A rolling deploy on a multi-node Ray cluster whose only store is PostgreSQL.

The cluster (a head and two workers, `ray.cluster_utils.Cluster`) runs in its own
driver process (`ray_roll_cluster.py`), so it never clashes with the session's Ray
instance. Release 1's shard actors are spread over both workers; `roll_ray_hosts`
moves every shard to release 2 while clients of both releases and Ray tasks send
(`ray_roll_stream`). Every acknowledged signal is applied exactly once, the callers
see no error, and release 2 applies the entries of the handler only it has. The fast
suite proves the same on the session's Ray with SQLite (`test_ray_roll.py`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster_driver import run_driver
from pg import pg_url as pg_fixture  # noqa: F401 (fixtures, found by name)
from pg import postgres_url as cluster_fixture  # noqa: F401
from ray_roll_stream import assert_each_ack_applied_once


@pytest.mark.slow
@pytest.mark.timeout(660)  # a cluster of three nodes, then 4 actor processes started in turn
def test_a_roll_on_a_multi_node_cluster_on_postgres_loses_nothing(
        tmp_path: Path, pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    report = run_driver("ray_roll_cluster.py", ["--store", pg_url], tmp_path, timeout=600)
    before, after, steps = report["before"], report["after"], report["steps"]
    assert len({a["node_id"] for a in before.values()}) >= 2, "actors on two nodes at least"
    assert {a["store"] for a in [*before.values(), *after.values()]} == {"postgresql"}
    assert not report["errors"], report["errors"][:5]
    assert sorted(s["shard"] for s in steps) == list(range(len(before))), "each moved once"
    for s in steps:
        assert after[str(s["shard"])]["name"] == s["new_actor"]
        assert s["epoch"] > before[str(s["shard"])]["epoch"]
    acked = {(k, m) for k, m in report["acked"]}
    assert_each_ack_applied_once(report["applied"], acked)
    assert any(i.startswith("tag:") for items in report["applied"].values() for i in items)
    pauses = sorted(s["pause"] * 1000 for s in steps)
    with capsys.disabled():
        print(f"\n[roll on a cluster] {len(steps)} shards moved to release 2 on "
              f"{len({a['node_id'] for a in after.values()})} nodes; pauses "
              f"{', '.join(f'{p:.0f}' for p in pauses)} ms; {len(acked)} acks, 0 lost, "
              f"none applied twice; retries {report['retries']}")
