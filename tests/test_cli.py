"""The `corral` command, run as a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import corral

CORRAL = Path(sys.executable).with_name("corral")  # the console script of this venv


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    return subprocess.run([str(CORRAL), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=90, check=False)


def test_corral_demo_runs_the_ticket_scenario_and_prints_what_happened(tmp_path: Path) -> None:
    store = tmp_path / "demo.db"

    done = _run("demo", "--store", str(store), cwd=tmp_path)

    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert f"store: {store}" in out
    assert "5 accepted, 6 duplicate" in out
    assert out.count("<- this call started the run") == 1
    assert "assign(agent='atlas') -> agent='atlas', 5 replies waiting" in out
    answered = [line.split()[1] for line in out.splitlines()
                if line.startswith("   10:")]
    assert answered == ["msg-1", "msg-2", "msg-3", "msg-4", "msg-5"]
    assert "5 replies waiting, 0 answered" in out
    assert "run 1 completed after accepting 6 messages" in out
    assert store.exists()


def test_corral_demo_is_repeatable_on_its_default_store(tmp_path: Path) -> None:
    first = _run("demo", cwd=tmp_path)
    second = _run("demo", cwd=tmp_path)

    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr
    assert (tmp_path / "corral-demo.db").exists()
    assert "5 accepted, 6 duplicate" in second.stdout  # not 11 duplicates of the old run


def test_corral_help_and_version_work_and_a_missing_command_is_a_usage_error(
    tmp_path: Path,
) -> None:
    helped = _run("--help", cwd=tmp_path)
    version = _run("--version", cwd=tmp_path)
    bare = _run(cwd=tmp_path)

    assert helped.returncode == 0
    assert "demo" in helped.stdout
    assert version.stdout.strip() == f"corral {corral.__version__}"
    assert bare.returncode == 2
    assert "usage: corral" in bare.stderr


def test_python_dash_m_corral_is_the_same_command(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "corral", "demo", "--store", ":memory:"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=90,
                          check=False)

    assert done.returncode == 0, done.stderr
    assert "5 accepted, 6 duplicate" in done.stdout
    assert list(tmp_path.iterdir()) == []  # ':memory:' writes no file
