"""Releases of one package on a multi-node Ray cluster whose only store is PostgreSQL
(issue 41's acceptance): every release is `ticketdesk` (`tests/support/releases/`),
shipped by `working_dir`, so only what Ray ships decides which code a host runs.

The cluster (a head and two workers) runs in its own driver process
(`ray_releases_cluster.py`), so it never clashes with the session's Ray instance. The
fast suite (`test_ray_releases.py`) proves the rest on the session's Ray with SQLite.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from cluster_driver import run_driver
from pg import pg_url as pg_fixture  # noqa: F401 (fixtures, found by name)
from pg import postgres_url as cluster_fixture  # noqa: F401
from ticket_releases import SendLog, assert_applied_exactly_once


def merged(logs: dict[str, dict[str, Any]]) -> SendLog:
    log = SendLog()
    for one in logs.values():
        log.add(one)
    return log


def assert_nothing_lost_doubled_or_dead_lettered(report: dict[str, Any]) -> SendLog:
    log = merged(report["logs"])
    assert not log.errors, log.errors[:5]
    assert_applied_exactly_once(report["applied"], log)
    assert report["dead_letters"] == [], report["dead_letters"][:3]
    assert report["dead_letters_stored"] == 0
    return log


def pauses(deploys: list[dict[str, Any]]) -> list[float]:
    return [s["pause"] for d in deploys for s in d["steps"]]


@pytest.mark.slow
@pytest.mark.timeout(900)  # a cluster of three nodes, 4 releases, 5 client processes
def test_release_2_rolled_back_and_forward_under_a_stream_loses_doubles_and_dead_letters_nothing(
        tmp_path: Path, pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    report = run_driver("ray_releases_cluster.py", ["rolls", "--store", pg_url], tmp_path,
                        timeout=840)
    log = assert_nothing_lost_doubled_or_dead_lettered(report)
    first, forward, back, again = report["deploys"]
    assert [d["release"] for d in report["deploys"]] == ["r1", "r2", "r1", "r2"]
    for roll in (forward, back, again):
        assert roll["steps"], f"deploying {roll['release']} moved nothing: {roll}"
        assert not roll["unchanged"]
    assert back["id"] == first["id"], "a rollback declares release 1 again"
    assert again["id"] == forward["id"]
    assert forward["tag"] != first["tag"]
    final = report["status"]
    assert final["release"] == again["id"]
    assert {h["release"] for h in final["hosts"] if h["shards"]} == {again["id"]}, final["text"]
    notes = [n for ns in report["applied"].values() for n in ns]
    assert any(n.startswith("label:") for n in notes), "release 2's new handler applied"
    by_sender = {name: len(one["acked"]) for name, one in report["logs"].items()}
    assert all(by_sender[f"{r}-{w}"] > 0 for r in ("r1", "r2") for w in ("driver", "task")), \
        by_sender
    assert log.retries["HandlerNotHostedError"] > 0, "release 1 refused release 2's handlers"
    churn = report["churn"]
    assert churn["before"] == churn["after"], "a host stopped while a client opened/closed"
    assert not churn["samples_changed"], churn["samples_changed"]
    assert len(report["logs"]["churn"]["cycles"]) == 20
    steps = pauses(report["deploys"])
    moves = ", ".join(str(len(d["steps"])) for d in (forward, back, again))
    with capsys.disabled():
        print(f"\n[releases on a cluster] {len(log.acked)} acks, 0 lost, none doubled or "
              f"dead-lettered; 3 rolls ({moves} shard moves), "
              f"longest pause {max(steps) * 1000:.0f} ms; "
              f"{len(log.refused)} refused as not hosted; retries {dict(log.retries)}; "
              f"20 client open/close cycles "
              f"({max(report['logs']['churn']['cycles']):.1f} s longest), no host stopped")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_node_of_the_placer_killed_during_a_roll_converges_on_the_declared_release(
        tmp_path: Path, pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    report = run_driver("ray_releases_cluster.py", ["placer-loss", "--store", pg_url],
                        tmp_path, timeout=840)
    log = assert_nothing_lost_doubled_or_dead_lettered(report)
    assert not report["victim_alive"]
    assert 0 < report["on_release_at_kill"] < report["shards"], "the node was lost mid-roll"
    converged = report["converged"]
    if "report" in report["deployer"]:  # the deploy call itself may fail with the placer
        assert converged["release"] == report["deployer"]["report"]["id"]
    assert report["answered_by"] == ["r2"], "release 2's code answers for every ticket"
    assert not any(report["victim"].startswith(h["node_id"]) for h in converged["hosts"]), \
        converged["hosts"]
    kinds = Counter(log.retries)
    with capsys.disabled():
        print(f"\n[placer's node lost mid-roll] converged on release 2 in "
              f"{converged['seconds']:.1f} s; the deployer saw "
              f"{report['deployer'].get('error', 'no error')}; {len(log.acked)} acks, 0 lost, "
              f"none doubled or dead-lettered; retries {dict(kinds)}")
