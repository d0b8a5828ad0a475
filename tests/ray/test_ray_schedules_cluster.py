"""A schedule through node loss (issue 44): on a multi-node Ray cluster
(`schedule_cluster.py`, in its own process) the node of the host actor holding the
schedule's shard is removed without grace while the schedule ticks every second. The
restarted host actor fires on from where the lost one stopped: every tick between the
first and the last fired once (the outage is inside the catch-up window), and applied
once."""

from __future__ import annotations

import datetime as dt
import itertools
from pathlib import Path

import pytest

from cluster_driver import run_driver


def _tick(message_id: str) -> float:
    return dt.datetime.fromisoformat(message_id.split("@", 1)[1].replace("Z", "+00:00")
                                     ).timestamp()


@pytest.mark.slow
def test_losing_the_node_of_a_schedules_shard_loses_and_repeats_no_tick(
        tmp_path: Path) -> None:
    report = run_driver("schedule_cluster.py", ["--store", str(tmp_path / "corral.db")],
                        tmp_path, timeout=150)

    assert report["after"]["node_id"] != report["before"]["node_id"]
    assert report["after"]["epoch"] > report["before"]["epoch"]
    ids = report["ids"]
    assert len(ids) == len(set(ids)) == report["fired"]  # each tick fired once
    assert len(ids) >= report["at_loss"] + 3, "the schedule fired on after the loss"
    ticks = sorted(_tick(i) for i in ids)
    assert [b - a for a, b in itertools.pairwise(ticks)] == [1.0] * (len(ticks) - 1), \
        "a tick lost in the outage"
    assert report["beats"] == len(ids), "a tick applied twice or never"
