"""Moving a store to another (`migrate`) and comparing two (`verify`): one copy, table
by table (`_copy_plan`), written once above the two engines' ends (`_copy_ends`).

A copy reads its source in one snapshot and writes the target in batches of at most
`batch` rows, each one transaction with the copy's progress (the `meta` row
`migrate.progress`: per table, the key of the last row written, or done). Rows are
written over the row of their key (an upsert), so a copy killed at any point is
continued by `resume=True` from its last batch, and every row lands once. Once every
table is written, the sequences are carried over (a dead letter's id is never given
again: the source's high-water mark, not its highest row), PostgreSQL's shard ticks are
set past the copied journal's, and the marker goes: the copy is complete.

`migrate` moves a store no host runs on: it claims both stores for the `migration`
cluster (`_hosting`), so a host that opens either meanwhile is refused
(`StoreHostedElsewhereError`, naming the copy), and it is itself refused while a host
holds the source. The source's claim is released when the copy ends, however it ends
(a killed copy's lapses after `CLAIM_TTL` seconds), so the application can go back to
it; the target's only when a copy into it completes: no host runs on half a store.

`backup` and `restore` (`_backup`) are the same copy into and out of a file.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

from corral._errors import (
    InvalidArgumentError,
    ShardCountError,
    StoreHostedElsewhereError,
)

from ._copy_ends import CopyEnd, open_end
from ._copy_plan import (
    CROSS,
    DIGEST_MODULUS,
    META,
    PLANS,
    TablePlan,
    is_data,
    row_digest,
    to_engine,
)
from ._existing import stored_shards
from ._hosting import MIGRATION_CLUSTER
from ._open import open_store
from ._store import Store
from ._tables import Engine
from ._urls import is_postgres_url, redacted

__all__ = ["CLAIM_TTL", "TARGET_CLAIM_TTL", "Copied", "CopyProgress", "TableCheck",
           "Verification", "migrate", "refuse_partial", "verify"]

CLAIM_TTL = 60.0
"""Seconds a copy's claim on its source outlives its last renewal (each batch renews it
once a quarter of this has passed): a killed copy leaves the source to its hosts again
after that."""
TARGET_CLAIM_TTL = 10 * 365 * 86400.0
"""A copy's claim on its target lasts until the copy completes, whatever happens to the
copy: a host never runs on half a store. It is released when a copy (resumed, if it
failed) completes; dropping the half-copied target is the other way out."""
_MARKER = "migrate.progress"
_READ_BATCH = 5000  # rows per read when digesting

CopyProgress = Callable[[str, int, int], Awaitable[None]]
"""Called after each batch: table, rows written of it so far, rows it has."""


@dataclass(frozen=True)
class Copied:
    """What a copy wrote: rows per table (this run's, a resumed copy's since it
    resumed), and how long it took (s)."""

    rows: dict[str, int]
    seconds: float

    @property
    def total(self) -> int:
        return sum(self.rows.values())


@dataclass(frozen=True)
class TableCheck:
    """One table on both stores: rows, and a digest of its rows (hex) computed the same
    way on either engine (`_copy_plan.row_digest`)."""

    table: str
    source_rows: int
    target_rows: int
    source_digest: str
    target_digest: str

    @property
    def equal(self) -> bool:
        return (self.source_rows, self.source_digest) == (self.target_rows,
                                                          self.target_digest)


@dataclass(frozen=True)
class Verification:
    """`verify`'s answer: every copied table's check."""

    tables: tuple[TableCheck, ...]

    @property
    def equal(self) -> bool:
        return all(t.equal for t in self.tables)


def _where(location: str) -> str:
    return repr(redacted(location)) if is_postgres_url(location) else repr(location)


def _identity(location: str) -> str:
    """The source as a resumed copy must name it again."""
    if is_postgres_url(location):
        return redacted(location)
    return os.path.abspath(location.removeprefix("sqlite:///"))


def _carry(plan: TablePlan, source: Engine, target: Engine
           ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The columns read from the source and written to the target: the portable ones,
    and the engine's own within an engine, or mapped across (`CROSS`)."""
    if source == target:
        both = plan.columns + plan.only[source]
        return both, both
    mapped = [(c, CROSS[(plan.name, c)]) for c in plan.only["sqlite"]
              if (plan.name, c) in CROSS] if source == "sqlite" else []
    return (plan.columns + tuple(s for s, _ in mapped),
            plan.columns + tuple(t for _, t in mapped))


