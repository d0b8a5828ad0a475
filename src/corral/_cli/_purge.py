"""`corral purge`: what retention would purge now (`--dry-run`), or purge it now.

Each entity type of the application that declares a `corral.Retention` (or only
`--type T`) is purged of its runs closed longer than `closed_for` ago, judged once when
the command starts, in batches of `--batch` runs (one transaction each, deleting at
most the type's `Retention.rows` rows: a run with more goes over several), oldest
first, with a progress line per batch on stderr. The hosts purge the same runs in the
background; purging here too is safe (each batch re-reads what is still there).

The application's `authorize` hook is asked about every type first, with `--sender`
as the claim: kind "purge" (`key` ""), or for `--dry-run` kind "read" named
"purgeable"; one refusal (`UnauthorizedError`, exit 1) purges nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated

import typer

import corral
from corral._errors import InvalidArgumentError
from corral.actors import EntityDefinition
from corral.persistence import Purged

from ._connection import (
    AppOption,
    Connection,
    JsonFlag,
    SenderOption,
    ShardsOption,
    StoreOption,
)
from ._output import cells, err_console, out, print_json, table

__all__ = ["purge"]


@dataclass(frozen=True)
class PurgeLine:
    """One type's outcome: runs and entities purged (or that would be), rows deleted."""

    entity_type: str
    closed_for: float
    runs: int
    entities: int
    rows: int
    dry_run: bool


def purge(
    ctx: typer.Context,
    store: StoreOption,
    app: AppOption,
    entity_type: Annotated[str | None, typer.Option(
        "--type", metavar="TYPE", help="Only this entity type (it must declare a retention).",
        show_default=False)] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Count what would be purged, per type; delete nothing.")] = False,
    batch: Annotated[int, typer.Option(
        "--batch", metavar="N", min=1, max=100_000,
        help="Runs purged per transaction.")] = 500,
    sender: SenderOption = None,
    shards: ShardsOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Purge closed runs past their type's retention (`retention = corral.Retention(
    closed_for=...)`) with all their rows, as the hosts do in the background; with
    --dry-run, count them per type instead."""
    async def work(rt: corral.Runtime) -> list[PurgeLine]:
        retained = _retained(rt, entity_type)
        kind, name = ("read", "purgeable") if dry_run else ("purge", "purge")
        for d in retained:  # every type allowed before any is purged
            await rt.boundary.permit(sender, d.name, "", kind, name)
        return [await _purge(rt, d, dry_run=dry_run, batch=batch) for d in retained]

    lines = Connection(store, app, shards).call(ctx, work)
    if as_json:
        print_json(lines)
        return
    console = out()
    if not lines:
        console.print("no entity type declares a retention")
        return
    rows = table("TYPE", "CLOSED FOR (s)", "RUNS", "ENTITIES", *([] if dry_run else ["ROWS"]),
                 title="would purge" if dry_run else "purged")
    for line in lines:
        rows.add_row(*cells([line.entity_type, f"{line.closed_for:g}", line.runs,
                             line.entities, *([] if dry_run else [line.rows])]))
    console.print(rows)


def _retained(rt: corral.Runtime, entity_type: str | None) -> list[EntityDefinition]:
    """The application's types with a retention (only `entity_type`'s, if named)."""
    if entity_type is None:
        return [d for d in rt.boundary.definitions.values() if d.retention is not None]
    definition = rt.boundary.definition(entity_type)
    if definition.retention is None:
        raise InvalidArgumentError(f"--type {entity_type}: the type declares no retention "
                                   "(retention = corral.Retention(closed_for=...))")
    return [definition]


async def _purge(rt: corral.Runtime, definition: EntityDefinition, *, dry_run: bool,
                 batch: int) -> PurgeLine:
    """Purge (or count) one type's runs closed before now minus its retention."""
    assert definition.retention is not None
    closed_for = definition.retention.closed_for
    cutoff = time.time() - closed_for
    if dry_run:
        found = await rt.store.purgeable(definition.name, cutoff)
        return PurgeLine(definition.name, closed_for, found.runs, found.entities, 0, True)
    total, progress = Purged(), err_console()
    rows = definition.retention.rows
    while (done := await rt.store.purge_closed(definition.name, cutoff, limit=batch,
                                               rows=rows)).rows:
        total += done
        progress.print(f"{definition.name}: purged {total.runs} runs "
                       f"({total.entities} entities, {total.rows} rows) so far")
    return PurgeLine(definition.name, closed_for, total.runs, total.entities, total.rows,
                     False)
