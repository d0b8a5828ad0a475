"""`corral check-snapshots`: do the stored snapshots restore with this code?"""

from __future__ import annotations

from typing import Annotated

import typer

from corral._app import load_app
from corral.testing import SnapshotCheck, check_snapshots

from ._connection import AppOption, StoreOption
from ._errors import EXIT_FAILED, execute
from ._output import printable

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
) -> None:
    """Restore each entity's latest snapshot (a finished one's final state included)
    with the --app code (upgrade hooks included) and replay its journal through the
    handlers, without effects: `run()` never runs and nothing is written. Prints per
    type how many restore and why any fail; exits 1 if one fails. Run it in CI against
    a copy of production."""
    async def work() -> SnapshotCheck:
        return await check_snapshots(store, entities=load_app(app).entities,
                                     entity_type=entity_type, sample=sample)

    report = execute(ctx, work())
    for line in report.summary().splitlines() or ["no entity types to check"]:
        print(printable(line))
    if not report.ok:
        raise typer.Exit(EXIT_FAILED)
