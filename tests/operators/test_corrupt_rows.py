"""Rows damaged or written by hand into the store, as the API, the `corral` command and
the dashboard meet them: each a `CorruptRowError` naming the entity, table and column
(one `error:` line and exit 1 on the command line, a 422 page on the dashboard), never a
bare `JSONDecodeError`, `KeyError` or `RecursionError`, a traceback or a 500; never a
`StoreError` retried for ever; an entity whose rows a host cannot read is suspended
with the error, and a deployment-wide view (the entity list, `/metrics`, the dead
letters, the builds) goes on without the bad row, naming it.

The store is seeded by a host (Board b-1 and b-2 with a snapshot, b-1 with a dead
letter), then given one message each by a pure client, left unapplied in the journal;
then one row is damaged through `tests/support/stores.py`, on both stores (the column
types PostgreSQL enforces are damaged on SQLite only). The command runs as `main()` in
this process; the dashboard is its ASGI app on an open pure client.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import corral
from cli_app import Board, BoardInput, Note, app
from corral.cli import main
from corral.dashboard import create_app
from procs import wait_until
from stores import sql

TOKEN = "corrupt-rows-token-0123456789abcdef"


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
        ) -> Iterator[Callable[..., tuple[int, str, str]]]:
    """`corral <args> --store <store> [--app cli_app:app]` in this process."""
    for name in [n for n in os.environ if n.startswith("CORRAL_")]:
        monkeypatch.delenv(name)
    monkeypatch.setattr(sys, "path", list(sys.path))

    def command(store: str, *args: str, app_spec: bool = True) -> tuple[int, str, str]:
        extra = ("--app", "cli_app:app") if app_spec else ()
        return run_cli(capsys, *args, "--store", store, *extra)

    return command


def error_line(ran: tuple[int, str, str]) -> str:
    """The one line of a failed command, checked: exit 1, nothing on stdout."""
    code, out, err = ran
    assert (code, out) == (1, ""), ran
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


async def seed(store: str) -> None:
    async with corral.open_runtime(store, entities=app.entities) as rt:
        for key in ("b-1", "b-2"):
            await rt.ref(Board, key).signal_with_start(
                Board.post, Note(text="first"), start=BoardInput(title=key))
        await rt.ref(Board, "b-1").signal(Board.fragile, Note(text="boom"))

        async def dead() -> bool:
            return bool(await rt.dead_letters())
        await wait_until(dead, "the fragile signal is dead-lettered")
    async with corral.open_runtime(store, entities=app.entities, host=False) as rt:
        for key in ("b-1", "b-2"):
            await rt.ref(Board, key).signal(Board.post, Note(text="later"))


async def pages(store: str, *paths: str) -> dict[str, httpx.Response]:
    """The dashboard's answers to `paths`, on a pure client of `store`."""
    async with corral.open_runtime(store, entities=app.entities, host=False) as rt:
        transport = httpx.ASGITransport(app=create_app(rt, token=TOKEN))
        async with httpx.AsyncClient(transport=transport, base_url="http://dashboard",
                                     headers={"Authorization": f"Bearer {TOKEN}"}) as web:
            return {p: await web.get(p) for p in paths}


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# -- item 13 and 15: stored JSON ----------------------------------------------------------

JSON_CASES = {
    # case: (statement, table, column, what reads it)
    "start input": ("UPDATE runs SET start_input = '{' WHERE key = 'b-1'", "runs",
                    "start_input", "describe"),
    "result": ("UPDATE runs SET result = 'not json' WHERE key = 'b-1'", "runs", "result",
               "describe"),
    "journal payload": ("UPDATE journal SET payload = '{\"text\":' WHERE key = 'b-1'",
                        "journal", "payload", "state"),
    "dead-letter payload": ("UPDATE dead_letters SET payload = '[1,' WHERE key = 'b-1'",
                            "dead_letters", "payload", "history"),
    "deep journal payload": (f"UPDATE journal SET payload = '{nested(3000)}' "
                             "WHERE key = 'b-1'", "journal", "payload", "state"),
    # deeper than corral writes, though every Python's parser reads it (pydantic would
    # refuse to encode it again, untyped): corral's own bound, on every version
    "journal payload past the bound": (f"UPDATE journal SET payload = '{nested(300)}' "
                                       "WHERE key = 'b-1'", "journal", "payload", "state"),
    # not JSON, read the same way: a value outside its column's domain
    "run status": ("UPDATE runs SET status = 'bogus' WHERE key = 'b-1'", "runs", "status",
                   "describe"),
}


