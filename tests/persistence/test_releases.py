"""Declared releases (`persistence/_releases.py`): each namespace's history of what its
deployment runs, appended in one serialised transaction per declaration, on both
engines (`db_path`). Rows are read back with `stores.sql`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

import corral
from acceptances import opened
from corral.persistence import ReleaseRecord, Store, open_store
from corral.persistence._pg_schema import SCHEMA_VERSION as PG_SCHEMA_VERSION
from corral.persistence._releases import KEPT_RELEASES, MAX_RELEASE_BODY
from corral.persistence._schema import SCHEMA_VERSION
from stores import is_postgres, sql

SHARDS = 4
ROWS = "SELECT namespace, seq, release_id, body, declared_by FROM releases " \
       "ORDER BY namespace, seq"


def body(app: str, **more: object) -> str:
    return json.dumps({"app": app, "runtime_env": {"working_dir": "gcs://_ray_pkg_1.zip"},
                       **more})


@pytest.fixture
async def store(db_path: str) -> AsyncIterator[Store]:
    async with opened(db_path, SHARDS) as s:
        yield s


async def test_releases_are_numbered_in_the_order_declared_and_listed_newest_first(
        store: Store) -> None:
    declared = [await store.declare_release("shop", rid, body(f"shop.app:{rid}"),
                                            declared_by="alice@ci")
                for rid in ("r-a", "r-b", "r-c")]
    assert [(r.seq, r.release_id) for r in declared] == [(1, "r-a"), (2, "r-b"), (3, "r-c")]
    listed = await store.releases("shop")
    assert listed == declared[::-1]
    assert listed[0] == ReleaseRecord("shop", 3, "r-c", body("shop.app:r-c"),
                                      listed[0].declared_at, "alice@ci")
    assert listed[0].declared_at >= listed[1].declared_at >= listed[2].declared_at > 0
    assert await store.releases("shop", limit=1) == [declared[2]]
    other = await store.declare_release("billing", "r-a", body("billing.app:A"),
                                        declared_by="bob")
    assert (other.namespace, other.seq) == ("billing", 1)  # numbered per namespace
    assert await store.releases("nowhere") == []


async def test_declaring_the_current_release_again_writes_nothing(
        db_path: str, store: Store) -> None:
    first = await store.declare_release("shop", "r-a", body("shop.app:A"), declared_by="a")
    before = sql(db_path, ROWS)
    again = await store.declare_release("shop", "r-a", body("shop.app:A"), declared_by="b")
    assert again == first  # the row as it was: its seq, time and author
    assert sql(db_path, ROWS) == before


async def test_a_rollback_declares_an_older_release_again_under_a_new_seq(
        store: Store) -> None:
    for rid in ("r-1", "r-2", "r-1"):
        await store.declare_release("shop", rid, body(f"shop.app:{rid}"), declared_by="ops")
    assert [(r.seq, r.release_id) for r in await store.releases("shop")] == [
        (3, "r-1"), (2, "r-2"), (1, "r-1")]


async def test_declarations_at_once_from_several_writers_get_distinct_seqs(
        db_path: str) -> None:
    """Four stores on one location are four writers, as four processes are: their
    declarations serialise (SQLite's write lock, PostgreSQL's advisory lock), so each
    reads the one before it; of one release declared at once, one row is written."""
    async with opened(db_path, SHARDS) as a, opened(db_path, SHARDS) as b, \
            opened(db_path, SHARDS) as c, opened(db_path, SHARDS) as d:
        writers = (a, b, c, d)
        for round_ in range(5):
            made = await asyncio.gather(*(
                w.declare_release("shop", f"r{round_}-{i}", body("shop.app:A", n=i),
                                  declared_by=f"w{i}") for i, w in enumerate(writers)))
            assert sorted(r.seq for r in made) == list(range(4 * round_ + 1,
                                                             4 * round_ + 5))
        same = await asyncio.gather(*(
            w.declare_release("shop", "r-same", body("shop.app:S"), declared_by="w")
            for w in writers))
        assert {r.seq for r in same} == {21}
        listed = await a.releases("shop", limit=100)
        assert [r.seq for r in listed] == list(range(21, 0, -1))
        assert listed[0].release_id == "r-same"


async def test_a_namespace_keeps_only_its_newest_releases(db_path: str, store: Store) -> None:
    await store.declare_release("billing", "b-1", body("billing.app:A"), declared_by="x")
    for n in range(1, KEPT_RELEASES + 4):
        await store.declare_release("shop", f"r-{n}", body("shop.app:A"), declared_by="x")
    assert sql(db_path, "SELECT count(*), min(seq), max(seq) FROM releases "
                        "WHERE namespace = 'shop'") == [(KEPT_RELEASES, 4, KEPT_RELEASES + 3)]
    listed = await store.releases("shop", limit=KEPT_RELEASES + 10)
    assert [r.seq for r in listed] == list(range(KEPT_RELEASES + 3, 3, -1))
    assert [r.seq for r in await store.releases("billing")] == [1]  # another namespace's


BAD_DECLARATIONS = [
    pytest.param({"namespace": ""}, "namespace", id="empty namespace"),
    pytest.param({"namespace": "a" * 65}, "namespace", id="long namespace"),
    pytest.param({"namespace": "-shop"}, "namespace", id="namespace starting with -"),
    pytest.param({"namespace": "sh op"}, "namespace", id="namespace with a space"),
    pytest.param({"namespace": 7}, "namespace", id="namespace not text"),
    pytest.param({"release_id": ""}, "release_id", id="empty id"),
    pytest.param({"release_id": "r" * 129}, "release_id", id="long id"),
    pytest.param({"release_id": "r 1"}, "release_id", id="id with a space"),
    pytest.param({"release_id": "r\x00"}, "release_id", id="id with NUL"),
    pytest.param({"release_id": "r\u00e9"}, "release_id", id="id not ASCII"),
    pytest.param({"body": "not json"}, "JSON text", id="body not JSON"),
    pytest.param({"body": "[1, 2]"}, "JSON object", id="body a list"),
    pytest.param({"body": '{"a": NaN}'}, "JSON text", id="body with NaN"),
    pytest.param({"body": '{"a": "\x00"}'}, "JSON text", id="body with a raw NUL"),
    pytest.param({"body": '{"a": "\ud800"}'}, "lone surrogate", id="body with a surrogate"),
    pytest.param({"body": "[" * 300 + "]" * 300}, "JSON object", id="body nested deeply"),
    pytest.param({"body": '{"a": "' + "x" * MAX_RELEASE_BODY + '"}'}, "bytes",
                 id="body over 1 MiB"),
    pytest.param({"body": b"{}"}, "JSON text", id="body bytes"),
    pytest.param({"declared_by": ""}, "declared_by", id="empty author"),
    pytest.param({"declared_by": "a\nb"}, "declared_by", id="author with a newline"),
    pytest.param({"declared_by": "x" * 257}, "declared_by", id="long author"),
]


@pytest.mark.parametrize(("bad", "named"), BAD_DECLARATIONS)
async def test_a_malformed_declaration_is_refused_with_nothing_stored(
        db_path: str, store: Store, bad: dict[str, object], named: str) -> None:
    args: dict[str, Any] = {"namespace": "shop", "release_id": "r-1",
                            "body": body("shop.app:A"), "declared_by": "ops", **bad}
    with pytest.raises(corral.InvalidArgumentError, match=named):
        await store.declare_release(**args)
    assert sql(db_path, "SELECT count(*) FROM releases") == [(0,)]


@pytest.mark.parametrize(("namespace", "limit"), [("", 10), ("shop/x", 10), ("shop", 0),
                                                  ("shop", -1), ("shop", True),
                                                  ("shop", 1.5)])
async def test_a_malformed_read_of_releases_is_refused(
        store: Store, namespace: str, limit: int) -> None:
    with pytest.raises(corral.InvalidArgumentError):
        await store.releases(namespace, limit=limit)


@pytest.mark.parametrize("damage", ["'not json'", "'[1, 2]'"])
async def test_a_damaged_release_row_is_a_corrupt_row_error_until_a_new_declaration_passes_it(
        db_path: str, store: Store, damage: str) -> None:
    """The current release is never silently an older one: reading a damaged row raises,
    naming it; declaring again appends a readable release after it (a damaged current
    release is never "the same" as the one declared)."""
    await store.declare_release("shop", "r-1", body("shop.app:A"), declared_by="ops")
    sql(db_path, f"UPDATE releases SET body = {damage} WHERE seq = 1")
    with pytest.raises(corral.CorruptRowError, match=r"releases\.body") as caught:
        await store.releases("shop")
    assert (caught.value.table, caught.value.column) == ("releases", "body")
    assert "'shop'" in str(caught.value)
    again = await store.declare_release("shop", "r-1", body("shop.app:A"), declared_by="ops")
    assert (again.seq, again.release_id) == (2, "r-1")
    assert await store.releases("shop", limit=1) == [again]


async def test_a_store_of_the_previous_schema_gains_the_releases_table(db_path: str) -> None:
    version = PG_SCHEMA_VERSION if is_postgres(db_path) else SCHEMA_VERSION
    added = 13 if is_postgres(db_path) else 14  # the version that added the table
    await (await open_store(db_path, shards=SHARDS)).close()
    # Back to what a corral of the version before wrote: no releases table.
    sql(db_path, "DROP TABLE releases")
    sql(db_path, "ALTER TABLE entities DROP COLUMN first_seq")  # a later version's
    sql(db_path, "UPDATE meta SET v = ? WHERE k = 'schema_version'", str(added - 1))
    async with opened(db_path, SHARDS) as store:
        made = await store.declare_release("shop", "r-1", body("shop.app:A"),
                                           declared_by="ops")
        assert await store.releases("shop") == [made]
    assert sql(db_path, "SELECT v FROM meta WHERE k = 'schema_version'") == [(str(version),)]
    assert sql(db_path, ROWS) == [("shop", 1, "r-1", body("shop.app:A"), "ops")]
