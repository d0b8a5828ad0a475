"""The operator tools (the `corral` command and the dashboard) given what an operator
gets wrong: an application that does not load, a store that is not one (`:memory:`, a
typo'd file, the application's own database), a store of another shard count, terminal
escapes in what they print, the application's own `Limits`, and forged listing cursors.

The console script runs as a real subprocess for each kind of case, and the rest
through `main()` in this process (what the console script runs); stores are real
SQLite files under `tmp_path` and the session's PostgreSQL database (`db_path`).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

import corral
from cli_app import LIMITS, Board, BoardInput, Flare, Note, app
from corral.cli import main
from procs import wait_until
from stores import reset_postgres, row_counts

TESTS = Path(__file__).resolve().parents[1] / "support"
CORRAL = Path(sys.executable).with_name("corral")  # the console script of this venv
TOKEN = "operator-inputs-token-0123456789"


@dataclass(frozen=True)
class Ran:
    """One finished `corral` invocation."""

    returncode: int
    stdout: str
    stderr: str

    def refused(self, error: str, status: int = 2) -> str:
        """The one error line, checked to be `error` with exit `status` and no output."""
        assert (self.returncode, self.stdout) == (status, ""), self
        lines = self.stderr.splitlines()
        assert len(lines) == 1, self.stderr
        assert lines[0].startswith(f"error: {error}: "), lines[0]
        return lines[0]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), env.get("PYTHONPATH")) if p)
    return env | {"RAY_AUTH_MODE": "disabled", **extra}


async def corral_command(*args: str, cwd: Path, **env: str) -> Ran:
    """The console script, as a subprocess."""
    proc = await asyncio.create_subprocess_exec(
        str(CORRAL), *args, cwd=cwd, env=_env(**env), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode is not None
    return Ran(proc.returncode, out.decode(), err.decode())


@pytest.fixture
def in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
               capsys: pytest.CaptureFixture[str]) -> Callable[..., Ran]:
    """`main()` in this process, in `tmp_path` (importable, as `--app` makes it)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in [n for n in os.environ if n.startswith("CORRAL_")]:
        monkeypatch.delenv(name)

    def run(*args: str) -> Ran:
        code = main(list(args))
        out, err = capsys.readouterr()
        return Ran(code, out, err)

    return run


async def seed(store: str, *, shards: int = 16, limits: corral.Limits | None = None) -> None:
    """The application's store: Board b-1 running with one note."""
    async with corral.open_runtime(store, entities=app.entities, shards=shards,
                                   limits=limits) as rt:
        await rt.ref(Board, "b-1").signal_with_start(
            Board.post, Note(text="first"), start=BoardInput(title="one"), message_id="s-1")


def sqlite_store(tmp_path: Path) -> str:
    """A seeded SQLite store (for cases where which store does not matter)."""
    path = str(tmp_path / "app.db")
    asyncio.run(seed(path))
    return path


_SIGNAL = ("signal", "Board", "b-1", "post", "--payload", '{"text": "x"}', "--message-id", "op-1")
_START = ("--start", '{"title": "t"}')


# -- item 6: an --app that fails to import or build --------------------------------------

BROKEN_APPS = {
    "raises": 'raise RuntimeError("no config file")\n',
    "syntax": "def (:\n",
    "names": "APP = undefined_name\n",
    "build_raises": 'def APP():\n    raise RuntimeError("cannot build")\n',
    "needs_arguments": "def APP(config):\n    return []\n",
    "not_iterable": "class _App:\n    entities = 5\n\nAPP = _App()\n",
    "app_not_iterable": "import corral\n\nAPP = corral.App(entities=5)\n",
    "same_name_twice": "from cli_app import Board\n\nAPP = [Board, Board]\n",
}


def broken_apps(where: Path) -> dict[str, str]:
    """Each broken application as a module in `where`; their `--app` specs by kind."""
    specs = {}
    for kind, source in BROKEN_APPS.items():
        module = f"broken_{kind}_{uuid.uuid4().hex[:8]}"
        (where / f"{module}.py").write_text(source)
        specs[kind] = f"{module}:APP"
    return specs


