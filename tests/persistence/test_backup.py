"""`corral backup` of a live store and `corral restore` of its file (`corral.persistence.
backup`, `restore`): a backup taken while signals stream in restores to a store whose
host applies every message acknowledged before the backup began, each once."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

import corral
from corral._errors import InvalidArgumentError, StoreError
from corral.persistence import backup, restore, verify
from migrate_entities import Add, Ledger, LedgerInput
from pg import pg_url as pg_fixture  # noqa: F401 (a fixture, found by name)
from procs import wait_until
from stores import sql

SHARDS = 2
KEYS = [f"stream-{i}" for i in range(5)]


async def _stream(rt: corral.Runtime, acked: list[str], stop: asyncio.Event) -> None:
    n = 0
    while not stop.is_set():
        tag = f"{n}"
        await rt.ref(Ledger, KEYS[n % len(KEYS)]).signal_with_start(
            Ledger.add, Add(tag=tag), start=LedgerInput(), message_id=f"m/{tag}")
        acked.append(tag)
        n += 1


@pytest.mark.parametrize("engines", ["sqlite-to-postgres", "postgres-to-sqlite"])
async def test_a_backup_under_a_stream_restores_every_acknowledged_message_once(
        tmp_path: Path, pg_url: str, engines: str) -> None:
    lite, file = str(tmp_path / "corral.db"), tmp_path / "backup.corral"
    live, target = (lite, pg_url) if engines == "sqlite-to-postgres" else (pg_url, lite)
    acked: list[str] = []
    stop = asyncio.Event()
    async with corral.open_runtime(live, entities=[Ledger], shards=SHARDS) as rt:
        sender = asyncio.create_task(_stream(rt, acked, stop))
        await wait_until(lambda: len(acked) >= 50, "the stream is under way")
        before = set(acked)  # acknowledged before the backup began
        copy = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "corral", "backup", "--store", live, "--to", str(file),
            "--batch", "20", env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        assert await copy.wait() == 0
        during = len(acked)
        stop.set()
        await sender
    assert len(acked) > len(before)  # the stream went on while the backup ran
    assert during > len(before)
    await restore(file, target, batch=50)
    checked = await verify(str(file), target)
    assert checked.equal, [t for t in checked.tables if not t.equal]
    async with corral.open_runtime(target, entities=[Ledger], shards=SHARDS) as rt:
        # Every message the restored store would answer `duplicate` (its dedupe window,
        # which outlives the journal's truncation) must be applied there: one of the
        # snapshot, not read later than the journal.
        remembered = {r[0] for r in sql(target, "SELECT message_id FROM dedupe")}
        in_backup = {m.removeprefix("m/") for m in remembered}
        assert before <= in_backup
        for key, next_seq in sql(target, "SELECT key, next_seq FROM entities"):
            [(top,)] = sql(target, "SELECT max(seq) FROM dedupe WHERE key = ?", key)
            assert top < next_seq, key

        async def applied() -> list[str]:
            return [t for k in KEYS
                    for t in (await rt.ref(Ledger, k).query(Ledger.state)).applied]

        async def caught_up() -> bool:
            return len(await applied()) >= len(in_backup)

        await wait_until(caught_up, "the restored store applied its journal")
        found = await applied()
        assert sorted(found) == sorted(in_backup)  # each once, none acked after it


async def test_a_backup_of_a_newer_schema_is_refused_and_nothing_restored(
        tmp_path: Path, pg_url: str) -> None:
    live, file = str(tmp_path / "corral.db"), tmp_path / "b.corral"
    async with corral.open_runtime(live, entities=[Ledger], shards=SHARDS) as rt:
        await rt.ref(Ledger, "a").start(start=LedgerInput())
    await backup(live, file)
    sql(str(file), "UPDATE meta SET v = '999' WHERE k = 'schema_version'")
    with pytest.raises(StoreError, match="newer corral"):
        await restore(file, pg_url)
    assert sql(pg_url, "SELECT to_regclass('entities') IS NULL") == [(True,)]


async def test_a_restore_into_a_store_holding_data_is_refused(tmp_path: Path) -> None:
    live, file, other = (str(tmp_path / "a.db"), tmp_path / "b.corral",
                         str(tmp_path / "c.db"))
    for location in (live, other):
        async with corral.open_runtime(location, entities=[Ledger], shards=SHARDS) as rt:
            await rt.ref(Ledger, "a").start(start=LedgerInput())
    await backup(live, file)
    before = sql(other, "SELECT count(*) FROM runs")
    with pytest.raises(InvalidArgumentError, match="not empty"):
        await restore(file, other)
    assert sql(other, "SELECT count(*) FROM runs") == before
    with pytest.raises(InvalidArgumentError, match="exists"):
        await backup(live, file)
    meta = dict(sql(str(file), "SELECT k, v FROM meta"))
    assert meta["backup.format"] == "1"
    assert meta["backup.engine"] == "sqlite"


async def _corral(*argv: str, stderr: int = asyncio.subprocess.STDOUT) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "corral", *argv, stdout=asyncio.subprocess.PIPE,
        stderr=stderr,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    out, _ = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def test_the_commands_restore_a_backup_and_verify_prints_equal_then_a_difference(
        tmp_path: Path, pg_url: str) -> None:
    live, file = str(tmp_path / "a.db"), str(tmp_path / "b.corral")
    async with corral.open_runtime(live, entities=[Ledger], shards=SHARDS) as rt:
        await rt.ref(Ledger, "a").signal_with_start(Ledger.add, Add(tag="x"),
                                                     start=LedgerInput(), message_id="x")
    assert (await _corral("backup", "--store", live, "--to", file))[0] == 0
    status, said = await _corral("restore", file, "--store", pg_url)
    assert status == 0, said
    assert "restored" in said
    assert "claimed the store: a host opening it is refused" in said
    status, said = await _corral("migrate", "--from", file, "--to", pg_url, "--verify-only")
    assert status == 0, said
    assert "the stores are equal" in said
    status, said = await _corral("migrate", "--from", pg_url, "--to",
                                 str(tmp_path / "back.db"), "--verify", "--json",
                                 stderr=asyncio.subprocess.DEVNULL)
    assert status == 0
    assert json.loads(said)["equal"] is True  # stdout: the comparison's JSON alone
    sql(pg_url, "UPDATE journal SET payload = '{\"tag\": \"y\"}'")  # not the backup's
    status, said = await _corral("migrate", "--from", file, "--to", pg_url, "--verify-only",
                                 "--json")
    assert status == 1
    assert [t["table"] for t in json.loads(said)["tables"] if not t["equal"]] == ["journal"]


async def test_the_commands_refuse_what_is_not_a_store_with_one_typed_line(
        tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.db")
    status, said = await _corral("migrate", "--from", missing, "--to", str(tmp_path / "t.db"))
    assert status == 2
    assert said.startswith("error: InvalidArgumentError: ")
    assert not (tmp_path / "t.db").exists()
    status, said = await _corral("restore", missing, "--store", str(tmp_path / "t.db"))
    assert status == 2
    assert "InvalidArgumentError" in said
    assert not (tmp_path / "t.db").exists()


async def test_a_half_written_backup_is_refused_and_its_target_left_unclaimed(
        tmp_path: Path, pg_url: str) -> None:
    live, file = str(tmp_path / "a.db"), tmp_path / "b.corral"
    async with corral.open_runtime(live, entities=[Ledger], shards=SHARDS) as rt:
        await rt.ref(Ledger, "a").start(start=LedgerInput())
    await backup(live, file)
    sql(str(file), "INSERT INTO meta (k, v) VALUES ('migrate.progress', '{}')")  # killed
    with pytest.raises(InvalidArgumentError, match="not a whole store"):
        await restore(file, pg_url)
    assert sql(pg_url, "SELECT count(*) FROM hosting") == [(0,)]