class _Claims:
    """The copy's claims on its stores (`migration` cluster), renewed as it goes."""

    def __init__(self, holder: str) -> None:
        self.process = f"migrate-{uuid.uuid4().hex[:12]}"
        self.holder = holder
        self._stores: list[tuple[Store, str]] = []
        self._held: list[Store] = []  # claimed until the copy completes
        self._renewed = 0.0

    async def claim(self, store: Store, where: str, *, until_done: bool = False) -> None:
        """Claim `store`: renewed as the copy goes (`renew`) and released when it ends
        however it ends, or (`until_done`) held until the copy completes (`release`)."""
        if until_done:
            await self._claim(store, where, TARGET_CLAIM_TTL)
            self._held.append(store)
            return
        await self._claim(store, where, CLAIM_TTL)
        self._stores.append((store, where))
        self._renewed = time.monotonic()

    async def _claim(self, store: Store, where: str, ttl: float) -> None:
        other = await store.claim_hosting(self.process, MIGRATION_CLUSTER, self.holder,
                                          ttl=ttl)
        if other is not None:
            raise StoreHostedElsewhereError(
                f"store {where} is hosted: {other.holder}. A store is moved while no host "
                "runs on it: close its hosts (their claim lapses after their ttl if they "
                "were killed) and run the copy again",
                holder=other.holder, cluster=other.cluster, expires_at=other.expires_at)

    async def renew(self) -> None:
        if time.monotonic() - self._renewed < CLAIM_TTL / 4:
            return
        for store, where in self._stores:
            await self._claim(store, where, CLAIM_TTL)
        self._renewed = time.monotonic()

    async def release(self, *, done: bool = False) -> None:
        """Release the claims renewed as the copy went, and (`done`: it completed) the
        ones held until it completes."""
        for store in [s for s, _ in self._stores] + (self._held if done else []):
            await store.release_hosting(self.process)
        self._stores.clear()
        self._held.clear()


async def _open_target(location: str, shards: int, source: str) -> Store:
    """Open (creating if needed) the target with the source's shard count; a target of
    another count is refused, naming both."""
    try:
        return await open_store(location, shards=shards)
    except ShardCountError as err:
        raise ShardCountError(
            f"cannot copy {source} ({shards} shards) into {_where(location)} "
            f"({err.store_shards} shards): a store's shard count is fixed when it is "
            "created; copy into a new store (it takes the source's count)",
            store_shards=err.store_shards, shards=shards) from None


async def _check_target(target: CopyEnd, source_id: str, *, resume: bool) -> dict[str, Any]:
    """The progress of the copy to continue (empty: a new one); refuses a target that
    holds data, or an interrupted copy (of another source, or without `resume`)."""
    found = (await target.meta()).get(_MARKER)
    if found is not None:
        state: dict[str, Any] = json.loads(found)
        if not resume:
            raise InvalidArgumentError(
                f"store {target.where} holds an interrupted copy of {state['source']}: "
                "continue it with resume=True (`--resume`), or copy into an empty store")
        if state["source"] != source_id:
            raise InvalidArgumentError(
                f"store {target.where} holds an interrupted copy of {state['source']}, "
                f"not of {source_id}: continue it from that store")
        return state
    holding = [plan.name for plan in PLANS if await target.holding(plan)]
    if holding:
        raise InvalidArgumentError(
            f"store {target.where} is not empty (rows in {', '.join(holding)}): a copy "
            "goes into an empty store, nothing was written")
    return {"source": source_id, "tables": {}}


