"""The `corral` verbs beyond listing: `history`, `show --state`, `start`, `update`,
`query`, `terminate`, `result`, `resume`, the payload grammar (`--payload`/`-p`, `@file`,
`-`) and `--app` naming one class, on SQLite and PostgreSQL.

Most run through `main()` in this process (what the console script runs); `update` and
`result --wait` run as real subprocesses while a host in this process applies.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

import corral
from cli_app import Approval, Blob, BoardInput, Bulk, Decision, Desk, Hoard, Note, Stuck, app
from corral.cli import main
from procs import wait_until
from stores import row_counts

TESTS = Path(__file__).resolve().parents[1] / "support"
CORRAL = Path(sys.executable).with_name("corral")


async def _seed(db_path: str) -> None:
    """Desk d-1: note "a" (applied, then covered by the snapshot the dead letter of
    "boom" takes), "b" applied after it, a wait for `decision` with its timer, and "c"
    accepted by a pure client while no host runs (a journal tail nobody applied)."""
    async with corral.open_runtime(db_path, entities=app.entities) as rt:
        desk = rt.ref(Desk, "d-1")
        await desk.signal_with_start(Desk.post, Note(text="a"), start=BoardInput(title="desk"),
                                     message_id="n-1", sender="ana")
        await desk.signal(Desk.fragile, Note(text="boom"), message_id="n-2")
        await desk.signal(Desk.post, Note(text="b"), message_id="n-3")

        async def settled() -> bool:
            d = await desk.describe()
            return d.dead_letters == 1 and len(d.open_waits) == 1 and d.applied_seq == 3
        await wait_until(settled, "a dead letter, an open wait, everything applied")
    async with corral.open_runtime(db_path, entities=app.entities, host=False) as rt:
        await rt.ref(Desk, "d-1").signal(Desk.post, Note(text="c"), message_id="n-4",
                                         sender="bob")


@pytest.fixture
def seeded(db_path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The seeded store, which `main()` in this process reads from the environment."""
    asyncio.run(_seed(db_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # load_app adds the working directory
    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    monkeypatch.setenv("CORRAL_STORE", db_path)
    monkeypatch.setenv("CORRAL_APP", "cli_app:app")
    return db_path


def _ok(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(list(args)) == 0, (args, capsys.readouterr().err)
    out, err = capsys.readouterr()
    assert err == "", (args, err)
    return out


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    return json.loads(_ok(capsys, *args, "--json"))


def test_history_lists_runs_messages_dead_letters_waits_and_timers_a_page_at_a_time(
    seeded: str, capsys: pytest.CaptureFixture[str],
) -> None:
    found = _json(capsys, "history", "Desk", "d-1")
    messages = found["messages"]["items"]
    assert [(m["seq"], m["message_id"], m["sender"]) for m in messages] == [
        (1, "n-1", "ana"), (2, "n-2", None), (3, "n-3", None), (4, "n-4", "bob")]
    first, dead, after_snapshot, last = messages
    assert first["status"] == "applied"
    assert after_snapshot["status"] == "applied"  # by the progress its host recorded
    assert (first["name"], first["payload"]) == (None, None)  # covered by the snapshot
    assert first["accepted_at"] > 0
    assert dead["status"] == "dead_lettered"
    assert (dead["name"], dead["payload"]) == ("fragile", {"text": "boom"})
    assert dead["error"] == "RuntimeError: cannot take 'boom'"
    assert dead["dead_letter_id"] is not None
    assert (last["status"], last["kind"], last["name"], last["payload"]) == (
        "accepted", "signal", "post", {"text": "c"})
    [run] = found["runs"]
    assert (run["status"], run["start_input"], run["result"]) == (
        "running", {"title": "desk"}, None)
    [wait] = found["waits"]
    assert (wait["name"], wait["status"], wait["run_id"]) == ("decision", "open", 1)
    [timer] = found["timers"]
    assert timer["timer_id"] == "wait:decision"
    assert timer["due_at"] == wait["deadline"]

    page = _json(capsys, "history", "Desk", "d-1", "--limit", "2")
    assert [m["seq"] for m in page["messages"]["items"]] == [1, 2]
    cursor = page["messages"]["next_cursor"]
    rest = _json(capsys, "history", "Desk", "d-1", "--after", cursor)
    assert [m["seq"] for m in rest["messages"]["items"]] == [3, 4]
    assert rest["messages"]["next_cursor"] is None

    text = _ok(capsys, "history", "Desk", "d-1", "--limit", "3")
    assert "RuntimeError: cannot take 'boom'" in text
    assert "wait:decision" in text
    assert '{"title":"desk"}' in text
    assert text.splitlines()[-1] == "more: --after 3"


def test_show_state_prints_the_snapshot_state_and_the_messages_after_it(
    seeded: str, capsys: pytest.CaptureFixture[str],
) -> None:
    state = _json(capsys, "show", "Desk", "d-1", "--state")
    assert state["snapshot_seq"] >= 2
    assert state["state"]["title"] == "desk"
    assert state["state"]["notes"][0] == "a"
    pending = state["pending"]["items"]
    assert pending[-1]["message_id"] == "n-4"
    assert pending[-1]["payload"] == {"text": "c"}
    assert all(m["seq"] > state["snapshot_seq"] for m in pending)

    text = _ok(capsys, "show", "Desk", "d-1", "--state")
    assert f"state at seq {state['snapshot_seq']} (state version 1):" in text
    assert '"title": "desk"' in text
    assert '{"text":"c"}' in text
    assert "messages after the snapshot" in text
    described = _json(capsys, "show", "Desk", "d-1")  # without --state: describe()
    assert described["runs"][0]["start_input"] == {"title": "desk"}


def test_start_query_terminate_result_and_resume_take_good_input(
    seeded: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    Path("start.json").write_text('{"title": "two"}', encoding="utf-8")
    assert _ok(capsys, "start", "Desk", "d-2", "-p", "@start.json",
               "--start-id", "s-1").strip() == "accepted run 1 seq 1 (started)"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b'{"title": "two"}')))
    assert _json(capsys, "start", "Desk", "d-2", "--payload", "-", "--start-id", "s-1") == {
        "status": "duplicate", "run_id": 1, "seq": 1, "started": False, "dead_letter_id": None}

    assert json.loads(_ok(capsys, "query", "Desk", "d-1", "read")) == ["a", "b", "c"]
    assert _json(capsys, "query", "Desk", "d-1", "read", "--sender", "ops") == ["a", "b", "c"]

    before = row_counts(seeded)
    assert _ok(capsys, "resume", "Desk", "d-1", "--message-id", "r-1").strip() == (
        "not suspended: Desk 'd-1' run 1 is running; nothing to resume, nothing written")
    assert _json(capsys, "resume", "Desk", "d-1") == {"status": "not_suspended", "run_id": 1}
    assert row_counts(seeded) == before  # a healthy run: no resume mark journaled
    assert _ok(capsys, "terminate", "Desk", "d-2", "--reason", "not needed").strip() == \
        "accepted run 1 seq 2"

    assert main(["result", "Desk", "d-2"]) == 1
    assert capsys.readouterr().err == (
        "error: EntityTerminatedError: EntityRef(Desk, 'd-2') run 1 was terminated: "
        "not needed\n")
    assert main(["result", "Desk", "d-1"]) == 1
    assert capsys.readouterr().err.startswith(
        "error: WaitTimeoutError: EntityRef(Desk, 'd-1'): run 1 is still running (--wait ")


READS = [("ls",), ("ls", "Desk"), ("show", "Desk", "d-1"), ("show", "Desk", "d-1", "--state"),
         ("history", "Desk", "d-1"), ("dead-letters",), ("dead-letters", "list", "Desk"),
         ("waits",), ("result", "Desk", "d-1", "--wait", "0")]


def test_every_read_command_goes_through_the_authorize_hook(
    seeded: str, capsys: pytest.CaptureFixture[str],
) -> None:
    before = row_counts(seeded)
    for args in READS:
        assert main([*args, "--app", "cli_app:guarded", "--sender", "intruder"]) == 1, args
        out, err = capsys.readouterr()
        assert out == "", args
        assert err.startswith("error: UnauthorizedError: read "), (args, err)
        allowed = main([*args, "--app", "cli_app:guarded", "--sender", "ops", "--json"])
        assert allowed in (0, 1), args  # `result` of a running run is an error of its own
        assert "UnauthorizedError" not in capsys.readouterr().err, args
    assert row_counts(seeded) == before


def test_the_old_payload_spelling_still_works_with_a_deprecation_line(
    seeded: str, capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["signal", "Desk", "d-1", "post", "--json", '{"text": "old"}',
                 "--message-id", "old-1"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "accepted run 1 seq 5"
    assert err.startswith("corral: `--json PAYLOAD` is deprecated: pass the payload as "
                          "--payload")


def test_app_may_name_one_entity_class(seeded: str, capsys: pytest.CaptureFixture[str]) -> None:
    listed = _json(capsys, "ls", "--app", "cli_app:Desk")
    assert [e["key"] for e in listed["items"]] == ["d-1"]
    assert main(["show", "Board", "b-1", "--app", "cli_app:Desk"]) == 2
    assert capsys.readouterr().err == (
        "error: UnknownEntityTypeError: the --app has no entity type 'Board' (its types: "
        "['Desk']); pass --app module:attribute naming the application that declares it "
        "(or set CORRAL_APP)\n")


_DESK = ("Desk", "d-1")
BAD_INPUT: list[tuple[tuple[str, ...], str, int]] = [
    (("start", "Desk", "d-9", "-p", '{"title": 5}'), "InvalidPayloadError", 2),
    (("start", "Desk", "d-9"), "InvalidPayloadError", 2),  # its __init__ takes a model
    (("start", "Nope", "d-9", "-p", "{}"), "UnknownEntityTypeError", 2),
    (("start", "Desk", "d 9", "-p", '{"title": "x"}'), "InvalidKeyError", 2),
    (("start", "Desk", "d-9", "-p", "@missing.json"), "InvalidArgumentError", 2),
    (("start", "Desk", "d-9", "-p", '{"title": "x"}', "--start-id", ""), "InvalidKeyError", 2),
    (("update", *_DESK, "read", "-p", "{}"), "UnknownHandlerError", 2),
    (("update", *_DESK, "rename", "-p", '{"title": 5}'), "InvalidPayloadError", 2),
    (("update", *_DESK, "rename", "-p", "{"), "InvalidPayloadError", 2),
    (("update", *_DESK, "rename", "-p", '{"title": "x"}', "--update-id", "u\n"),
     "InvalidKeyError", 2),
    (("update", "Desk", "d-9", "rename", "-p", '{"title": "x"}', "--start", '{"title": 1}'),
     "InvalidPayloadError", 2),
    (("query", *_DESK, "post"), "UnknownHandlerError", 2),
    (("query", *_DESK, "nothing"), "UnknownHandlerError", 2),
    (("query", *_DESK, "read", "-p", '{"x": 1}'), "InvalidPayloadError", 2),  # takes none
    (("query", *_DESK, "read", "--sender", ""), "InvalidKeyError", 2),
    (("query", "Desk", "d-9", "read"), "EntityNotRunningError", 1),
    (("terminate", "Nope", "d-1"), "UnknownEntityTypeError", 2),
    (("terminate", *_DESK, "--message-id", "m\x07"), "InvalidKeyError", 2),
    (("terminate", "Desk", "d-9"), "EntityNotRunningError", 1),
    (("resume", "Desk", "d 1"), "InvalidKeyError", 2),
    (("resume", "Desk", "d-9"), "EntityNotRunningError", 1),
    (("result", "Nope", "d-1"), "UnknownEntityTypeError", 2),
    (("result", "Desk", "d-9"), "EntityNotRunningError", 1),
    (("history", "Desk", "d-9"), "EntityNotRunningError", 1),
    (("history", *_DESK, "--after", "x"), "InvalidArgumentError", 2),
    (("history", *_DESK, "--limit", "0"), "InvalidArgumentError", 2),
    (("show", *_DESK, "--state", "--after", "-1"), "InvalidArgumentError", 2),
    (("signal", *_DESK, "post", "-p", "@missing.json", "--message-id", "x"),
     "InvalidArgumentError", 2),
    (("ls", "--app", "cli_app:Note"), "InvalidArgumentError", 2),  # a model, not an entity
]


def test_bad_input_to_every_new_verb_is_one_typed_line_and_stores_nothing(
    seeded: str, capsys: pytest.CaptureFixture[str],
) -> None:
    before = row_counts(seeded)

    for args, error, status in BAD_INPUT:
        assert main(list(args)) == status, (args, capsys.readouterr().err)
        out, err = capsys.readouterr()
        assert out == "", args
        assert err.count("\n") == 1, (args, err)
        assert err.startswith(f"error: {error}: "), (args, err)
    assert row_counts(seeded) == before


async def _corral(db_path: str, cwd: Path, *args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env |= {"PYTHONPATH": str(TESTS), "CORRAL_STORE": db_path, "CORRAL_APP": "cli_app:app",
            "RAY_AUTH_MODE": "disabled"}
    proc = await asyncio.create_subprocess_exec(
        str(CORRAL), *args, cwd=cwd, env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_update_result_and_resume_reach_a_host_that_applies_them(
    db_path: str, tmp_path: Path,
) -> None:
    async with corral.open_runtime(db_path, entities=app.entities) as rt:
        desk = rt.ref(Desk, "d-1")
        await desk.start(start=BoardInput(title="desk"))
        stuck = rt.ref(Stuck, "s-1")
        await stuck.start(start=Note(text="no template"))
        await rt.ref(Approval, "a-1").start(start=None)

        async def suspended() -> bool:
            return (await stuck.describe()).suspension is not None
        await wait_until(suspended, "the run is suspended")
        attempts = (await stuck.describe()).suspension.attempts  # type: ignore[union-attr]

        renamed, again, waited, resumed, _ = await asyncio.gather(
            _corral(db_path, tmp_path, "update", "Desk", "d-1", "rename", "-p",
                    '{"title": "new"}', "--update-id", "u-1"),
            _corral(db_path, tmp_path, "update", "Desk", "d-1", "rename", "-p",
                    '{"title": "new"}', "--update-id", "u-1", "--json"),
            _corral(db_path, tmp_path, "result", "Approval", "a-1", "--wait", "60"),
            _corral(db_path, tmp_path, "resume", "Stuck", "s-1", "--json"),
            rt.ref(Approval, "a-1").deliver(Approval.decision, Decision(approved=True),
                                            key="d-1"))

        assert renamed == (0, '"desk"\n', "")
        assert again[0] == 0
        assert json.loads(again[1]) == "desk"
        assert waited == (0, "true\n", "")
        assert resumed[0] == 0
        assert json.loads(resumed[1])["status"] == "accepted"

        async def retried() -> bool:
            s = (await stuck.describe()).suspension
            return s is not None and s.attempts > attempts
        await wait_until(retried, "the resumed run was retried at once")
        history = await desk.history()
        assert [(m.kind, m.name, m.message_id) for m in history.messages.items][-1] == (
            "update", "rename", "u-1")


# -- issue 39, item 18f: a large state as a table is cut, not laid out whole ------------------


async def _hoard(db_path: str) -> None:
    """Hoard h-1: a state of about 2 MB (a snapshot of it), then 5 messages of 100 KB."""
    async with corral.open_runtime(db_path, entities=[Hoard]) as rt:
        ref = rt.ref(Hoard, "h-1")
        await ref.signal_with_start(Hoard.fill, Bulk(items=20_000, size=90), start=None,
                                    message_id="f-1")

        async def snapshotted() -> bool:
            return (await ref.describe()).snapshot_seq == 1
        await wait_until(snapshotted, "the 2 MB state snapshotted")
    async with corral.open_runtime(db_path, entities=[Hoard], host=False) as rt:
        for i in range(5):
            await rt.ref(Hoard, "h-1").signal(Hoard.keep, Blob(text=f"{i}" * 100_000),
                                              message_id=f"k-{i}")


def test_show_state_of_a_large_state_prints_its_head_and_says_json_prints_it_whole(
    db_path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    asyncio.run(_hoard(db_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    where = ("--store", db_path, "--app", "cli_app:Hoard")

    table = _ok(capsys, "show", "Hoard", "h-1", "--state", *where)
    whole = _json(capsys, "show", "Hoard", "h-1", "--state", *where)

    assert len(table) < 50_000  # of a state of 2 MB and 500 KB of payloads
    assert '"00000000xxxxxxxxxx' in table  # the head of the state, as JSON
    assert "(the first 20,000 characters: --state --json prints the whole state)" in table
    assert table.count("(100,011 characters: --json prints it whole)") == 5
    assert len(whole["state"]["items"]) == 20_000
    assert [m["payload"]["text"] for m in whole["pending"]["items"]] == [
        f"{i}" * 100_000 for i in range(5)]