@pytest.mark.parametrize("case", sorted(JSON_CASES))
def test_stored_json_that_does_not_decode_is_a_corrupt_row_error_naming_the_entity(
        db_path: str, case: str, cli: Callable[..., tuple[int, str, str]]) -> None:
    statement, table, column, reader = JSON_CASES[case]
    asyncio.run(seed(db_path))
    sql(db_path, statement)

    async def read() -> tuple[corral.CorruptRowError, corral.Page[Any]]:
        async with corral.open_runtime(db_path, entities=app.entities, host=False) as rt:
            ref = rt.ref(Board, "b-1")
            with pytest.raises(corral.CorruptRowError) as caught:
                await getattr(ref, reader)()
            return caught.value, await rt.entities()

    err, listed = asyncio.run(read())
    assert (err.entity_type, err.key, err.table, err.column) == ("Board", "b-1", table, column)
    assert not isinstance(err, corral.StoreError)
    assert [e.key for e in listed.items] == ["b-1", "b-2"]  # the listing is untouched
    line = error_line(cli(db_path, "history", "Board", "b-1"))
    assert line.startswith("error: CorruptRowError: Board 'b-1' run 1"), line
    assert f"{table}.{column}" in line, line
    found = asyncio.run(pages(db_path, "/entities/Board/b-1?view=history", "/",
                              "/dead-letters"))
    history = found["/entities/Board/b-1?view=history"]
    assert history.status_code == 422, history.text
    assert "CorruptRowError" in history.text
    assert f"{table}.{column}" in history.text
    assert [found[p].status_code for p in ("/", "/dead-letters")] == [200, 200]


def test_a_dead_letter_listing_names_a_payload_that_does_not_decode_and_lists_the_rest(
        db_path: str, cli: Callable[..., tuple[int, str, str]]) -> None:
    asyncio.run(seed(db_path))
    sql(db_path, f"UPDATE dead_letters SET payload = '{nested(3000)}'")

    code, out, err = cli(db_path, "dead-letters", "--json")

    assert (code, err) == (0, ""), err
    [letter] = json.loads(out)
    assert letter["payload"] is None
    assert "dead_letters.payload is JSON nested too deeply" in letter["unreadable"]


def test_a_snapshot_nested_too_deeply_is_a_snapshot_restore_error_naming_it(
        db_path: str) -> None:
    asyncio.run(seed(db_path))
    sql(db_path, "UPDATE snapshots SET state = ? WHERE key = 'b-1'",
        nested(3000).encode())

    async def query() -> corral.SnapshotRestoreError:
        async with corral.open_runtime(db_path, entities=app.entities, host=False) as rt:
            with pytest.raises(corral.SnapshotRestoreError) as caught:
                await rt.ref(Board, "b-1").query(Board.read)
            with pytest.raises(corral.SnapshotRestoreError):
                await rt.ref(Board, "b-1").state()
            return caught.value

    err = asyncio.run(query())
    assert (err.entity_type, err.key) == ("Board", "b-1")
    assert "snapshots.state is JSON nested too deeply" in str(err)


class Counter(corral.Entity):
    snapshots = corral.SnapshotPolicy(every=1)

    def __init__(self) -> None:
        self.count = 0  # not annotated: restored as the JSON it is

    @corral.signal
    def bump(self) -> None:
        self.count += 1

    @corral.query
    def total(self) -> int:
        return self.count


