"""`corral nodes`: a Ray deployment's nodes and the shards each holds; `drain` one
before removing it, `undrain` it to take it back (`corral.runtime.ray_nodes`,
`drain_node`, `undrain_node`).

A drain prints one line per shard moved (as `corral deploy roll` does), then a
summary; `--json` prints the `DrainReport` instead. Draining the last node that can
run the deployment's hosts is refused (one line, exit 2, nothing changed).
"""

from __future__ import annotations

from typing import Annotated

import typer

from corral.runtime import DrainReport, drain_node, ray_nodes, undrain_node

from ._connection import JsonFlag, RayAddressOption, RayNamespaceOption
from ._deploy import step_line
from ._failure import guard
from ._groups import ListUnlessNamed
from ._output import cells, out, print_json, print_result, printable, table

__all__ = ["commands"]

commands = typer.Typer(
    cls=ListUnlessNamed, name="nodes", add_completion=False,
    help="A Ray deployment's nodes and their shards; drain a node before removing it. "
         "Without a subcommand: list.")

_NodeId = Annotated[str, typer.Argument(
    metavar="NODE_ID", show_default=False,
    help="A Ray node id (see `corral nodes`).")]


@commands.command("list")
def list_nodes(
    ctx: typer.Context,
    namespace: RayNamespaceOption = "corral",
    address: RayAddressOption = None,
    as_json: JsonFlag = False,
) -> None:
    """List the Ray cluster's nodes: alive or not, drained or not, the deployment's
    host actors on each and how many shards they hold."""
    with guard(ctx):
        nodes = ray_nodes(namespace, address=address)
    if as_json:
        print_json(nodes)
        return
    rows = table("NODE", "ADDRESS", "ALIVE", "DRAINED", "SHARDS", "HOSTS")
    for node in nodes:
        rows.add_row(*cells([node.node_id, node.address, _yes(node.alive),
                             _yes(node.drained), node.shards, " ".join(node.hosts)]))
    out().print(rows)


@commands.command("drain")
def drain(
    ctx: typer.Context,
    node_id: _NodeId,
    namespace: RayNamespaceOption = "corral",
    address: RayAddressOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Move every shard off a node through the graceful hand-off, stop the
    deployment's host actors there and place nothing there again (until `undrain`):
    before removing the node. Callers see a short pause of each moving shard."""
    with guard(ctx):
        report = drain_node(node_id, namespace=namespace, address=address)
    if as_json:
        print_json(report)
        return
    for step in report.steps:
        print(printable(step_line(step)))
    print(printable(_summary(report)))


@commands.command("undrain")
def undrain(
    ctx: typer.Context,
    node_id: _NodeId,
    namespace: RayNamespaceOption = "corral",
    address: RayAddressOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Let the placer place shards on a drained node again: its next rounds even the
    load out onto it."""
    with guard(ctx):
        undrain_node(node_id, namespace=namespace, address=address)
    print_result(as_json, {"node_id": node_id, "drained": False},
                 printable(f"node {node_id} undrained: it takes its share of the shards "
                           f"from the placer's next round"))


def _summary(report: DrainReport) -> str:
    pauses = sorted(s.pause for s in report.steps)
    worst = f", longest pause {pauses[-1] * 1000:.0f} ms" if pauses else ""
    stopped = ", ".join(report.stopped) or "none"
    return (f"drained node {report.node_id}: moved {len(report.steps)} shards in "
            f"{report.seconds:.1f} s{worst}; host actors stopped: {stopped}")


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"
