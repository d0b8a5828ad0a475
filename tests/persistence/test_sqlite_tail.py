"""SQLite's journal tail leaves out what its own store committed, once another process
shares the file (what a tail must never leave out is in the contract suite)."""

from __future__ import annotations

from pathlib import Path

from acceptances import acc, opened, tail_all
from corral.persistence import SqliteStore


async def test_a_sqlite_tail_leaves_out_the_entries_its_own_store_committed(
        tmp_path: Path) -> None:
    path = str(tmp_path / "s.db")
    async with opened(path, 16) as store, opened(path, 16) as other:
        pos = await store.journal_end()
        await store.accept(acc("first", "m", shard=1))  # before another writer was seen
        await other.accept(acc("theirs0", "m", shard=1))
        await store.accept_many([acc(f"own{j}", "m", shard=1) for j in range(3)])
        await other.accept(acc("theirs1", "m", shard=1))
        await store.accept(acc("own3", "m", shard=1))
        _, keys = await tail_all(store, pos, frozenset({1}))
        assert keys == ["first", "theirs0", "theirs1"]


async def test_a_foreign_commit_after_this_stores_last_batch_is_seen_at_the_next_check(
        tmp_path: Path) -> None:
    """A batch of its own reads the file's version, so the check right after it need
    not ask; a foreign commit after that batch is still seen by the check after."""
    path = str(tmp_path / "s.db")
    async with opened(path, 16) as store, opened(path, 16) as other:
        assert isinstance(store, SqliteStore)
        await store.accept(acc("own0", "m", shard=1))
        await store.foreign_commit_seen()
        for i in range(1, 4):
            await store.accept(acc(f"own{i}", "m", shard=1))  # reads the version
            await other.accept(acc(f"theirs{i}", "m", shard=1))  # after that read
            assert await store.foreign_commit_seen() or await store.foreign_commit_seen()
            assert not await store.foreign_commit_seen()  # nothing more since
