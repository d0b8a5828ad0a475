"""A listing page's per-row reads (issue 42): the run's first seq from the entity's own
row (`_tables.first_seq_sql`), and on PostgreSQL the page's progress read by one range
scan per type on the page (`_progress.page_with_progress`), never a lookup per row.

Each of those lookups descended a B-tree one level deeper at 1M entities than at 10k
(a page of 100 rows: 523 buffers at 10k, 895 at 1M); the page now reads the same
few pages of `progress` at every size.
"""

from __future__ import annotations

import json
from typing import Any

from acceptances import acc, fence_for, opened
from corral._common import RunStatus
from corral.persistence._progress import RANGE_PER_ROW, RECORD
from corral.persistence._reads import list_entities
from corral.persistence._txn import Txn
from stores import is_postgres, sql
from test_census_counts import _built, _on_store, _Recording

# The page crosses from type A into type B: two ranges of `progress`.
_CURSOR = ("A", "k-00005850")  # 49 of A's keys after it (of 6,000 entities)


async def _page(location: str, status: RunStatus | None = None) -> list[Any]:
    return await _on_store(location, lambda q: list_entities(q, None, status, 100, _CURSOR))


def _record_progress(location: str) -> dict[tuple[str, str], int]:
    """Progress rows for every other entity of the page's stretch, applied up to 1..4."""
    rows = sql(location, "SELECT etype, key FROM entities WHERE (etype = 'A' AND key > ?) "
               "OR (etype = 'B' AND key < 'k-00000300') ORDER BY etype, key", _CURSOR[1])
    wanted = {}
    for i, (etype, key) in enumerate(rows):
        if i % 2 == 0:
            applied = 1 + i % 4
            sql(location, RECORD, etype, key, applied, i, 5.0)
            wanted[(etype, key)] = applied
    if is_postgres(location):
        sql(location, "ANALYZE")
    return wanted


async def test_a_page_across_two_types_shows_each_rows_own_progress(db_path: str) -> None:
    await _built(db_path, 6_000)
    wanted = _record_progress(db_path)
    page = await _page(db_path)
    assert {r.entity_type for r in page} == {"A", "B"}, "the page must cross a type"
    for r in page:
        recorded = wanted.get((r.entity_type, r.key))
        # next_seq 2 (1 accepted) or 5 (4): applied is the recorded seq, else the run's
        # first seq - 1 (0); a closed entity's oldest unapplied is None.
        assert r.progress.applied_seq == (recorded or 0), r
        assert r.progress.mailbox_depth == (None if recorded is None else
                                            r.progress.mailbox_depth), r
        assert (r.progress.recorded_at is None) == (recorded is None), r
    # The same page by status (a lookup per row): the same progress for the same rows.
    by_status = {(r.entity_type, r.key): r.progress for r in
                 await _page(db_path, RunStatus.COMPLETED)}
    for r in page:
        if (r.entity_type, r.key) in by_status:
            assert by_status[(r.entity_type, r.key)] == r.progress


async def test_a_postgresql_page_reads_progress_once_per_type_not_once_per_row(
        db_path: str) -> None:
    if not is_postgres(db_path):
        return  # SQLite's lookup per row costs the same VM steps at every size
    await _built(db_path, 6_000)
    _record_progress(db_path)
    recording: list[_Recording] = []

    async def read(q: Txn) -> Any:
        recording.append(_Recording(q))
        return await list_entities(recording[0], None, None, 100, _CURSOR)

    await _on_store(db_path, read)
    from corral.persistence._pg_txn import numbered
    [(statement, args)] = recording[0].statements
    plan = await _on_store(db_path, lambda q: q.conn.fetchval(  # type: ignore[attr-defined]
        "EXPLAIN (ANALYZE, FORMAT JSON) " + numbered(statement), *args))
    loops = [node["Actual Loops"] for node in _nodes(json.loads(plan)[0]["Plan"])
             if node.get("Relation Name") == "progress"]
    assert loops
    assert max(loops) <= 2, loops  # one range per type, not one per row (100)


