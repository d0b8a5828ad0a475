"""`corral nodes` on the session's one-node Ray: the node and the shards its host holds,
a drain of the last node refused in one line, an undrain, and the errors a script
meets (no deployment, an unknown node). Draining a node that gives its shards away is
`test_ray_placement.py`'s cluster test, through the same commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import ray

import corral
from corral._cli import main
from corral.runtime import ray_nodes
from corral.runtime.ray._directory import assignment
from ray_workers import Counter, Item, Start

SHARDS = 4


async def test_corral_nodes_lists_the_node_its_host_and_its_shards_and_refuses_a_last_drain(
        tmp_path: Path, namespace: str, capsys: pytest.CaptureFixture[str]) -> None:
    node = ray.get_runtime_context().get_node_id()
    address = next(n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node)
    ns = ["--namespace", namespace]
    async with corral.open_runtime(str(tmp_path / "s.db"), backend="ray", deploy=True,
                                   namespace=namespace, shards=SHARDS, entities=[Counter],
                                   hosts=1) as rt:
        await rt.ref(Counter, "k").signal_with_start(Counter.add, Item(id="a"),
                                                     start=Start(tenant="t"))
        (host,) = set(assignment(namespace).values())
        (listed,) = ray_nodes(namespace)
        assert listed == corral.runtime.RayNode(node, address, True, False, (host,), SHARDS)

        assert main(["nodes", *ns, "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == [
            {"node_id": node, "address": address, "alive": True, "drained": False,
             "hosts": [host], "shards": SHARDS}]
        assert main(["nodes", "list", *ns]) == 0
        header, _rule, row = capsys.readouterr().out.splitlines()
        assert header.split() == ["NODE", "ADDRESS", "ALIVE", "DRAINED", "SHARDS", "HOSTS"]
        assert row.split() == [node, address, "yes", "no", str(SHARDS), host]

        assert main(["nodes", "drain", node, *ns]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err.startswith("error: InvalidArgumentError: draining node ")
        assert "would leave no node" in captured.err
        assert captured.err.count("\n") == 1

        assert main(["nodes", "drain", "f" * 56, *ns]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: InvalidArgumentError: no alive Ray node ")
        assert node in err

        assert main(["nodes", "undrain", node, *ns, "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == {"node_id": node, "drained": False}
        assert main(["nodes", "undrain", node, *ns]) == 0
        assert capsys.readouterr().out == f"node {node} undrained: it takes its share of " \
                                          f"the shards from the placer's next round\n"
        assert (await rt.ref(Counter, "k").query(Counter.seen)).items == ["a"]


def test_corral_nodes_of_a_namespace_with_no_deployment_is_one_line(
        ray_address: str, capsys: pytest.CaptureFixture[str]) -> None:
    for command in (["nodes"], ["nodes", "drain", "n"], ["nodes", "undrain", "n"]):
        assert main([*command, "--namespace", "no-such-deployment"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(("error: DeploymentNotFoundError: ",  # or the node, first
                               "error: InvalidArgumentError: no alive Ray node")), err
        assert err.count("\n") == 1, err
