"""The `corral` command, run as a real subprocess.

`demo`, `--help` and `--version` run on their own; the operator commands run against a
store seeded from this process (`tests/support/cli_app.py`, passed as `--app cli_app:app`), on
SQLite and on PostgreSQL, and what they write is checked by a runtime here that hosts
the entities and applies it. Independent invocations run concurrently: each costs
about a second of interpreter start-up.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import corral
from cli_app import Approval, Board, BoardInput, Note, Stuck, app
from corral.cli import main
from procs import wait_until
from stores import row_counts

TESTS = Path(__file__).resolve().parents[1] / "support"
CORRAL = Path(sys.executable).with_name("corral")  # the console script of this venv


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    return subprocess.run([str(CORRAL), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=90, check=False)


# -- demo, help, version -----------------------------------------------------------------


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
    for command in ("demo", "ls", "show", "waits", "dead-letters", "signal", "deliver", "ui"):
        assert re.search(rf"^\W*{command}\s", helped.stdout, re.MULTILINE), command
    assert version.stdout.strip() == f"corral {corral.__version__}"
    assert bare.returncode == 2
    assert bare.stderr == "error: UsageError: corral: Missing command. (corral -h for help)\n"


def test_python_dash_m_corral_is_the_same_command(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "corral", "demo", "--store", ":memory:"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=90,
                          check=False)

    assert done.returncode == 0, done.stderr
    assert "5 accepted, 6 duplicate" in done.stdout
    assert list(tmp_path.iterdir()) == []  # ':memory:' writes no file


# -- the operator commands, on both stores -------------------------------------------------


@dataclass(frozen=True)
class Done:
    """One finished `corral` invocation."""

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        assert self.returncode == 0, (self.args, self.stderr)
        return json.loads(self.stdout)

    def ok(self) -> str:
        assert self.returncode == 0, (self.args, self.stderr)
        return self.stdout


def _env(store: str | None) -> dict[str, str]:
    """The environment: `tests/` importable; `CORRAL_STORE`/`CORRAL_APP` for `store`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), env.get("PYTHONPATH")) if p)
    env["RAY_AUTH_MODE"] = "disabled"
    if store is not None:
        env |= {"CORRAL_STORE": store, "CORRAL_APP": "cli_app:app"}
    return env


