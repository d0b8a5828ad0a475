"""`corral builds`: the registry of builds, per entity type, and their compatibility.

It needs only the store (no `--app`): it reads the manifests the application's
processes registered, and registers nothing itself.
"""

from __future__ import annotations

from typing import Annotated

import typer

import corral
from corral.persistence import stored_shards

from ._connection import JsonFlag, StoreOption
from ._failure import execute
from ._output import cells, out, print_json, table, when

__all__ = ["list_builds"]


def list_builds(
    ctx: typer.Context,
    store: StoreOption,
    entity_type: Annotated[str | None, typer.Argument(
        metavar="TYPE", help="Only builds of this entity type.", show_default=False)] = None,
    as_json: JsonFlag = False,
) -> None:
    """List the builds that processes registered, per entity type, oldest first.

    Each build: its fingerprint, state version, first and last seen, the processes live
    on it now (h: hosts, c: pure clients), whether it is the newest, and whether the
    newest may run beside it (if not, each difference with its fix).
    """
    builds = execute(ctx, _read(store, entity_type))
    if as_json:
        print_json(builds)
        return
    console = out()
    if not builds:
        console.print("no builds registered")
        return
    rows = table("TYPE", "BUILD", "STATE", "FIRST SEEN", "LAST SEEN", "LIVE", "NEWEST",
                 "COMPATIBLE", "DIFFERENCES FROM THE NEWEST")
    for b in builds:
        hosts = sum(p.role == "host" for p in b.processes)
        live = f"{hosts}h {len(b.processes) - hosts}c" if b.processes else "-"
        rows.add_row(*cells([b.entity_type, b.fingerprint, b.state_version,
                             when(b.first_seen), when(b.last_seen), live,
                             "yes" if b.newest else "", "yes" if b.compatible else "NO",
                             "" if b.newest else b.why]))
    console.print(rows)


async def _read(store: str, etype: str | None) -> list[corral.BuildInfo]:
    shards = await stored_shards(store)  # an existing store only: never created here
    async with corral.open_runtime(store, entities=[], shards=shards, host=False) as rt:
        return await rt.builds(etype)
