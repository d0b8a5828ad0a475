"""`corral deploy roll`: move each shard of a Ray deployment to a host actor running the
--app code, one shard at a time, through the graceful hand-off (`roll_ray_hosts`).

Progress is one line per shard moved (its pause), then a summary; `--json`
prints the report instead. An incompatible build is refused before anything moves
(exit 1, the differences named).
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import typer

from corral._app import load_app
from corral._errors import InvalidArgumentError
from corral.runtime import RollReport, RollStep, roll_ray_hosts

from ._connection import AppOption, JsonFlag, RayAddressOption, RayNamespaceOption
from ._failure import execute, parse_json
from ._output import print_json, printable

__all__ = ["commands", "step_line"]

commands = typer.Typer(
    help="Deploy a new release of the entity code to a Ray deployment.",
    no_args_is_help=True)


def step_line(step: RollStep) -> str:
    """One shard moved, for people (a roll's and a drain's progress)."""
    return (f"shard {step.shard}: {step.old_actor} -> {step.new_actor} at epoch "
            f"{step.epoch}, paused {step.pause * 1000:.0f} ms ({step.seconds:.1f} s)")


@commands.command("roll")
def roll(
    ctx: typer.Context,
    app: AppOption,
    namespace: RayNamespaceOption = "corral",
    address: RayAddressOption = None,
    runtime_env: Annotated[str | None, typer.Option(
        "--runtime-env", metavar="JSON",
        help='Ray runtime_env of the new actors, as JSON (e.g. \'{"working_dir": "."}\' '
             "to ship the new code).", show_default=False)] = None,
    env: Annotated[list[str] | None, typer.Option(
        "--env", metavar="KEY=VALUE", show_default=False,
        help="An environment variable of the new actors (repeat for more); merged with "
             "--runtime-env's env_vars.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Move each shard to a host actor running the --app code (one per node): the new
    host asks for the shard, the old one stops taking work for it, lets its commits land
    and hands it over; callers meanwhile see at most a short pause. Each current host
    first checks that the new build may succeed its own (exit 1 with the differences if
    not: then use corral.runtime.stop_ray_hosts). Running it again resumes a roll that
    stopped."""
    text = not as_json

    def progress(step: RollStep) -> None:
        if text:
            print(printable(step_line(step)), flush=True)

    async def work() -> RollReport:  # bad --app, --runtime-env or --env: exit 2 (`execute`)
        options: dict[str, Any] = {}
        ray_env = parse_json(runtime_env, "--runtime-env")
        if ray_env is not None:
            options["runtime_env"] = ray_env
        env_vars = _env_vars(env or [])
        entities = load_app(app).entities
        return await asyncio.to_thread(roll_ray_hosts, namespace, entities, address=address,
                                       actor_options=options, env_vars=env_vars,
                                       on_step=progress)

    report = execute(ctx, work())
    if not text:
        print_json(report)
        return
    pauses = sorted(s.pause for s in report.steps)
    worst = f", longest pause {pauses[-1] * 1000:.0f} ms" if pauses else ""
    print(f"rolled {len(report.steps)} shards in {report.seconds:.1f} s{worst}; "
          f"{len(report.skipped)} already on this build")


def _env_vars(pairs: list[str]) -> dict[str, str]:
    """`--env KEY=VALUE`s as a dict (`roll_ray_hosts` checks names and values).

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