async def test_an_app_that_raises_at_import_is_one_line_and_exit_2_from_the_console_script(
    tmp_path: Path,
) -> None:
    store = str(tmp_path / "app.db")
    await seed(store)
    specs = broken_apps(tmp_path)

    listed, served = await asyncio.gather(
        corral_command("ls", "--store", store, "--app", specs["raises"], cwd=tmp_path),
        corral_command("ui", "--store", store, "--app", specs["syntax"], "--port", "0",
                       cwd=tmp_path))

    assert "RuntimeError: no config file" in listed.refused("InvalidArgumentError")
    assert "SyntaxError" in served.refused("InvalidArgumentError")


def test_every_app_that_fails_to_import_or_build_is_one_line_and_exit_2_for_ls_signal_and_ui(
    tmp_path: Path, in_process: Callable[..., Ran],
) -> None:
    store = sqlite_store(tmp_path)
    before = Path(store).read_bytes()

    for kind, spec in broken_apps(tmp_path).items():
        for args in (("ls",), (*_SIGNAL, *_START), ("ui", "--port", "0")):
            line = in_process(*args, "--store", store, "--app", spec).refused(
                "InvalidArgumentError")
            assert f"--app {spec}" in line, (kind, args, line)
    assert Path(store).read_bytes() == before


# -- item 7: :memory: is refused ----------------------------------------------------------


async def test_signal_to_a_memory_store_is_refused_rather_than_acknowledged_and_lost(
    tmp_path: Path,
) -> None:
    sent = await corral_command(*_SIGNAL, *_START, "--store", ":memory:", "--app",
                                "cli_app:app", cwd=tmp_path)

    assert ":memory:" in sent.refused("InvalidArgumentError")
    assert _files(tmp_path) == {}


def test_every_operator_command_refuses_a_memory_store(
    tmp_path: Path, in_process: Callable[..., Ran],
) -> None:
    commands = [_SIGNAL, ("deliver", "Approval", "a-1", "decision", "--payload",
                          '{"approved": true}', "--key", "k-1"),
                ("dead-letters", "replay", "--all"), ("dead-letters", "discard", "1"),
                ("ls",), ("show", "Board", "b-1"), ("waits",), ("dead-letters",),
                ("ui", "--port", "0", "--token", TOKEN)]
    for args in commands:
        for memory in (":memory:", "sqlite:///:memory:"):
            line = in_process(*args, "--store", memory, "--app", "cli_app:app").refused(
                "InvalidArgumentError")
            assert ":memory:" in line, (args, line)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# -- item 8: never create or convert a store ---------------------------------------------


async def _app_database(location: str) -> None:
    """The application's own database at `location`: a table of orders, no corral."""
    if location.startswith("postgresql://"):
        import asyncpg  # type: ignore[import-untyped, import-not-found, unused-ignore]

        conn = await asyncpg.connect(location)
        try:
            await conn.execute("DROP TABLE IF EXISTS orders")
            await conn.execute("CREATE TABLE orders (id int PRIMARY KEY, total int)")
            await conn.execute("INSERT INTO orders VALUES (1, 40)")
        finally:
            await conn.close()
        return
    with sqlite3.connect(location) as db:
        db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER)")
        db.execute("INSERT INTO orders VALUES (1, 40)")
    db.close()


async def _postgres_state(url: str) -> tuple[int, int, int]:
    """(meta rows, lease rows, orders): what opening a store would have added."""
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        counts = []
        for table in ("meta", "leases", "orders"):
            there = await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", table)
            counts.append(await conn.fetchval(f"SELECT count(*) FROM {table}") if there else 0)
        return counts[0], counts[1], counts[2]
    finally:
        await conn.close()


def _files(where: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in where.iterdir()
            if p.is_file()}


