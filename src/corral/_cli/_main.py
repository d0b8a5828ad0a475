"""The `corral` command: the root, its global options, `demo` and `ui`, and `main()`."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from typing import Annotated

import typer

import corral
from corral._app import load_app

from ._builds import list_builds
from ._connection import AppOption, ShardsOption, StoreOption, check_listen_host
from ._dead_letters import commands as dead_letter_commands
from ._deploy import commands as deploy_commands
from ._entities import list_entities, send_signal, show_entity
from ._failure import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    Settings,
    debugging,
    guard,
    is_usage_error,
    report,
    report_usage,
)
from ._history import entity_history
from ._input import legacy_payload
from ._metrics import serve_metrics
from ._moves import backup_store, migrate_store, restore_store
from ._nodes import commands as node_commands
from ._purge import purge
from ._schedule_commands import commands as schedule_commands
from ._snapshots import check as check_snapshots
from ._verbs import (
    query_entity,
    result_of,
    resume_entity,
    start_entity,
    terminate_entity,
    update_entity,
)
from ._waits import deliver, list_waits

__all__ = ["DEFAULT_DEMO_STORE", "app", "main"]

DEFAULT_DEMO_STORE = "corral-demo.db"

app = typer.Typer(
    name="corral", add_completion=False, rich_markup_mode="markdown",
    pretty_exceptions_enable=False,  # a plain traceback under --debug, never with locals
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Durable, addressable entities for Python: atomic signal-with-start, durable "
         "mailboxes, exactly-once application.\n\n"
         "Operator commands take --store and --app (or CORRAL_STORE and CORRAL_APP) and "
         "connect as a pure client: the application's hosts apply what they send. Exit "
         "status: 0 done, 1 the runtime refused or failed, 2 bad input (nothing stored).")


def _version(value: bool) -> None:
    if value:
        print(f"corral {corral.__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    debug: Annotated[bool, typer.Option(
        "--debug", help="Show the traceback of an error instead of one line.")] = False,
    version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="Print the version and exit.")
        ] = False,
) -> None:
    ctx.obj = Settings(debug=debug)


app.command("ls")(list_entities)
app.command("show")(show_entity)
app.command("history")(entity_history)
app.command("waits")(list_waits)
app.add_typer(dead_letter_commands, name="dead-letters")
app.command("start")(start_entity)
app.command("signal")(send_signal)
app.command("update")(update_entity)
app.command("query")(query_entity)
app.command("deliver")(deliver)
app.command("terminate")(terminate_entity)
app.command("resume")(resume_entity)
app.command("result")(result_of)
app.command("check-snapshots")(check_snapshots)
app.command("builds")(list_builds)
app.command("metrics")(serve_metrics)
app.add_typer(deploy_commands, name="deploy")
app.add_typer(node_commands, name="nodes")
app.command("purge")(purge)
app.command("migrate")(migrate_store)
app.command("backup")(backup_store)
app.command("restore")(restore_store)
app.add_typer(schedule_commands, name="schedule")


@app.command("demo")
def demo(
    store: Annotated[str, typer.Option(
        "--store", metavar="PATH",
        help=f"SQLite file to use, deleted first so the demo is repeatable "
             f"(default: ./{DEFAULT_DEMO_STORE}; ':memory:' for no file). Never read from "
             f"CORRAL_STORE.", show_default=False)] = DEFAULT_DEMO_STORE,
    ray: Annotated[bool, typer.Option(
        "--ray", help="Host the ticket in a Ray host actor: on a local Ray instance started "
                      "for the demo, or on the cluster named by RAY_ADDRESS (whose nodes "
                      "must reach the store file).")] = False,
) -> None:
    """Run the ticket-agent demo (signal-with-start fed by duplicated webhooks).

    Fires concurrent, out-of-order, duplicated webhooks at a ticket agent on an
    in-process host and a SQLite store, then prints what happened.
    """
    if ray and store == ":memory:":
        print("corral demo --ray: the host actors need a store file, not ':memory:'")
        raise typer.Exit(EXIT_BAD_INPUT)
    # Imported here so that no other command loads the demo's entity (or Ray).
    from corral._demo import format_report, remove_store, run_demo

    remove_store(store)
    report_ = asyncio.run(run_demo(store, backend="ray" if ray else "local"))
    print(format_report(report_))


@app.command("ui")
def ui(
    ctx: typer.Context,
    store: StoreOption,
    app_spec: AppOption,
    port: Annotated[int, typer.Option(
        "--port", min=0, max=65535, help="The port to listen on (0: a free one).")] = 8765,
    host: Annotated[str, typer.Option(
        "--host", help="The address to listen on (loopback only by default).")] = "127.0.0.1",
    token: Annotated[str | None, typer.Option(
        "--token", envvar="CORRAL_UI_TOKEN", show_envvar=True,
        help="The bearer token operators sign in with (unless the app authenticates).")
        ] = None,
    shards: ShardsOption = None,
) -> None:
    """Serve the web dashboard (needs the ui extra: pip install 'corral[ui]')."""
    with guard(ctx):
        check_listen_host(host)
        loaded = load_app(app_spec)
    try:
        from corral.dashboard import run
    except ImportError as err:  # the ui extra is not installed
        if debugging(ctx):
            raise
        report(err, about="the dashboard needs the ui extra (pip install 'corral[ui]')")
        raise typer.Exit(EXIT_FAILED) from None
    with guard(ctx, ValueError, OSError):  # a bad token, a port taken
        run(store, loaded, host=host, port=port, token=token, shards=shards)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `corral` console script; returns the exit status."""
    args = legacy_payload(sys.argv[1:] if argv is None else argv)
    try:  # not standalone: click's usage errors come here, to be one line like the rest
        code = app(args=args, prog_name="corral", standalone_mode=False)
    except typer.Abort:  # end of input at a prompt
        print("error: Aborted", file=sys.stderr)
        return EXIT_FAILED
    except Exception as err:
        if not is_usage_error(err):
            raise
        return report_usage(err)
    except SystemExit as done:
        code = done.code
        return code if isinstance(code, int) else (0 if code is None else EXIT_FAILED)
    return code if isinstance(code, int) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
