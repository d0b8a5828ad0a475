"""SQLite's journal tail leaves out what its own store committed, once another process
shares the file (what a tail must never leave out is in the contract suite)."""

from __future__ import annotations

from pathlib import Path

from acceptances import acc, opened, tail_all


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