async def test_a_signal_to_the_applications_own_database_is_refused_and_adds_no_corral_table(
    db_path: str, tmp_path: Path,
) -> None:
    await _app_database(db_path)
    before = await _postgres_state(db_path) if db_path.startswith("postgresql://") \
        else _files(tmp_path)

    sent = await corral_command(*_SIGNAL, *_START, "--store", db_path, "--app", "cli_app:app",
                                cwd=tmp_path)

    assert "is not a corral store" in sent.refused("InvalidArgumentError")
    if db_path.startswith("postgresql://"):
        assert await _postgres_state(db_path) == before == (0, 0, 1)
    else:
        assert _files(tmp_path) == before  # no table added, no journal mode, no new file
        with sqlite3.connect(db_path) as db:
            tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master")]
        db.close()
        assert tables == ["orders"]


def test_no_command_turns_an_empty_file_into_a_store(
    tmp_path: Path, in_process: Callable[..., Ran],
) -> None:
    (tmp_path / "typo.db").touch()

    for args in (_SIGNAL, (*_SIGNAL, *_START), ("ls",), ("waits",), ("dead-letters",),
                 ("show", "Board", "b-1"), ("ui", "--port", "0", "--token", TOKEN)):
        ran = in_process(*args, "--store", "typo.db", "--app", "cli_app:app")
        assert "is not a corral store" in ran.refused("InvalidArgumentError"), args
    assert [(p.name, p.stat().st_size) for p in tmp_path.iterdir()] == [("typo.db", 0)]


def test_a_store_of_an_older_schema_is_refused_not_migrated(
    tmp_path: Path, in_process: Callable[..., Ran],
) -> None:
    store = tmp_path / "old.db"
    shutil.copy(TESTS / "data" / "store-schema-1.db", store)
    before = _files(tmp_path)

    line = in_process("ls", "--store", str(store), "--app", "cli_app:app").refused(
        "StoreError", status=1)

    assert "schema version '1'" in line
    assert _files(tmp_path) == before


# -- item 9: the shard count is the store's -----------------------------------------------


