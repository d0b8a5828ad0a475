"""`corral deploy`: declare a release of a Ray deployment and roll every shard to it
(`corral.runtime.deploy`); `deploy status` shows the releases and the hosts;
`deploy stop` stops the deployment; `deploy roll` is the older spelling of a deploy.

    corral deploy --namespace helpdesk --app ticketdesk.agent:app \\
        --store postgresql://... --runtime-env '{"working_dir": "."}' --hosts 2

Progress is one line per shard moved (its pause), then a summary; `--json` prints the
report instead. An incompatible release is refused before anything moves (exit 1,
each difference named); an app that does not import where the hosts run, exit 2.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import typer

from corral._errors import InvalidArgumentError
from corral.runtime import (
    DeployReport,
    RollStep,
    deploy_status,
    stop_ray_hosts,
)
from corral.runtime import deploy as deploy_release
from corral.runtime.ray._release import Release, report_json

from ._connection import JsonFlag, RayAddressOption, RayNamespaceOption
from ._failure import execute, guard, parse_json
from ._output import cells, out, print_json, printable, table, when

__all__ = ["commands", "step_line"]

commands = typer.Typer(
    help="Declare a release of a Ray deployment (and roll to it), follow it, stop it.",
    invoke_without_command=True, add_completion=False)

_App = Annotated[str | None, typer.Option(
    "--app", envvar="CORRAL_APP", show_envvar=True, metavar="MODULE:ATTRIBUTE",
    help="The release's entity code: an import path every host imports inside the "
         "runtime_env (a corral.App, an Entity class or a list of them).",
    show_default=False)]
_Store = Annotated[str | None, typer.Option(
    "--store", envvar="CORRAL_STORE", show_envvar=True, metavar="STORE",
    help="The deployment's store (a postgresql:// URL, or a SQLite file every host can "
         "open); needed for the first release.", show_default=False)]
_RuntimeEnv = Annotated[str | None, typer.Option(
    "--runtime-env", metavar="JSON", show_default=False,
    help='Ray runtime_env of the hosts, as JSON (e.g. \'{"working_dir": "."}\': a local '
         "directory is uploaded from here).")]
_Env = Annotated[list[str] | None, typer.Option(
    "--env", metavar="KEY=VALUE", show_default=False,
    help="An environment variable of the hosts (repeat for more); merged with "
         "--runtime-env's env_vars.")]
_Hosts = Annotated[int | None, typer.Option(
    "--hosts", min=1, show_default=False,
    help="Host actors over the alive nodes (default: one per node).")]
_CheckSnapshots = Annotated[bool, typer.Option(
    "--check-snapshots",
    help="Restore a sample of the stored snapshots with the release's code first; "
         "refuse the release if one fails.")]


def step_line(step: RollStep) -> str:
    """One shard moved, for people (a deploy's and a drain's progress)."""
    return (f"shard {step.shard}: {step.old_actor} -> {step.new_actor} at epoch "
            f"{step.epoch}, paused {step.pause * 1000:.0f} ms ({step.seconds:.1f} s)")


@commands.callback()
def deploy(
    ctx: typer.Context,
    app: _App = None,
    store: _Store = None,
    namespace: RayNamespaceOption = "corral",
    address: RayAddressOption = None,
    runtime_env: _RuntimeEnv = None,
    env: _Env = None,
    hosts: _Hosts = None,
    check_snapshots: _CheckSnapshots = False,
    as_json: JsonFlag = False,
) -> None:
    """Declare a release (--app, shipped by --runtime-env) of the Ray deployment
    --namespace and roll every shard to it, a few at a time, through the graceful
    hand-off; the first release starts the deployment on --store. Running it again
    with the current release changes nothing; a rollback is deploying the older
    release again. Subcommands: status, stop, roll."""
    if ctx.invoked_subcommand is not None:
        return
    if app is None:
        out().print(ctx.get_help())
        raise typer.Exit(2)
    _run(ctx, app, store=store, namespace=namespace, address=address,
         runtime_env=runtime_env, env=env, hosts=hosts, check_snapshots=check_snapshots,
         as_json=as_json)


@commands.command("roll")
def roll(
    ctx: typer.Context,
    app: _App = None,
    namespace: RayNamespaceOption = "corral",
    address: RayAddressOption = None,
    runtime_env: _RuntimeEnv = None,
    env: _Env = None,
    as_json: JsonFlag = False,
) -> None:
    """The same as `corral deploy` on a running deployment (kept for scripts)."""
    if app is None:
        raise typer.BadParameter("--app is required", param_hint="--app")
    _run(ctx, app, store=None, namespace=namespace, address=address,
         runtime_env=runtime_env, env=env, hosts=None, check_snapshots=False,
         as_json=as_json)


def _run(ctx: typer.Context, app: str, *, store: str | None, namespace: str,
         address: str | None, runtime_env: str | None, env: list[str] | None,
         hosts: int | None, check_snapshots: bool, as_json: bool) -> None:
    text = not as_json

    def progress(step: RollStep) -> None:
        if text:
            print(printable(step_line(step)), flush=True)

    async def work() -> DeployReport:  # a bad --runtime-env or --env: exit 2 (`execute`)
        ray_env: Any = parse_json(runtime_env, "--runtime-env")
        env_vars = _env_vars(env or [])
        return await asyncio.to_thread(
            deploy_release, namespace, app=app, store=store, runtime_env=ray_env,
            hosts=hosts, env_vars=env_vars, address=address,
            check_snapshots=check_snapshots, on_step=progress)

    report = execute(ctx, work())
    if not text:
        print_json(report_json(report))
        return
    for note in report.notes:
        print(printable(f"note: {note}"))
    if report.unchanged:
        print(printable(f"{report.release} is the current release already: nothing "
                        f"changed"))
        return
    pauses = sorted(s.pause for s in report.steps)
    worst = f", longest pause {pauses[-1] * 1000:.0f} ms" if pauses else ""
    print(printable(f"{namespace}: {report.release} is current (build "
                    f"{report.release.tag}); moved {len(report.steps)} shards in "
                    f"{report.seconds:.1f} s{worst}; {len(report.skipped)} were on it"))


@commands.command("status")
def status(
    ctx: typer.Context,
    namespace: RayNamespaceOption = "corral",
    address: RayAddressOption = None,
    as_json: JsonFlag = False,
) -> None:
    """The deployment's current and previous releases, which hosts run which, and how
    many shards are on the current release (a roll's progress)."""
    with guard(ctx):
        found = deploy_status(namespace, address=address)
    if as_json:
        print_json(report_json(found))
        return
    state = "rolling" if found.rolling else "settled"
    print(printable(f"deployment {namespace}: {found.on_release} of {found.shards} "
                    f"shards on the current release ({state})"))
    releases = table("", "RELEASE", "ID", "BUILD", "APP", "DECLARED", "BY")
    for label, release in (("current", found.release), ("previous", found.previous)):
        if release is not None:
            releases.add_row(*cells([label, *_release_cells(release)]))
    out().print(releases)
    hosts = table("HOST", "NODE", "RELEASE ID", "SHARDS")
    for host in found.hosts:
        hosts.add_row(*cells([host.name, host.node, host.release_id, host.shards]))
    out().print(hosts)


def _release_cells(release: Release) -> list[object]:
    return [release.seq, release.id, release.tag, release.app, when(release.declared_at),
            release.declared_by]


@commands.command("stop")
def stop(
    ctx: typer.Context,
    namespace: RayNamespaceOption = "corral",
    address: RayAddressOption = None,
) -> None:
    """Stop the deployment: its placer, then each host cleanly (leases released). The
    releases stay in the store; the next `corral deploy` starts it again."""
    from corral.runtime.ray._deployment import connect

    with guard(ctx):
        connect(namespace, address)
        stopped = stop_ray_hosts(namespace)
    print(printable(f"{namespace}: stopped {stopped} actors"))


def _env_vars(pairs: list[str]) -> dict[str, str]:
    """`--env KEY=VALUE`s as a dict (`deploy` checks names and values).

    Raises:
        InvalidArgumentError: a pair without "=", or one name given two values.
    """
    found: dict[str, str] = {}
    for pair in pairs:
        name, equals, value = pair.partition("=")
        if not equals:
            raise InvalidArgumentError(f"--env takes KEY=VALUE, got {pair!r}")
        if found.setdefault(name, value) != value:
            raise InvalidArgumentError(f"--env gives {name!r} two values: give it once")
    return found
