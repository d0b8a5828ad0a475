"""`corral schedule`: create, ls, show, pause, resume, trigger, backfill and delete, run
through `main()` in this process (what the console script runs), on both stores; bad
input exits 2 and stores nothing, an `authorize` refusal exits 1."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

import corral
from cli_app import app
from corral.cli import main
from stores import sql

TESTS = Path(__file__).resolve().parents[1] / "support"


async def _create(db_path: str) -> None:
    """The store, as the application creates it (an operator tool never does)."""
    async with corral.open_runtime(db_path, entities=app.entities):
        pass


@pytest.fixture
def store(db_path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    asyncio.run(_create(db_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # load_app adds the working directory
    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    monkeypatch.setenv("CORRAL_STORE", db_path)
    monkeypatch.setenv("CORRAL_APP", "cli_app:app")
    return db_path


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    assert main([*args, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_the_schedule_commands_create_list_show_change_and_delete(
        store: str, capsys: pytest.CaptureFixture[str]) -> None:
    created = run_json(capsys, "schedule", "create", "daily", "Desk", "d-1", "post",
                       "-p", '{"text": "standup"}', "--start", '{"title": "desk"}',
                       "--cron", "0 0 9 * * mon-fri", "--time-zone", "Europe/Paris",
                       "--note", "the standup reminder")
    assert created[0]["id"] == "daily"
    assert created[0]["schedule"]["spec"]["time_zone"] == "Europe/Paris"
    assert len(created[0]["next_ticks"]) == 5
    assert [s["id"] for s in run_json(capsys, "schedule", "ls")] == ["daily"]
    assert main(["schedule", "show", "daily"]) == 0
    assert "the standup reminder" in capsys.readouterr().out
    assert run_json(capsys, "schedule", "pause", "daily")["schedule"]["paused"] is True
    assert run_json(capsys, "schedule", "resume", "daily")["schedule"]["paused"] is False
    assert run_json(capsys, "schedule", "trigger", "daily")["outcomes"] == ["started"]
    done = run_json(capsys, "schedule", "backfill", "daily", "2026-01-05T08:00:00Z",
                    "2026-01-06T08:00:00Z")
    assert done["outcomes"] == ["accepted", "accepted"]  # Mon 5 and Tue 6, 09:00 Paris
    again = run_json(capsys, "schedule", "backfill", "daily", "2026-01-05T08:00:00Z",
                     "2026-01-06T08:00:00Z")
    assert again["outcomes"] == ["duplicate", "duplicate"]
    ids = [r[0] for r in sql(store, "SELECT message_id FROM journal ORDER BY seq")]
    assert "schedule:daily@2026-01-05T08:00:00Z" in ids
    assert main(["schedule", "delete", "daily"]) == 0
    assert capsys.readouterr().out == "deleted daily\n"
    assert run_json(capsys, "schedule", "ls") == []


@pytest.mark.parametrize("args", [
    ["--cron", "0 0 9 * *"],  # five fields
    ["--cron", "0 0 9 * * *", "--every", "60"],  # two specs
    ["--every", "0"],
    ["--cron", "0 0 9 * * *", "--time-zone", "Mars/Olympus"],
    ["--every", "60", "--end-at", "yesterday"],
])
def test_a_bad_schedule_exits_2_and_stores_nothing(
        store: str, capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    assert main(["schedule", "create", "s", "Desk", "d-1", "post", "-p", '{"text": "x"}',
                 *args]) == 2
    capsys.readouterr()
    assert run_json(capsys, "schedule", "ls") == []


def test_an_unknown_schedule_and_a_refused_read_exit_1(
        store: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schedule", "pause", "nope"]) == 1
    assert "no schedule 'nope'" in capsys.readouterr().err
    assert main(["schedule", "ls", "--app", "cli_app:guarded", "--sender", "intruder"]) == 1