@pytest.fixture
def ui_process(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Starts `corral ui` as a subprocess; stops each with SIGTERM at the end."""
    started: list[subprocess.Popen[str]] = []

    def start(*args: str, **env: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen([str(CORRAL), "ui", "--port", "0", "--token", TOKEN, *args],
                                cwd=tmp_path, env=_env(**env), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


async def test_ls_and_ui_use_the_shard_count_the_store_was_created_with(
    db_path: str, tmp_path: Path, ui_process: Callable[..., subprocess.Popen[str]],
) -> None:
    await seed(db_path, shards=4)
    served = ui_process("--store", db_path, "--app", "cli_app:app")

    listed, other = await asyncio.gather(
        corral_command("ls", "--json", "--store", db_path, "--app", "cli_app:app",
                       cwd=tmp_path),
        corral_command("ls", "--store", db_path, "--app", "cli_app:app", cwd=tmp_path,
                       CORRAL_SHARDS="16"))

    assert [e["key"] for e in json.loads(listed.stdout)["items"]] == ["b-1"], listed.stderr
    assert "created with 4 shards" in other.refused("InvalidArgumentError")
    assert served.stdout is not None
    first = await asyncio.to_thread(served.stdout.readline)
    assert first.startswith("corral dashboard: http://127.0.0.1:"), \
        (first, served.stderr.read() if served.poll() is not None and served.stderr else "")
    async with httpx.AsyncClient(base_url=first.split()[-1], timeout=20,
                                 headers={"Authorization": f"Bearer {TOKEN}"}) as web:
        page = await web.get("/?type=Board")
    assert page.status_code == 200, page.text
    assert 'class="entity">b-1</a>' in page.text


# -- item 10: control characters are escaped in every table -------------------------------

_ESCAPES = "\x1b]0;pwned\x07\x1b[2J"


async def test_dead_letters_and_show_print_terminal_escapes_escaped_and_json_stays_exact(
    db_path: str, tmp_path: Path,
) -> None:
    Board.broken = True
    async with corral.open_runtime(db_path, entities=app.entities) as rt:
        ref = rt.ref(Board, "b-1")
        await ref.signal_with_start(Board.shout, Note(text=_ESCAPES),
                                    start=BoardInput(title="one"), message_id="e-1")

        async def dead() -> bool:
            return len(await rt.dead_letters()) == 1

        await wait_until(dead, "the shout dead-lettered")
        flare = rt.ref(Flare, "f-1")
        await flare.start(start=Note(text=_ESCAPES))
        with pytest.raises(corral.EntityFailedError):
            await flare.result(timeout=30)

    table, shown, as_json = await asyncio.gather(*(
        corral_command(*args, "--store", db_path, "--app", "cli_app:app", cwd=tmp_path)
        for args in (("dead-letters",), ("show", "Flare", "f-1"), ("dead-letters", "--json"))))

    for printed in (table, shown):
        assert printed.returncode == 0, printed.stderr
        assert not any(c in printed.stdout for c in "\x1b\x07"), printed.stdout
        assert "\\x1b]0;pwned\\x07\\x1b[2J" in printed.stdout
    assert json.loads(as_json.stdout)[0]["error"] == f"RuntimeError: {_ESCAPES}"


# -- item 11: the application's Limits --------------------------------------------------


async def test_the_command_validates_with_the_applications_limits(
    db_path: str, tmp_path: Path,
) -> None:
    await seed(db_path, limits=LIMITS)
    big = json.dumps({"title": "x" * 5000})
    where = ("--store", db_path, "--app", "cli_app:limited")

    too_big, tilde, by_default = await asyncio.gather(
        corral_command("signal", "Board", "b-2", "post", "--payload", '{"text": "x"}',
                       "--message-id", "l-1", "--start", big, *where, cwd=tmp_path),
        corral_command("signal", "Board", "ops~one", "post", "--payload", '{"text": "x"}',
                       "--message-id", "l-2", *_START, *where, cwd=tmp_path),
        corral_command("signal", "Board", "ops~two", "post", "--payload", '{"text": "x"}',
                       "--message-id", "l-3", *_START, "--store", db_path, "--app",
                       "cli_app:app", cwd=tmp_path))

    assert "1024" in too_big.refused("PayloadTooLargeError")
    assert tilde.stdout.strip() == "accepted run 1 seq 1 (started)", tilde.stderr
    by_default.refused("InvalidKeyError")
    async with corral.open_runtime(db_path, entities=app.entities, limits=LIMITS,
                                   host=False) as rt:
        assert [e.key for e in (await rt.entities(Board)).items] == ["b-1", "ops~one"]


async def test_the_dashboard_validates_with_the_applications_limits(
    db_path: str, tmp_path: Path,
) -> None:
    from dashboard_app import ENTITIES, fresh, start, waiting_refund

    with start(db_path, tmp_path, app="limited") as dashboard:
        async with corral.open_runtime(db_path, entities=ENTITIES, limits=LIMITS) as rt:
            key = fresh("refund~big")
            ref = await waiting_refund(rt, key)
            async with httpx.AsyncClient(base_url=dashboard.url, timeout=20, headers={
                    "Authorization": f"Bearer {dashboard.token}"}) as web:
                detail = await web.get(f"/entities/Refund/{key}")
                page = await web.get("/waits")
                csrf = page.text.split('name="csrf" value="', 1)[1][:64]
                refused = await web.post("/waits/deliver", data={
                    "csrf": csrf, "entity_type": "Refund", "key": key, "name": "approval",
                    "run_id": "1", "delivery_key": "k-big",
                    "payload": json.dumps({"approved": True, "note": "x" * 5000})})
            assert detail.status_code == 200, detail.text
            assert refused.status_code == 413, refused.text
            assert [w.name for w in (await ref.describe()).open_waits] == ["approval"]


# -- item 12: forged cursors are bad input --------------------------------------------------


def forged(fields: list[Any]) -> str:
    """A cursor as `encode_cursor` makes them, of fields it never would."""
    return base64.urlsafe_b64encode(json.dumps(fields).encode()).decode()


FORGED = [
    ("ls", forged(["\ud800", "b-1"])),  # a lone surrogate: no UTF-8 for the store
    ("ls", forged(["Board", "b\x00"])),
    ("waits", forged([1.0, "Approval", "a-1", 2**64, "decision"])),  # run id over 2^63
    ("waits", forged([10**400, "Approval", "a-1", 1, "decision"])),  # no float
]


def test_a_forged_listing_cursor_is_bad_input_on_the_command_line(
    db_path: str, tmp_path: Path, in_process: Callable[..., Ran],
) -> None:
    asyncio.run(seed(db_path))

    for command, cursor in FORGED:
        ran = in_process(command, "--after", cursor, "--store", db_path, "--app",
                         "cli_app:app")
        assert "not a cursor of this listing" in ran.refused("InvalidArgumentError"), cursor


# -- issue 39, item 16: a payload file or stdin is read up to max_payload_bytes ---------------


def test_a_payload_from_an_endless_file_is_refused_at_the_applications_limit_for_every_option(
    db_path: str, tmp_path: Path, in_process: Callable[..., Ran],
) -> None:
    asyncio.run(seed(db_path))
    before = row_counts(db_path)
    (tmp_path / "padded.json").write_text('{"text": "x"}' + " " * 2000)  # 2 KiB of JSON

    for args in (("signal", "Board", "b-1", "post", "-p", "@/dev/zero", "--message-id", "z"),
                 ("signal", "Board", "b-2", "post", "-p", '{"text": "x"}', "--message-id", "z",
                  "--start", "@/dev/zero"),
                 ("start", "Board", "b-2", "-p", "@/dev/zero"),
                 ("update", "Board", "b-1", "count", "-p", "@/dev/zero"),
                 ("update", "Board", "b-2", "count", "--start", "@/dev/zero"),
                 ("query", "Board", "b-1", "read", "-p", "@/dev/zero"),
                 ("deliver", "Approval", "a-1", "decision", "-p", "@/dev/zero", "--key", "k")):
        line = in_process(*args, "--store", db_path, "--app", "cli_app:app").refused(
            "PayloadTooLargeError")
        assert "@/dev/zero: more than 262144 bytes" in line, (args, line)
    limited = in_process("query", "Board", "b-1", "read", "-p", "@padded.json", "--store",
                         db_path, "--app", "cli_app:limited")
    assert "more than 1024 bytes" in limited.refused("PayloadTooLargeError")  # the app's own
    assert row_counts(db_path) == before


def test_an_endless_stdin_is_refused_at_the_limit_from_the_console_script(
    db_path: str, tmp_path: Path,
) -> None:
    asyncio.run(seed(db_path))
    before = row_counts(db_path)

    with Path("/dev/zero").open("rb") as zeros:
        done = subprocess.run(
            [str(CORRAL), "signal", "Board", "b-1", "post", "-p", "-", "--message-id", "z",
             "--store", db_path, "--app", "cli_app:app"], cwd=tmp_path, env=_env(),
            stdin=zeros, capture_output=True, text=True, timeout=90, check=False)

    line = Ran(done.returncode, done.stdout, done.stderr).refused("PayloadTooLargeError")
    assert "--payload - (stdin): more than 262144 bytes" in line
    assert row_counts(db_path) == before


# -- issue 39, items 17 and 18e: a PostgreSQL URL's secrets never reach the output -----------

_SECRET = "s3cr3t"  # every secret below holds it; no output may
UNREACHABLE = [  # nothing listens on port 1: each command fails to connect (exit 1)
    f"postgresql://ana:{_SECRET}-netloc@127.0.0.1:1/db",
    f"postgresql://ana:{_SECRET}@at@127.0.0.1:1/db",  # an '@' in the password
    f"postgresql://ana@127.0.0.1:1/db?password={_SECRET}-query",
    f"postgresql://ana@127.0.0.1:1/db?sslmode=disable&sslpassword={_SECRET}-ssl",
    f"postgres://ana@127.0.0.1:1/db?passfile=/tmp/{_SECRET}-passfile",
    f"postgresql://ana@127.0.0.1:1/db?application_name=a@b&password={_SECRET}-after-at",
]
MALFORMED = [  # asyncpg cannot parse them, and quotes pieces of them (exit 2)
    f"postgresql://ana:{_SECRET}-netloc@127.0.0.1:port/db",
    f"postgresql://ana:pa55/{_SECRET}-slash@127.0.0.1/db",  # asyncpg reads port 'pa55'
    f"postgresql://ana:{_SECRET}-qmark?x=1@127.0.0.1/db",
    f"postgresql://ana@127.0.0.1/db?password={_SECRET}-query&sslmode=bogus",
    f"postgresql://ana:{_SECRET}-v6@[::1/db",
]
_APP = ("--app", "cli_app:app")
_EVERY_STORE_COMMAND = [("ls", *_APP), ("show", "Board", "b-1", *_APP), ("waits", *_APP),
                        ("history", "Board", "b-1", *_APP), ("dead-letters", *_APP),
                        (*_SIGNAL, *_START, *_APP), ("check-snapshots", *_APP),
                        ("purge", "--dry-run", *_APP), ("builds",), ("metrics", "--port", "0"),
                        ("ui", "--port", "0", "--token", TOKEN, *_APP)]


def test_no_command_prints_a_secret_of_a_postgresql_url_and_a_malformed_one_is_bad_input(
    tmp_path: Path, in_process: Callable[..., Ran],
) -> None:
    for stores, error, status in ((UNREACHABLE, "StoreUnavailableError", 1),
                                  (MALFORMED, "InvalidArgumentError", 2)):
        for store in stores:
            for args in _EVERY_STORE_COMMAND:
                line = in_process(*args, "--store", store).refused(error, status)
                assert _SECRET not in line, (args, line)
                assert "pa55" not in line, (args, line)
                assert "127.0.0.1" in line or "::1" in line, line  # which store it was


def test_the_traceback_of_debug_holds_no_secret_either(tmp_path: Path) -> None:
    for store in (UNREACHABLE[2], MALFORMED[1]):
        done = subprocess.run([str(CORRAL), "--debug", "ls", "--store", store, "--app",
                               "cli_app:app"], cwd=tmp_path, env=_env(), capture_output=True,
                              text=True, timeout=90, check=False)
        assert done.returncode == 1, done
        assert "Traceback" in done.stderr, done
        assert _SECRET not in done.stderr + done.stdout
        assert "pa55" not in done.stderr


async def test_a_store_opened_with_a_password_in_its_url_never_shows_it(
    postgres_store_url: str, tmp_path: Path,
) -> None:
    # PostgreSQL only: a SQLite path holds no secret.
    reset_postgres(postgres_store_url)
    url = f"{postgres_store_url}?password={_SECRET}-trusted"  # the test server trusts: ignored
    await seed(url)

    store = await corral.persistence.open_store(url, shards=16)
    try:
        assert _SECRET not in repr(store)
        assert "password=***" in repr(store)
    finally:
        await store.close()
    listed = await corral_command("ls", "--store", url, *_APP, cwd=tmp_path)
    assert listed.returncode == 0, listed
    assert "b-1" in listed.stdout, listed
    assert _SECRET not in listed.stdout + listed.stderr


def test_metrics_and_ui_refuse_a_host_that_is_no_address_as_bad_input(
    tmp_path: Path, in_process: Callable[..., Ran],
) -> None:
    store = sqlite_store(tmp_path)

    for command in (("metrics",), ("ui", "--token", TOKEN, *_APP)):
        for host in ("256.0.0.1", "no-such-host.invalid", "a" * 64):
            ran = in_process(*command, "--host", host, "--port", "0", "--store", store)
            assert "not an address to listen on" in ran.refused("InvalidArgumentError"), host