def _nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [node, *(n for child in node.get("Plans", []) for n in _nodes(child))]


async def test_the_entity_row_keeps_its_runs_first_seq_and_a_null_reads_the_run(
        db_path: str) -> None:
    """Written where a run starts (an acceptance that starts one, continue-as-new, an
    acceptance that starts the next run of a closed entity); a row no run started since
    the column came (NULL) reads its run's."""
    async with opened(db_path, 4) as store:
        fence = await fence_for(store, 1)
        for mid in ("m1", "m2", "m3"):
            await store.accept(acc("k", mid))
        assert _first_seqs(db_path) == [(1, 1)]
        assert await store.continue_as_new(fence, "E", "k", 1, applied_seq=3,
                                           next_input="{}", carried=[]) == 2
        await store.accept(acc("k", "m4"))
        assert _first_seqs(db_path) == [(4, 4)]
        await store.close_run(fence, "E", "k", 2, applied_seq=4, status=RunStatus.COMPLETED,
                              result="null", error=None)
        await store.accept(acc("k", "m5"))  # starts run 3 at seq 5
        assert _first_seqs(db_path) == [(5, 5)]
        listed = await store.entities("E", None, limit=10)
        sql(db_path, "UPDATE entities SET first_seq = NULL")
        assert await store.entities("E", None, limit=10) == listed
        assert listed[0].progress.applied_seq == 4  # nothing of run 3 applied yet


def _first_seqs(location: str) -> list[tuple[int, int]]:
    """(the entity row's first seq, its latest run's) of every entity."""
    return [(int(e), int(r)) for e, r in sql(
        location, "SELECT e.first_seq, r.first_seq FROM entities e JOIN runs r ON "
        "r.etype = e.etype AND r.key = e.key AND r.run_id = e.run_id")]


# Status pages (`_progress.page_with_progress`): the store's statuses in proportions from
# common to rare, progress on most rows, some rows behind (a backlog), some passivated,
# and some whose run started after their recorded progress (first seq above it).
_STATUSES = {RunStatus.COMPLETED: "i % 10 < 5", RunStatus.RUNNING: "i % 10 IN (5, 6, 7)",
             RunStatus.FAILED: "i % 10 = 8", RunStatus.CONTINUED: "i % 10 = 9 AND i % 97 <> 4",
             RunStatus.TERMINATED: "i % 97 = 4"}


def _mixed(location: str) -> None:
    """Statuses per `_STATUSES`; progress applied up to 1..3 for two rows in three; one
    row in seven passivated at seq 2, one in eleven in a run that started at seq 4 (its
    recorded progress is of an earlier run), one in five of the running behind (4
    accepted, a journal entry at seq 4 not applied)."""
    index = ("CAST(substr(key, 3) AS INTEGER)" if not is_postgres(location)
             else "substr(key, 3)::int")
    for status, where in _STATUSES.items():
        sql(location, f"UPDATE entities SET status = ? WHERE {where.replace('i', index)}",
            status.value)
    sql(location, f"UPDATE entities SET passivated_seq = 2 WHERE {index} % 7 = 1")
    sql(location, f"UPDATE entities SET first_seq = 4, next_seq = 5 WHERE {index} % 11 = 2")
    sql(location, f"UPDATE entities SET next_seq = 5 WHERE status = 'running' "
        f"AND {index} % 5 = 0")
    sql(location, "DELETE FROM journal")
    sql(location, "INSERT INTO journal (etype, key, seq, run_id, shard, kind, name, "
        f"message_id, payload, sender, accepted_at{', tick' if is_postgres(location) else ''}"
        ") SELECT etype, key, 4, 1, shard, 'signal', 'n', 'm', '{}', NULL, 3.0"
        f"{', 0' if is_postgres(location) else ''} FROM entities WHERE next_seq = 5")
    for etype, key in sql(location, f"SELECT etype, key FROM entities WHERE {index} % 3 <> 1"):
        at = int(key[2:])
        sql(location, RECORD, etype, key, 1 + at % 3, at % 4, 5.0)
    if is_postgres(location):
        sql(location, "ANALYZE")