async def _corral(args: Sequence[str], *, store: str | None, cwd: Path,
                  program: Sequence[str] = (str(CORRAL),)) -> Done:
    proc = await asyncio.create_subprocess_exec(
        *program, *args, cwd=cwd, env=_env(store), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode is not None
    return Done(tuple(args), proc.returncode, out.decode(), err.decode())


async def _all(*commands: Sequence[str], store: str | None, cwd: Path) -> list[Done]:
    """Run `corral` with each argument list at once; their results in order."""
    return list(await asyncio.gather(*(_corral(c, store=store, cwd=cwd) for c in commands)))


async def _seed(db_path: str) -> dict[tuple[str, str], int]:
    """Boards b-1 (a note, a dead letter), b-2 (two dead letters) and b-4 (a dead
    letter, then terminated); Approval a-1 waiting for its decision. Returns the dead
    letters' ids by (key, note)."""
    Board.broken = True
    async with corral.open_runtime(db_path, entities=app.entities) as rt:
        b1, b2, b4 = (rt.ref(Board, k) for k in ("b-1", "b-2", "b-4"))
        await b1.signal_with_start(Board.post, Note(text="first"),
                                   start=BoardInput(title="one"), message_id="seed-1")
        await b1.signal(Board.fragile, Note(text="boom"), message_id="seed-2")
        await b2.signal_with_start(Board.fragile, Note(text="bang"),
                                   start=BoardInput(title="two"), message_id="seed-3")
        await b2.signal(Board.fragile, Note(text="bang2"), message_id="seed-4")
        await b4.signal_with_start(Board.fragile, Note(text="late"),
                                   start=BoardInput(title="four"), message_id="seed-5")
        await rt.ref(Approval, "a-1").start(start=None)

        async def settled() -> bool:
            waits = await rt.signal_waits()
            return len(await rt.dead_letters()) == 4 and len(waits.items) == 1

        await wait_until(settled, "four dead letters and one open wait")
        await b4.terminate("closed for the test")
        return {(d.key, json.loads(d.payload)["text"]): d.id for d in await rt.dead_letters()}


def _row(out: str, *cells: str) -> bool:
    """Whether a table line holds `cells` in this order."""
    pattern = r"\s+".join(re.escape(c) for c in cells)
    return any(re.search(rf"(^|\s){pattern}(\s|$)", line) for line in out.splitlines())


async def test_ls_and_show_say_a_run_is_suspended_and_show_prints_its_error(
    db_path: str, tmp_path: Path,
) -> None:
    async with corral.open_runtime(db_path, entities=app.entities) as rt:
        ref = rt.ref(Stuck, "s-1")
        await ref.start(start=Note(text="no template for s-1"))

        async def suspended() -> bool:
            return (await ref.describe()).suspension is not None
        await wait_until(suspended, "the run is suspended")
    ls, show, show_json = await _all(["ls", "Stuck"], ["show", "Stuck", "s-1"],
                                     ["show", "Stuck", "s-1", "--json"],
                                     store=db_path, cwd=tmp_path)
    assert _row(ls.ok(), "Stuck", "s-1", "running (suspended)", "1")
    assert _row(show.ok(), "status", "running (suspended)")
    assert _row(show.stdout, "suspended", "1", "failed", "attempt", "since")
    assert "KeyError: 'no template for s-1'" in show.stdout
    assert "Traceback" in show.stdout
    assert "suspended by:" in show.stdout.splitlines()  # piped: plain text, no markup
    assert "[bold]" not in show.stdout
    proc = await asyncio.create_subprocess_exec(
        str(CORRAL), "show", "Stuck", "s-1", cwd=tmp_path, stdout=asyncio.subprocess.PIPE,
        env=_env(db_path) | {"FORCE_COLOR": "1"})  # rich takes it for a terminal
    styled, _ = await asyncio.wait_for(proc.communicate(), 90)
    assert "\x1b[1msuspended by:\x1b[0m" in styled.decode()  # bold, rendered
    assert "[bold]" not in styled.decode()
    found = show_json.json()["suspension"]
    assert (found["attempts"], found["run_id"]) == (1, 1)
    assert "KeyError" in found["error"]


async def test_ls_and_show_print_the_applied_seq_and_backlog_a_host_recorded(
    db_path: str, tmp_path: Path,
) -> None:
    async with corral.open_runtime(db_path, entities=app.entities, host=False) as client:
        ref = client.ref(Board, "p-1")
        for i in range(3):  # accepted, and no host to apply them yet
            await ref.signal_with_start(Board.post, Note(text=f"n{i}"),
                                        start=BoardInput(title="progress"), message_id=f"p{i}")
        ls, show, show_json = await _all(["ls", "Board"], ["show", "Board", "p-1"],
                                         ["show", "Board", "p-1", "--json"],
                                         store=db_path, cwd=tmp_path)
        assert _row(ls.ok(), "Board", "p-1", "running", "1", "3", "0", "3")
        assert _row(show.ok(), "applied seq", "0")
        assert _row(show.stdout, "backlog", "3 messages, the oldest accepted")
        assert _row(show.stdout, "progress", "never recorded")
        behind = show_json.json()
        assert (behind["applied_seq"], behind["backlog"]) == (0, 3)
        assert behind["oldest_unapplied_age"] >= 0
        async with corral.open_runtime(db_path, entities=app.entities):  # a host applies

            async def caught_up() -> bool:
                return (await ref.describe()).backlog == 0
            await wait_until(caught_up, "the host records that it applied all three")
        ls, show = await _all(["ls", "Board"], ["show", "Board", "p-1"], store=db_path,
                              cwd=tmp_path)
    assert _row(ls.ok(), "Board", "p-1", "running", "1", "3", "3", "0")
    assert _row(show.ok(), "applied seq", "3")
    assert _row(show.stdout, "backlog", "0 messages")
    assert _row(show.stdout, "progress", "recorded by its host")


async def test_ls_show_waits_and_dead_letters_print_tables_and_json_and_write_nothing(
    db_path: str, tmp_path: Path,
) -> None:
    seeded = await _seed(db_path)
    before = row_counts(db_path)
    probe = ("-c", "import sys; from corral.cli import main; code = main(sys.argv[1:]); "
                   "print('ray' in sys.modules); sys.exit(code)")

    ids = sorted(seeded.values())
    ls_json, (ls, show, show_json, waits, waits_json, dead, dead_json, dead_page) = \
        await asyncio.gather(
            _corral(["ls", "--json"], store=db_path, cwd=tmp_path,
                    program=(sys.executable, *probe)),
            _all(["ls", "--limit", "3"], ["show", "Approval", "a-1"],
                 ["show", "Board", "b-1", "--json"], ["waits"], ["waits", "Approval", "--json"],
                 ["dead-letters"], ["dead-letters", "Board", "--key", "b-2", "--json"],
                 ["dead-letters", "--after", str(ids[0]), "--limit", "2", "--json"],
                 store=db_path, cwd=tmp_path))
    cursor = ls.ok().splitlines()[-1].removeprefix("more: --after ")
    rest = await _corral(["ls", "--json", "--after", cursor], store=db_path, cwd=tmp_path)

    listed, imported_ray = ls_json.ok().rsplit("\n", 2)[:2]
    assert imported_ray == "False"  # `corral ls` never imports Ray
    items = json.loads(listed)["items"]
    assert [(e["entity_type"], e["key"], e["status"]) for e in items] == [
        ("Approval", "a-1", "running"), ("Board", "b-1", "running"),
        ("Board", "b-2", "running"), ("Board", "b-4", "terminated")]
    assert (items[1]["run_id"], items[1]["accepted_seq"]) == (1, 2)
    assert json.loads(listed)["next_cursor"] is None
    assert _row(ls.stdout, "Approval", "a-1", "running", "1", "1")
    assert _row(ls.stdout, "Board", "b-2", "running", "1", "2")
    assert not _row(ls.stdout, "b-4")
    assert [e["key"] for e in rest.json()["items"]] == ["b-4"]  # the next page

    assert _row(show.ok(), "status", "running")
    assert _row(show.stdout, "accepted seq", "1")
    assert _row(show.stdout, "open waits", "1")
    assert _row(show.stdout, "decision", "1")  # the open waits table
    described = show_json.json()
    assert (described["status"], described["run_id"], described["accepted_seq"],
            described["dead_letters"]) == ("running", 1, 2, 1)
    assert [r["status"] for r in described["runs"]] == ["running"]
    assert described["snapshot_seq"] == 2  # the host snapshots right after a dead letter

    assert _row(waits.ok(), "Approval", "a-1", "1", "decision")
    assert [(w["key"], w["name"], w["deadline"]) for w in waits_json.json()["items"]] == [
        ("a-1", "decision", None)]

    for (key, text), ident in seeded.items():
        assert _row(dead.ok(), str(ident), "Board", key), (key, text)
    assert "RuntimeError: cannot take 'bang2'" in dead.stdout
    letters = dead_json.json()
    assert [(d["key"], d["name"], d["payload"]) for d in letters] == [
        ("b-2", "fragile", {"text": "bang"}), ("b-2", "fragile", {"text": "bang2"})]
    assert letters[0]["id"] == seeded[("b-2", "bang")]
    assert letters[0]["attempts"] == 1
    assert [d["id"] for d in dead_page.json()] == ids[1:3]  # the page after the first id
    assert row_counts(db_path) == before


async def test_signal_signal_with_start_and_deliver_reach_the_entities_once(
    db_path: str, tmp_path: Path,
) -> None:
    await _seed(db_path)
    explicit = ["--store", db_path, "--app", "cli_app:app"]

    sent, started, delivered = await asyncio.gather(
        _corral(["signal", "Board", "b-1", "post", "--payload", '{"text": "second"}',
                 "--message-id", "cli-1", *explicit], store=None, cwd=tmp_path),  # no env
        _corral(["signal", "Board", "b-3", "post", "--payload", '{"text": "new"}',
                 "--message-id", "cli-2", "--start", '{"title": "three"}', "--sender", "ops"],
                store=db_path, cwd=tmp_path),
        _corral(["deliver", "Approval", "a-1", "decision", "--payload", '{"approved": true}',
                 "--key", "click-1", "--sender", "ana", "--json"],
                store=db_path, cwd=tmp_path))
    again, cleared, lost = await _all(
        sent.args, ["signal", "Board", "b-3", "clear", "--message-id", "cli-3", "--json"],
        ["deliver", "Approval", "a-1", "decision", "--payload", '{"approved": false}',
         "--key", "click-2", "--sender", "bob"],
        store=db_path, cwd=tmp_path)

    assert sent.ok().strip() == "accepted run 1 seq 3"
    assert started.ok().strip() == "accepted run 1 seq 1 (started)"
    assert delivered.json() == {"status": "delivered", "payload": {"approved": True},
                                "sender": "ana", "delivered_at": delivered.json()["delivered_at"],
                                "run_id": 1}
    assert again.ok().strip() == "duplicate run 1 seq 3"
    assert cleared.json() == {"status": "accepted", "run_id": 1, "seq": 2, "started": False,
                              "dead_letter_id": None}
    assert lost.ok().startswith("already_delivered to run 1 (won by 'ana' at ")

    Board.broken = False
    async with corral.open_runtime(db_path, entities=app.entities) as rt:
        b1, b3 = rt.ref(Board, "b-1"), rt.ref(Board, "b-3")
        assert await b1.query(Board.read, activate=True) == ["first", "second"]
        assert await b3.query(Board.read, activate=True) == []  # "new", then cleared
        assert await rt.ref(Approval, "a-1").result(timeout=30) is True
        listed = {(e.entity_type, e.key): e for e in (await rt.entities()).items}
        assert listed[("Board", "b-3")].accepted_seq == 2


async def test_dead_letters_are_replayed_and_discarded_by_id_and_all_at_once(
    db_path: str, tmp_path: Path,
) -> None:
    seeded = await _seed(db_path)
    boom, bang, bang2, late = (seeded[k] for k in (
        ("b-1", "boom"), ("b-2", "bang"), ("b-2", "bang2"), ("b-4", "late")))

    replayed, discarded = await _all(
        ["dead-letters", "replay", str(boom)],  # found by id
        ["dead-letters", "discard", str(bang), "--type", "Board", "--key", "b-2"],
        store=db_path, cwd=tmp_path)
    retried, again, gone, bulk = await _all(
        ["dead-letters", "replay", str(boom), "--type", "Board", "--key", "b-1"],
        ["dead-letters", "replay", str(boom)],
        ["dead-letters", "replay", str(boom), str(bang)],
        ["dead-letters", "replay", "--all", "--json"],
        store=db_path, cwd=tmp_path)
    rest = await _corral(["dead-letters", "discard", "--all", "--type", "Board"],
                         store=db_path, cwd=tmp_path)

    assert replayed.ok().strip() == f"replayed dead letter {boom} of Board 'b-1': " \
                                    f"accepted run 1 seq 3"
    assert discarded.ok().strip() == f"discarded dead letter {bang} of Board 'b-2'"
    # A replay retried is answered duplicate (and applied once), named by its entity or
    # by its id alone (found through its replay); a discarded one is not found.
    assert retried.ok().strip().endswith(": duplicate run 1 seq 3")
    assert again.ok().strip() == f"replayed dead letter {boom} of Board 'b-1': " \
                                 f"duplicate run 1 seq 3"
    assert gone.returncode == 1
    assert gone.stderr == f"error: DeadLetterNotFoundError: no dead letter {bang} " \
                          f"among the store's dead letters\n"
    # b-4 was terminated: its replay fails and is reported, the other one is replayed.
    assert bulk.returncode == 1
    outcomes = {o["id"]: o for o in json.loads(bulk.stdout)}
    assert outcomes[bang2]["ack"] == {"status": "accepted", "run_id": 1, "seq": 3,
                                      "started": False, "dead_letter_id": None}
    assert outcomes[late]["error"]["type"] == "EntityNotRunningError"
    assert bulk.stderr.startswith("error: EntityNotRunningError: ")
    assert rest.ok().strip() == "discarded 1 dead letter"

    Board.broken = False  # the handler is fixed: the replayed notes are taken now
    async with corral.open_runtime(db_path, entities=app.entities) as rt:
        assert await rt.ref(Board, "b-1").query(Board.read, activate=True) == ["first", "boom"]
        assert await rt.ref(Board, "b-2").query(Board.read, activate=True) == ["bang2"]
        assert await rt.dead_letters() == []


_NOTE = ("--payload", '{"text": "x"}')
_SIGNAL = ("signal", "Board", "b-1", "post")
_DECIDE = ("deliver", "Approval", "a-1", "decision")
_YES = ("--payload", '{"approved": true}')
BAD_INPUT: list[tuple[tuple[str, ...], str, int]] = [
    (("signal", "Nope", "b-1", "post", *_NOTE, "--message-id", "x-1"),
     "UnknownEntityTypeError", 2),
    (("signal", "Board", "b-1", "count", "--message-id", "x-1"), "UnknownHandlerError", 2),
    ((*_SIGNAL, "--payload", '{"text": ', "--message-id", "x-1"), "InvalidPayloadError", 2),
    ((*_SIGNAL, "--payload", '{"text": ""}', "--message-id", "x-1"), "InvalidPayloadError", 2),
    (("signal", "Board", "b 1", "post", *_NOTE, "--message-id", "x-1"), "InvalidKeyError", 2),
    (("signal", "Board", "b-9", "post", *_NOTE, "--message-id", "x-1", "--start",
      '{"title": 5}'), "InvalidPayloadError", 2),
    (("signal", "Board", "b-9", "post", *_NOTE, "--message-id", "x-1"),
     "EntityNotRunningError", 1),
    (("deliver", "Nope", "a-1", "decision", *_YES, "--key", "k-1"), "UnknownEntityTypeError", 2),
    (("deliver", "Approval", "a-1", "verdict", *_YES, "--key", "k-1"), "UnknownHandlerError", 2),
    ((*_DECIDE, "--payload", "yes", "--key", "k-1"), "InvalidPayloadError", 2),
    ((*_DECIDE, "--payload", '{"approved": "maybe"}', "--key", "k-1"), "InvalidPayloadError", 2),
    ((*_DECIDE, *_YES, "--key", "k" * 513), "InvalidKeyError", 2),
    (("deliver", "Approval", "a-9", "decision", *_YES, "--key", "k-1"),
     "EntityNotRunningError", 1),
    (("dead-letters", "replay", "1", "--type", "Nope", "--key", "b-1"),
     "UnknownEntityTypeError", 2),
    (("dead-letters", "replay", "1", "--type", "Board", "--key", "b 1"), "InvalidKeyError", 2),
    (("dead-letters", "discard", "99999"), "DeadLetterNotFoundError", 1),
]


async def test_bad_input_to_the_console_script_is_one_typed_line_and_stores_nothing(
    db_path: str, tmp_path: Path,
) -> None:
    await _seed(db_path)
    before = row_counts(db_path)
    cases = [BAD_INPUT[i] for i in (2, 8, 13, 6)]  # one of each command, and one refused

    done = await _all(*(args for args, _, _ in cases), store=db_path, cwd=tmp_path)

    for result, (_, error, status) in zip(done, cases, strict=True):
        assert (result.returncode, result.stdout) == (status, ""), (result.args, result.stderr)
        lines = result.stderr.splitlines()
        assert len(lines) == 1, (result.args, result.stderr)
        assert lines[0].startswith(f"error: {error}: "), (result.args, lines[0])
    assert row_counts(db_path) == before


# -- the rest of the bad input, in this process: `main()` is what the console script runs --


@pytest.fixture
def in_process(db_path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A seeded store that `main()` in this process reads from the environment."""
    asyncio.run(_seed(db_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # load_app adds the working directory
    for name, value in _env(db_path).items():
        monkeypatch.setenv(name, value)
    return db_path


MORE_BAD_INPUT: list[tuple[tuple[str, ...], str, int]] = [
    (("signal", "Board", "b-1", "mailbox", "--message-id", "x-1"), "UnknownHandlerError", 2),
    ((*_SIGNAL, "--payload", '{"text": "a", "text": "b"}', "--message-id", "x-1"),
     "InvalidPayloadError", 2),
    ((*_SIGNAL, "--payload", '{"text": "x", "colour": "red"}', "--message-id", "x-1"),
     "InvalidPayloadError", 2),
    ((*_SIGNAL, "--payload", '["x"]', "--message-id", "x-1"), "InvalidPayloadError", 2),
    ((*_SIGNAL, "--payload", '{"text": NaN}', "--message-id", "x-1"), "InvalidPayloadError", 2),
    ((*_SIGNAL, "--payload", "[" * 100_000, "--message-id", "x-1"), "InvalidPayloadError", 2),
    ((*_SIGNAL, *_NOTE, "--message-id", "x\x07"), "InvalidKeyError", 2),
    ((*_SIGNAL, *_NOTE, "--message-id", "x-1", "--sender", ""), "InvalidKeyError", 2),
    ((*_SIGNAL, *_NOTE, "--message-id", "send:Board/b-2/1/1"), "InvalidKeyError", 2),
    ((*_SIGNAL, *_NOTE, "--message-id", "replay:1:n-1"), "InvalidKeyError", 2),
    (("signal", "Board", "b-9", "post", *_NOTE, "--message-id", "x-1", "--start", "{"),
     "InvalidPayloadError", 2),
    (("signal", "Approval", "a-9", "post", *_NOTE, "--message-id", "x-1", "--start", "{}"),
     "UnknownHandlerError", 2),
    (("deliver", "Approval", "a/../1 ", "decision", *_YES, "--key", "k-1"), "InvalidKeyError", 2),
    ((*_DECIDE, *_YES, "--key", "k\n"), "InvalidKeyError", 2),
    (("dead-letters", "replay", "--all", "--type", "Nope"), "UnknownEntityTypeError", 2),
    (("dead-letters", "discard"), "InvalidArgumentError", 2),
    (("dead-letters", "discard", "1", "--all"), "InvalidArgumentError", 2),
    (("dead-letters", "replay", str(2**70)), "InvalidArgumentError", 2),
    (("dead-letters", "replay", "1", str(2**63), "--type", "Board", "--key", "b-1"),
     "InvalidArgumentError", 2),
    (("dead-letters", "discard", "0"), "BadParameter", 2),  # click checks min=1
    (("ls", "--status", "asleep"), "InvalidArgumentError", 2),
    (("ls", "--after", "not-a-cursor"), "InvalidArgumentError", 2),
    (("waits", "--limit", "0"), "InvalidArgumentError", 2),
    (("show", "Board", "b\u0000"), "InvalidKeyError", 2),
    ((*_SIGNAL, *_NOTE, "--message-id", "x-1", "--app", "no_such_module:app"),
     "InvalidArgumentError", 2),
    ((*_SIGNAL, *_NOTE, "--message-id", "x-1", "--store", "missing.db"),
     "InvalidArgumentError", 2),
    (("ui", "--store", "missing.db"), "InvalidArgumentError", 2),
    (("ui", "--token", "short"), "ValueError", 2),  # the dashboard's check, before it serves
]


def test_bad_input_to_every_write_command_is_one_typed_line_and_stores_nothing(
    in_process: str, capsys: pytest.CaptureFixture[str],
) -> None:
    before = row_counts(in_process)

    for args, error, status in BAD_INPUT + MORE_BAD_INPUT:
        assert main(list(args)) == status, args
        out, err = capsys.readouterr()
        assert out == "", args
        assert err.count("\n") == 1, (args, err)
        assert err.startswith(f"error: {error}: "), (args, err)
    assert row_counts(in_process) == before
    assert not Path("missing.db").exists()


def test_usage_errors_exit_2_and_only_debug_shows_a_traceback(
    in_process: str, capsys: pytest.CaptureFixture[str],
) -> None:
    for args, line in [
        ([*_SIGNAL, *_NOTE], "MissingParameter: corral signal: Missing option '--message-id'. "
                             "(corral signal -h for help)"),
        (["dead-letters", "replay", "x"], "BadParameter: corral dead-letters replay: Invalid "
                                          "value for 'ID...': Input should be a valid integer"),
        (["dead-letters", "discard", "-5"], "NoSuchOption: corral dead-letters discard: No such "
                                            "option: -5 (corral dead-letters discard -h for help)"),
        (["ls", "--limit", "many"], "BadParameter: corral ls: Invalid value for '--limit'"),
        (["show"], "MissingParameter: corral show: Missing argument 'TYPE'."),
        (["nodes", "--bogus"], "NoSuchOption: corral nodes list: No such option: --bogus"),
        (["metrics", "--port", "70000"], "BadParameter: corral metrics: Invalid value for"),
        (["lss"], "UsageError: corral: No such command 'lss'."),
    ]:
        assert main(args) == 2, args
        out, err = capsys.readouterr()
        assert out == "", args
        assert err.count("\n") == 1, err  # one line, not click's boxed panel
        assert err.startswith(f"error: {line}"), err

    with pytest.raises(corral.UnknownEntityTypeError):
        main(["--debug", "show", "Nope", "k"])
    assert main(["show", "Nope", "k"]) == 2
    assert capsys.readouterr().err.startswith(
        "error: UnknownEntityTypeError: the --app has no entity type 'Nope'")
