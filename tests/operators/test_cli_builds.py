"""`corral builds`, run as a real subprocess against a store two releases registered in
(`build_entities.py`), on SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import corral
from build_entities import CaseR1, CaseR2, CaseR3, Note

CORRAL = Path(sys.executable).with_name("corral")  # the console script of this venv


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    return subprocess.run([str(CORRAL), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=90, check=False)


async def test_corral_builds_lists_each_build_with_its_compatibility_as_a_table_and_json(
        db_path: str, tmp_path: Path) -> None:
    async with corral.open_runtime(db_path, entities=[CaseR1], shards=2, host=False) as rt:
        await rt.ref(CaseR1, "c-1").signal_with_start(CaseR1.note, Note(text="x"),
                                                      start=None)
    async with corral.open_runtime(db_path, entities=[CaseR3], shards=2, host=False):
        pass  # release 3 without release 2: compatible with release 1 (a rename only)
    async with corral.open_runtime(db_path, entities=[CaseR2], shards=2, host=False):
        listed = _run("builds", "--store", db_path, "--json", cwd=tmp_path)
        shown = _run("builds", "--store", db_path, "Case", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    r1, r3, r2 = json.loads(listed.stdout)
    assert [b["fingerprint"] for b in (r1, r3, r2)] == [
        c._corral_definition.fingerprint for c in (CaseR1, CaseR3, CaseR2)]  # type: ignore[attr-defined]
    assert [b["newest"] for b in (r1, r3, r2)] == [False, False, True]
    assert [len(b["processes"]) for b in (r1, r3, r2)] == [0, 0, 1]  # release 2 is open
    assert r2["processes"][0]["role"] == "client"
    assert (r1["compatible"], r3["compatible"], r2["why"]) == (True, True, "newest")
    assert r3["why"] == "signal escalate: added"  # all release 2 changes from release 3
    assert "signal note: renamed to remark" in r1["why"]
    assert shown.returncode == 0, shown.stderr
    header, _, *rows = shown.stdout.splitlines()
    assert header.split()[:3] == ["TYPE", "BUILD", "STATE"]
    assert len(rows) == 3
    assert "0h 1c" in rows[2]


def test_corral_builds_never_creates_a_store(tmp_path: Path) -> None:
    done = _run("builds", "--store", str(tmp_path / "none.db"), cwd=tmp_path)
    assert done.returncode == 2
    assert "no such SQLite file" in done.stderr
    assert not (tmp_path / "none.db").exists()
