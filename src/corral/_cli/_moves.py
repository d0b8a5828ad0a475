"""`corral migrate`, `corral backup` and `corral restore`: a store copied into another
of either engine, or into a file and back (`corral.persistence.migrate`, `backup`,
`restore`).

Each prints a progress bar per table on stderr while it copies (when stderr is a
terminal; a line per table otherwise), then one line with the rows copied and the time
taken. `migrate --verify` then compares the two stores table by table (rows and a
digest computed the same way on either engine) and prints the comparison; a difference
exits 1.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from corral.persistence import Copied, Verification, backup, migrate, restore, verify

from ._failure import EXIT_FAILED, guard
from ._output import err_console, out, print_json, table

__all__ = ["backup_store", "migrate_store", "restore_store"]

BatchOption = Annotated[int, typer.Option(
    "--batch", metavar="N", min=1, max=1_000_000,
    help="Rows per transaction on the target (and per read of the source).")]
ResumeFlag = Annotated[bool, typer.Option(
    "--resume", help="Continue an interrupted copy into the target (of the same source), "
                     "from its last committed batch.")]
JsonFlag = Annotated[bool, typer.Option(
    "--json", help="Print JSON for scripts instead of a table or a line.")]


@contextmanager
def _bars(*, claimed: str = "") -> Iterator[Callable[[str, int, int], Awaitable[None]]]:
    """A progress callback drawing one bar per table on stderr, after the line `claimed`
    (once the copy has begun: its stores are claimed by then)."""
    from rich.progress import (  # only here: it costs every other command 40 ms
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    console = err_console()
    tasks: dict[str, Any] = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console,
                  disable=not console.is_terminal) as progress:
        async def advance(name: str, done: int, total: int) -> None:
            if claimed and not tasks:
                console.print(claimed)
            if name not in tasks:
                tasks[name] = progress.add_task(name, total=max(total, done))
            progress.update(tasks[name], completed=done, total=max(total, done))
        yield advance


def _copied(verb: str, copied: Copied, as_json: bool) -> None:
    if as_json:
        print_json({"rows": copied.rows, "total": copied.total, "seconds": copied.seconds})
        return
    print(_summary(verb, copied))


def _summary(verb: str, copied: Copied) -> str:
    rate = copied.total / copied.seconds if copied.seconds > 0 else 0.0
    return f"{verb} {copied.total} rows in {copied.seconds:.1f} s ({rate:,.0f} rows/s)"


def _verified(found: Verification, as_json: bool) -> None:
    if as_json:
        print_json({"equal": found.equal, "tables": [
            {"table": t.table, "equal": t.equal, "source_rows": t.source_rows,
             "target_rows": t.target_rows, "source_digest": t.source_digest,
             "target_digest": t.target_digest} for t in found.tables]})
    else:
        rows = table("TABLE", "SOURCE ROWS", "TARGET ROWS", "DIGEST", "EQUAL")
        for t in found.tables:
            digest = t.source_digest[:16] if t.equal else (
                f"{t.source_digest[:16]} / {t.target_digest[:16]}")
            rows.add_row(t.table, str(t.source_rows), str(t.target_rows), digest,
                         "yes" if t.equal else "NO")
        out().print(rows)
        print("the stores are equal" if found.equal else "the stores DIFFER")
    if not found.equal:
        raise typer.Exit(EXIT_FAILED)


def migrate_store(
    ctx: typer.Context,
    source: Annotated[str, typer.Option(
        "--from", metavar="STORE",
        help="The store to copy (a SQLite file or a postgresql:// URL); no host may run "
             "on it meanwhile: it is claimed, and hosts opening it are refused.")],
    target: Annotated[str, typer.Option(
        "--to", metavar="STORE",
        help="The store to copy into: new or empty (created with the source's shard "
             "count), or holding an interrupted copy (--resume).")],
    batch: BatchOption = 1000,
    resume: ResumeFlag = False,
    check: Annotated[bool, typer.Option(
        "--verify", help="Then compare the two stores table by table (rows and digests); "
                         "exit 1 if they differ.")] = False,
    verify_only: Annotated[bool, typer.Option(
        "--verify-only", help="Only compare the two stores; copy nothing.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Copy every table of a store into another, of either engine (SQLite and PostgreSQL),
    at the current schema, in batches, with every invariant kept: the way from SQLite to
    PostgreSQL (and back). Stop the hosts first."""
    with guard(ctx):
        if not verify_only:
            with _bars(claimed="claimed both stores: a host opening either is refused "
                               "until the copy ends") as progress:
                copied = asyncio.run(migrate(source, target, batch=batch, resume=resume,
                                             progress=progress))
            if as_json and check:  # stdout is the comparison's JSON alone
                err_console().print(_summary("copied", copied))
            else:
                _copied("copied", copied, as_json)
        if not (check or verify_only):
            return
        found = asyncio.run(verify(source, target))
    _verified(found, as_json)


def backup_store(
    ctx: typer.Context,
    store: Annotated[str, typer.Option(
        "--store", envvar="CORRAL_STORE", show_envvar=True, metavar="STORE",
        help="The store to back up (live: its hosts go on).")],
    file: Annotated[Path, typer.Option(
        "--to", metavar="FILE", help="The backup file to write (must not exist).")],
    batch: BatchOption = 1000,
    as_json: JsonFlag = False,
) -> None:
    """Back up a live store, as it is at one instant, into a new file (a SQLite corral
    store with the backup's format, source and time in its meta); `corral restore`
    copies it into a store of either engine."""
    with guard(ctx), _bars() as progress:
        copied = asyncio.run(backup(store, file, batch=batch, progress=progress))
    _copied(f"backed up to {file}:", copied, as_json)


def restore_store(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(metavar="FILE", help="A file `corral backup` wrote.")],
    store: Annotated[str, typer.Option(
        "--store", envvar="CORRAL_STORE", show_envvar=True, metavar="STORE",
        help="The store to restore into: new or empty (created with the backup's shard "
             "count).")],
    batch: BatchOption = 1000,
    resume: ResumeFlag = False,
    as_json: JsonFlag = False,
) -> None:
    """Restore a backup into an empty store of either engine (refused: a backup of a
    newer corral, a store holding data)."""
    with guard(ctx), _bars(claimed="claimed the store: a host opening it is refused until "
                                   "the restore completes") as progress:
        copied = asyncio.run(restore(file, store, batch=batch, resume=resume,
                                     progress=progress))
    _copied("restored", copied, as_json)
