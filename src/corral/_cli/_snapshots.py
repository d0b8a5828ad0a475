"""`corral check-snapshots`: do the stored snapshots restore with this code?"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from corral._app import load_app
from corral.testing import SnapshotCheck, check_snapshots

from ._connection import AppOption, JsonFlag, StoreOption
from ._failure import EXIT_FAILED, execute
from ._output import jsonable, print_json, printable

__all__ = ["check"]


def check(
    ctx: typer.Context,
    store: StoreOption,
    app: AppOption,
    entity_type: Annotated[str | None, typer.Option(
        "--type", metavar="TYPE", help="Only entities of this type.", show_default=False)
        ] = None,
    sample: Annotated[int | None, typer.Option(
        "--sample", metavar="N", min=1,
        help="At most N entities per type, chosen at random (default: all).",
        show_default=False)] = None,
    as_json: JsonFlag = False,
) -> None:
    """Restore each entity's latest snapshot (a finished one's final state included)
    with the --app code (upgrade hooks included) and replay its journal through the
    handlers, without effects: `run()` never runs and nothing is written. Prints per
    type how many restore and why any fail (--json: {"ok", "types": [{"entity_type",
    "checked", "restored", "failures": [{"entity_type", "key", "run_id", "error"}]}]});
    exits 1 if one fails. Run it in CI against a copy of production."""
    async def work() -> SnapshotCheck:
        return await check_snapshots(store, entities=load_app(app).entities,
                                     entity_type=entity_type, sample=sample)

    report = execute(ctx, work())
    if as_json:
        print_json(_as_json(report))
    else:
        for line in report.summary().splitlines() or ["no entity types to check"]:
            print(printable(line))
    if not report.ok:
        raise typer.Exit(EXIT_FAILED)


def _as_json(report: SnapshotCheck) -> dict[str, Any]:
    """The report as data: the dataclasses' fields, with `ok` and each type's `restored`."""
    return {"ok": report.ok,
            "types": [{**jsonable(t), "restored": t.restored} for t in report.types]}