async def _all_pages(q: Txn, etype: str | None, status: RunStatus, *, ranged: bool
                     ) -> list[list[Any]]:
    """Every page of `status` (of `etype`), 100 rows each, on one connection (PostgreSQL
    plans a reused statement generically after five runs); `ranged` False: the progress
    join of a lookup per row, the reference."""
    reading = _Recording(q)
    reading.PAGE_RANGE = ranged and q.PAGE_RANGE  # type: ignore[misc]
    pages: list[list[Any]] = []
    after = None
    while True:
        page = await list_entities(reading, etype, status, 100, after)
        if not page:
            return pages
        pages.append(page)
        after = (page[-1].entity_type, page[-1].key)


async def test_every_status_page_shows_the_progress_a_lookup_per_row_shows(
        db_path: str) -> None:
    await _built(db_path, 6_000)
    _mixed(db_path)
    for status in _STATUSES:
        for etype in (None, "B"):
            got = await _on_store(db_path, lambda q, e=etype, s=status: _all_pages(
                q, e, s, ranged=True))
            wanted = await _on_store(db_path, lambda q, e=etype, s=status: _all_pages(
                q, e, s, ranged=False))
            assert got == wanted, (status, etype)
            rows = [r for page in got for r in page]
            assert rows, (status, etype)
            assert {r.status for r in rows} == {status}, (status, etype)
            assert len({(r.entity_type, r.key) for r in rows}) == len(rows)
            if etype is None:
                assert any(len({r.entity_type for r in page}) > 1 for page in got), status
    # What the pages cover: recorded progress, none, a backlog, a run after its progress.
    running = [r for page in await _on_store(db_path, lambda q: _all_pages(
        q, None, RunStatus.RUNNING, ranged=True)) for r in page]
    assert any(r.progress.oldest_unapplied_at is not None for r in running)
    assert any(r.progress.recorded_at is None for r in running)
    assert any(r.progress.recorded_at is not None and r.progress.applied_seq == 3
               and int(r.key[2:]) % 11 == 2 for r in running)


async def test_a_rare_status_page_past_the_range_bound_looks_its_rows_up(
        db_path: str) -> None:
    """A page of a rare status spans more progress rows than the range reads
    (`RANGE_PER_ROW` per page row): the rows past it are looked up, each once."""
    if not is_postgres(db_path):
        return  # SQLite reads a lookup per row (`Txn.PAGE_RANGE`)
    await _built(db_path, 6_000)
    _mixed(db_path)
    recording: list[_Recording] = []

    async def read(q: Txn) -> Any:
        recording.append(_Recording(q))
        return await list_entities(recording[0], None, RunStatus.TERMINATED, 100, None)

    page = await _on_store(db_path, read)
    assert len(page) == 62
    assert len({r.entity_type for r in page}) == 3
    assert sum(r.progress.recorded_at is not None for r in page) > RANGE_PER_ROW * 3
    from corral.persistence._pg_txn import numbered
    [(statement, args)] = recording[0].statements
    plan = await _on_store(db_path, lambda q: q.conn.fetchval(  # type: ignore[attr-defined]
        "EXPLAIN (ANALYZE, FORMAT JSON) " + numbered(statement), *args))
    probes = [node for node in _nodes(json.loads(plan)[0]["Plan"])
              if node.get("Relation Name") == "progress"]
    ranges = [n for n in probes if n["Actual Loops"] <= 3]
    lookups = [n for n in probes if n["Actual Loops"] > 3]
    assert ranges
    assert sum(n["Actual Rows"] * n["Actual Loops"] for n in ranges) <= \
        RANGE_PER_ROW * len(page)
    # A row past the range is looked up; a covered row is not (`key > upto`).
    assert lookups
    assert 0 < lookups[0]["Actual Loops"] < len(page)