def test_a_query_answer_that_does_not_match_its_annotation_is_a_query_result_error(
        db_path: str) -> None:
    async def bumped() -> None:
        async with corral.open_runtime(db_path, entities=[Counter]) as rt:
            await rt.ref(Counter, "c-1").signal_with_start(Counter.bump, start=None)
            await wait_until(lambda: sql(db_path, "SELECT count(*) FROM snapshots") == [(1,)],
                             "the snapshot is written")

    asyncio.run(bumped())
    [(blob,)] = sql(db_path, "SELECT state FROM snapshots")
    envelope = json.loads(bytes(blob))
    envelope["state"]["count"] = {"many": True}
    sql(db_path, "UPDATE snapshots SET state = ?", json.dumps(envelope).encode())

    async def query() -> corral.QueryResultError:
        async with corral.open_runtime(db_path, entities=[Counter], host=False) as rt:
            with pytest.raises(corral.QueryResultError) as caught:
                await rt.ref(Counter, "c-1").query(Counter.total)
            return caught.value

    err = asyncio.run(query())
    assert (err.entity_type, err.key) == ("Counter", "c-1")
    assert "query 'total'" in str(err)


# -- item 12: builds -----------------------------------------------------------------------

FORGED_BUILDS = {"not json": "not json", "no handlers": '{"fingerprint": "forged"}'}


@pytest.mark.parametrize("manifest", sorted(FORGED_BUILDS))
def test_a_forged_build_row_neither_stops_a_deployment_nor_an_operator_view(
        db_path: str, manifest: str, cli: Callable[..., tuple[int, str, str]]) -> None:
    asyncio.run(seed(db_path))
    sql(db_path, "INSERT INTO builds (etype, fingerprint, manifest, first_seen, last_seen, "
        "older) VALUES ('Board', 'forged', ?, 1e10, 1e10, ?)", FORGED_BUILDS[manifest],
        False)

    async def deployment() -> list[corral.BuildInfo]:
        async with corral.open_runtime(db_path, entities=app.entities) as rt:
            ref = rt.ref(Board, "b-1")
            await ref.signal(Board.post, Note(text="after"))
            assert await ref.query(Board.read) == ["first", "later", "after"]
            return await rt.builds("Board")

    infos = asyncio.run(deployment())
    forged = next(b for b in infos if b.fingerprint == "forged")
    assert (forged.compatible, forged.newest) == (False, False)
    assert "CorruptRowError" not in forged.why
    assert "builds.manifest" in forged.why
    assert [b.newest for b in infos if b.fingerprint != "forged"] == [True]
    code, out, err = cli(db_path, "builds", app_spec=False)
    assert (code, err) == (0, ""), err
    assert "forged" in out
    code, out, err = cli(db_path, "ls")
    assert (code, err) == (0, ""), err
    found = asyncio.run(pages(db_path, "/", "/entities/Board/b-1"))
    assert [r.status_code for r in found.values()] == [200, 200]


# -- item 14: rows that do not decode ------------------------------------------------------


def test_an_unknown_journal_kind_suspends_its_entity_alone_with_the_corrupt_row_error(
        db_path: str, cli: Callable[..., tuple[int, str, str]]) -> None:
    asyncio.run(seed(db_path))
    sql(db_path, "UPDATE journal SET kind = 'bogus' WHERE key = 'b-1'")

    async def host() -> corral.EntityDescription:
        async with corral.open_runtime(db_path, entities=app.entities) as rt:
            ref = rt.ref(Board, "b-1")

            async def suspended() -> bool:
                return (await ref.describe()).suspension is not None
            await wait_until(suspended, "b-1 is suspended")
            assert await rt.ref(Board, "b-2").query(Board.read) == ["first", "later"]
            return await ref.describe()

    described = asyncio.run(host())
    assert described.status is corral.RunStatus.RUNNING
    assert described.suspension is not None
    assert "CorruptRowError: Board 'b-1' run 1 seq 3: the stored journal.kind is 'bogus'" \
        in described.suspension.error
    code, out, err = cli(db_path, "ls")
    assert (code, err) == (0, ""), err
    assert "running (suspended)" in out