async def _copy_table(source: CopyEnd, target: CopyEnd, plan: TablePlan,
                      state: dict[str, Any], *, batch: int, progress: CopyProgress | None,
                      on_batch: Callable[[], Awaitable[None]]) -> int:
    read, write = _carry(plan, source.engine, target.engine)
    at = [read.index(k) for k in plan.key]
    done = state["tables"].get(plan.name)
    if done is True:
        return 0
    after, written = done, 0
    total = await source.count(plan.name)
    while True:
        rows = await source.read(plan.name, read, plan.key, after, batch)
        finished = len(rows) < batch
        if rows:
            after = [rows[-1][i] for i in at]
        state["tables"][plan.name] = True if finished else after
        kept = [r for r in rows if is_data(plan, read, r)]
        await target.write(plan, write,
                           [to_engine(plan, write, r, target.engine) for r in kept],
                           (_MARKER, json.dumps(state)))
        written += len(kept)
        if progress is not None:
            await progress(plan.name, written, total)
        await on_batch()
        if finished:
            return written


async def _copy(source: CopyEnd, target: CopyEnd, state: dict[str, Any], *, batch: int,
                progress: CopyProgress | None,
                on_batch: Callable[[], Awaitable[None]]) -> Copied:
    """Copy `source` into `target` from `state` (`_check_target`'s), then complete it."""
    began = time.monotonic()
    await source.begin_snapshot()
    rows = {}
    for plan in PLANS:
        rows[plan.name] = await _copy_table(source, target, plan, state, batch=batch,
                                            progress=progress, on_batch=on_batch)
    for plan in PLANS:
        read, write = _carry(plan, source.engine, target.engine)
        for column in plan.serial:
            if column in read and column in write:
                mark = await source.serial_mark(plan.name, column)
                await target.set_serial_mark(plan.name, column, mark)
    await target.finish()
    await target.delete_meta(_MARKER)
    return Copied(rows, time.monotonic() - began)


async def refuse_partial(source: CopyEnd) -> None:
    """Refuse to copy from a store that holds an interrupted copy (half a store)."""
    if _MARKER in await source.meta():
        raise InvalidArgumentError(
            f"store {source.where} holds an interrupted copy, not a whole store: complete "
            "that copy (--resume) before copying it on, or copy from its source")


async def _nothing() -> None:
    pass


def _check_batch(batch: int) -> None:
    """Refuse a batch size out of range before anything is opened or written."""
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= 1_000_000:
        raise InvalidArgumentError(
            f"batch={batch!r}: rows per batch are an int from 1 to 1,000,000")


async def migrate(source: str, target: str, *, batch: int = 1000, resume: bool = False,
                  progress: CopyProgress | None = None,
                  on_batch: Callable[[], Awaitable[None]] | None = None) -> Copied:
    """Copy every table of the store at `source` into the store at `target` (either a
    SQLite file or a PostgreSQL URL; created if missing), at the current schema (an
    older source is migrated to it first), while no host runs on either: both are
    claimed for the copy, and a host opening either meanwhile is refused.

    Args:
        batch: rows per transaction on the target (and per read of the source).
        resume: continue an interrupted copy into `target` (of the same `source`).
        progress: awaited after each batch with the table, its rows written so far,
            and its rows.
        on_batch: awaited after each batch (a test's hook: the copy is under way).

    Raises:
        StoreHostedElsewhereError: a live host holds `source` or `target`.
        ShardCountError: `target` exists with another shard count (both named).
        InvalidArgumentError: `target` holds data, or an interrupted copy (without
            `resume`, or of another source); `source` is not a corral store.
        StoreError: `source` was written by a newer corral, or a store failed.

    Example:
        await migrate("corral.db", "postgresql://corral@db/corral")
    """
    _check_batch(batch)
    shards = await stored_shards(source, any_version=True)
    async with AsyncExitStack() as stack:
        src_store = await open_store(source, shards=shards)  # an older one is migrated
        stack.push_async_callback(src_store.close)
        return await _claimed_copy(source, target, shards, "migrate", claim=src_store,
                                   batch=batch, resume=resume, progress=progress,
                                   on_batch=on_batch or _nothing)
    raise AssertionError("unreachable")


