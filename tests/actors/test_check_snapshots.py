"""`corral check-snapshots` and `corral.testing.check_snapshots`: the stored snapshots
are restored, upgraded and replayed with the code about to be deployed, and nothing is
written (issue 22)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import corral
import corral.testing
from stores import store_rows
from test_upgrades import DocV1, DocV3, Edit

HERE = Path(__file__).resolve().parent  # the app, `test_check_snapshots`, and `test_upgrades`
TESTS = HERE.parent / "support"
CORRAL = Path(sys.executable).with_name("corral")


class DocV3Broken(corral.Entity):
    """Version 3 whose step from 2 is broken (it reads a key that is not there)."""

    name = "Doc"
    state_version = 3

    def __init__(self) -> None:
        self.subject = ""
        self.priority = "normal"

    _urgent_to_priority = DocV3._urgent_to_priority

    @corral.upgrade(from_version=2)
    def _title_to_subject(state: dict[str, Any]) -> dict[str, Any]:
        return {**state, "subject": state["heading"]}

    @corral.signal
    def edit(self, e: Edit) -> None:
        self.subject = e.text


GOOD = [DocV3]
BROKEN = [DocV3Broken]


async def _mid_life(db_path: str) -> None:
    """Three docs by version 1, each with a snapshot and then a journal tail."""
    async with corral.open_runtime(db_path, entities=[DocV1]) as rt:
        for key in ("a", "b", "c"):
            await rt.ref(DocV1, key).signal_with_start(DocV1.edit, Edit(text=key), start=None)
    async with corral.open_runtime(db_path, entities=[DocV1], host=False) as rt:
        for key in ("a", "b", "c"):
            await rt.ref(DocV1, key).signal(DocV1.edit, Edit(text=f"{key}!"))


async def test_the_helper_fails_on_a_broken_hook_and_passes_on_a_good_one_writing_nothing(
        db_path: str) -> None:
    await _mid_life(db_path)
    before = store_rows(db_path)
    bad = await corral.testing.check_snapshots(db_path, entities=BROKEN)
    assert not bad.ok
    assert [(t.entity_type, t.checked, t.restored) for t in bad.types] == [("Doc", 3, 0)]
    assert all("from_version=2" in f.error and "KeyError" in f.error for f in bad.failures)
    good = await corral.testing.check_snapshots(db_path, entities=GOOD)
    assert good.ok, good.summary()
    assert good.summary() == "Doc: 3 of 3 restore"
    sampled = await corral.testing.check_snapshots(db_path, entities=GOOD, sample=2)
    assert [t.checked for t in sampled.types] == [2]
    assert store_rows(db_path) == before


async def _cli(*args: str, store: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), env.get("PYTHONPATH")) if p)
    env["RAY_AUTH_MODE"] = "disabled"
    proc = await asyncio.create_subprocess_exec(
        str(CORRAL), "check-snapshots", "--store", store, *args, cwd=HERE, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_corral_check_snapshots_exits_non_zero_on_a_broken_hook_and_zero_on_a_good_one(
        db_path: str) -> None:
    await _mid_life(db_path)
    before = store_rows(db_path)
    code, out, err = await _cli("--app", "test_check_snapshots:BROKEN", store=db_path)
    assert code == 1, (out, err)
    assert out.splitlines()[0] == "Doc: 0 of 3 restore"
    assert "from_version=2" in out
    code, out, err = await _cli("--app", "test_check_snapshots:GOOD", "--type", "Doc",
                                store=db_path)
    assert (code, out) == (0, "Doc: 3 of 3 restore\n"), err
    code, out, err = await _cli("--app", "test_check_snapshots:BROKEN", "--json", store=db_path)
    found = json.loads(out)
    assert (code, found["ok"]) == (1, False), err
    assert [(t["entity_type"], t["checked"], t["restored"]) for t in found["types"]] == [
        ("Doc", 3, 0)]
    assert sorted(f["key"] for f in found["types"][0]["failures"]) == ["a", "b", "c"]
    assert all("from_version=2" in f["error"] for f in found["types"][0]["failures"])
    code, out, err = await _cli("--app", "test_check_snapshots:GOOD", "--json", store=db_path)
    assert (code, json.loads(out)) == (0, {"ok": True, "types": [
        {"entity_type": "Doc", "checked": 3, "restored": 3, "failures": []}]}), err
    assert store_rows(db_path) == before