def test_a_text_snapshot_on_sqlite_suspends_its_entity_with_the_corrupt_row_error(
        tmp_path: Path) -> None:
    store = str(tmp_path / "corral.db")
    asyncio.run(seed(store))
    sql(store, "UPDATE snapshots SET state = CAST(state AS TEXT) WHERE key = 'b-1'")

    async def host() -> str:
        async with corral.open_runtime(store, entities=app.entities) as rt:
            ref = rt.ref(Board, "b-1")

            async def suspended() -> bool:
                return (await ref.describe()).suspension is not None
            await wait_until(suspended, "b-1 is suspended")
            found = (await ref.describe()).suspension
            assert found is not None
            return found.error

    assert "the stored snapshots.state is str, not bytes" in asyncio.run(host())


def test_one_unreadable_entity_row_never_breaks_the_entity_list(
        db_path: str, cli: Callable[..., tuple[int, str, str]]) -> None:
    asyncio.run(seed(db_path))
    sql(db_path, "UPDATE entities SET status = 'bogus' WHERE key = 'b-1'")

    async def listed() -> corral.Page[corral.EntitySummary]:
        async with corral.open_runtime(db_path, entities=app.entities, host=False) as rt:
            return await rt.entities(limit=1)

    page = asyncio.run(listed())
    assert page.items == []
    [why] = page.unreadable
    assert why.startswith("Board 'b-1': the stored entities.status is 'bogus'"), why
    assert page.next_cursor is not None  # past the unreadable row: b-2 comes next
    code, out, err = cli(db_path, "ls")
    assert (code, err) == (0, ""), err
    assert "b-2" in out
    assert "unreadable (left out): Board 'b-1'" in out
    found = asyncio.run(pages(db_path, "/", "/metrics"))
    assert [r.status_code for r in found.values()] == [200, 200]
    assert "entities.status is" in found["/"].text
    assert "b-2" in found["/"].text


@pytest.mark.parametrize("statement", [
    "UPDATE journal SET accepted_at = 'yesterday' WHERE key = 'b-1'",
    "UPDATE entities SET updated_at = 'noon' WHERE key = 'b-1'",
])
def test_a_text_time_on_sqlite_is_named_and_never_breaks_a_deployment_wide_view(
        tmp_path: Path, statement: str, cli: Callable[..., tuple[int, str, str]]) -> None:
    store = str(tmp_path / "corral.db")
    asyncio.run(seed(store))
    sql(store, statement)

    code, out, err = cli(store, "ls")
    assert (code, err) == (0, ""), err
    assert "b-2" in out
    assert "unreadable (left out): Board 'b-1'" in out
    found = asyncio.run(pages(store, "/", "/metrics", "/entities/Board/b-2"))
    assert [r.status_code for r in found.values()] == [200, 200, 200]
    if "journal" in statement:
        line = error_line(cli(store, "history", "Board", "b-1"))
        assert "journal.accepted_at is 'yesterday'" in line, line


def test_a_text_timer_on_sqlite_is_a_corrupt_row_error_naming_the_entity(
        tmp_path: Path, cli: Callable[..., tuple[int, str, str]]) -> None:
    store = str(tmp_path / "corral.db")
    asyncio.run(seed(store))
    sql(store, "INSERT INTO timers (etype, key, run_id, timer_id, shard, due_at) "
        "SELECT etype, key, run_id, 't', shard, 'soon' FROM entities WHERE key = 'b-1'")

    for verb in ("show", "history"):
        line = error_line(cli(store, verb, "Board", "b-1"))
        assert line.startswith("error: CorruptRowError: Board 'b-1'"), line
        assert "timers.due_at is 'soon'" in line, line
    found = asyncio.run(pages(store, "/entities/Board/b-1", "/"))
    assert [r.status_code for r in found.values()] == [422, 200]