async def _claimed_copy(source: str, target: str, shards: int, verb: str, *,
                        claim: Store | None, batch: int, resume: bool, named: str = "",
                        progress: CopyProgress | None,
                        on_batch: Callable[[], Awaitable[None]]) -> Copied:
    """Copy `source` into `target` (opened, or created, with `shards`), the target and
    `claim` (the source's store, for `migrate`) claimed meanwhile; the claims of a
    killed copy that this one resumes are renewed and released as its own. `named`:
    the source as a resumed copy names it (default: `source`)."""
    source_id = named or _identity(source)
    claims = _Claims(f"corral {verb} (pid {os.getpid()} on {socket.gethostname()}) from "
                     f"{_where(source)} to {_where(target)}")
    async with AsyncExitStack() as stack:
        dst_store = await _open_target(target, shards, _where(source))
        stack.push_async_callback(dst_store.close)
        src = await open_end(source, readonly=True)
        stack.push_async_callback(src.close)
        dst = await open_end(target)
        stack.push_async_callback(dst.close)
        await refuse_partial(src)  # before any claim
        state = await _check_target(dst, source_id, resume=resume)
        claims.process = state.setdefault("claimant", claims.process)
        stack.push_async_callback(claims.release)
        if claim is not None:  # refused while a host runs on it: nothing written yet
            await claims.claim(claim, _where(source))
        # The claimant is in the target before its claim: a copy that fails from here
        # on leaves an interrupted copy, whose `--resume` renews and releases the claim.
        await dst.write(META, ("k", "v"), [], (_MARKER, json.dumps(state)))
        await claims.claim(dst_store, _where(target), until_done=True)

        async def between() -> None:
            await claims.renew()
            await on_batch()

        copied = await _copy(src, dst, state, batch=batch, progress=progress,
                             on_batch=between)
        await claims.release(done=True)
        return copied
    raise AssertionError("unreachable")


async def _table_digest(end: CopyEnd, plan: TablePlan) -> tuple[int, str]:
    count, total, after = 0, 0, None
    while True:
        rows = await end.read(plan.name, plan.columns, plan.key, after, _READ_BATCH)
        for row in rows:
            if is_data(plan, plan.columns, row):
                count += 1
                total = (total + row_digest(plan, row)) % DIGEST_MODULUS
        if len(rows) < _READ_BATCH:
            return count, f"{total:064x}"
        after = [rows[-1][plan.columns.index(k)] for k in plan.key]


async def verify(source: str, target: str) -> Verification:
    """Compare two stores table by table: rows, and a digest of their rows that is the
    same on either engine (each read in one snapshot). Writes nothing.

    Raises:
        InvalidArgumentError: either is not a corral store.
        ShardCountError: their shard counts differ (both named).
    """
    counts = (await stored_shards(source, any_version=True),
              await stored_shards(target, any_version=True))
    if counts[0] != counts[1]:
        raise ShardCountError(
            f"{_where(source)} has {counts[0]} shards, {_where(target)} {counts[1]}: "
            "not copies of one store", store_shards=counts[1], shards=counts[0])
    checks = []
    async with AsyncExitStack() as stack:
        ends = []
        for location in (source, target):
            end = await open_end(location, readonly=True)
            stack.push_async_callback(end.close)
            await end.begin_snapshot()
            ends.append(end)
        for plan in PLANS:
            (n1, d1), (n2, d2) = [await _table_digest(e, plan) for e in ends]
            checks.append(TableCheck(plan.name, n1, n2, d1, d2))
    return Verification(tuple(checks))
