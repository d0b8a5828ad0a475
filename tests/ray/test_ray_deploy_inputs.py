"""The Ray deployment verbs check what they are given before they touch a deployment:
a bad namespace (`check_namespace`) or node id (text with no control characters or
lone surrogates) is an `InvalidArgumentError` naming it, from the Python API and as
one line with exit status 2 from the `corral` command; a node id Ray does not know is
refused with the ones it does."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import ray

import corral
from corral._cli import main
from corral.runtime import drain_node, roll_ray_hosts, stop_ray_hosts, undrain_node
from ray_workers import Counter, Item, Start

BAD_NAMESPACES: list[Any] = ["", "a/b", "ns\0", "ns\n", "\ud800", "-x", "x" * 65, ".x",
                             7, None]
BAD_NODE_IDS: list[Any] = ["", "a\nb", "n\x1b[2J", "\udfff", 5, None]

VERBS: dict[str, Callable[[Any], object]] = {
    "roll_ray_hosts": lambda ns: roll_ray_hosts(ns, [Counter]),
    "drain_node": lambda ns: drain_node("n", namespace=ns),
    "undrain_node": lambda ns: undrain_node("n", namespace=ns),
    "stop_ray_hosts": lambda ns: stop_ray_hosts(ns),
}


@pytest.mark.parametrize("verb", sorted(VERBS))
@pytest.mark.parametrize("namespace", BAD_NAMESPACES, ids=repr)
def test_every_deployment_verb_refuses_a_bad_namespace(
        ray_address: str, verb: str, namespace: object) -> None:
    with pytest.raises(corral.InvalidArgumentError, match="namespace must be"):
        VERBS[verb](namespace)


@pytest.mark.parametrize("verb", [drain_node, undrain_node], ids=lambda v: v.__name__)
@pytest.mark.parametrize("node_id", BAD_NODE_IDS, ids=repr)
def test_drain_and_undrain_refuse_a_node_id_that_is_not_plain_text(
        ray_address: str, verb: Callable[..., object], node_id: object) -> None:
    with pytest.raises(corral.InvalidArgumentError, match="node_id must be"):
        verb(node_id, namespace="nodes-inputs")


def test_the_cli_refuses_a_bad_namespace_in_one_line_with_status_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    commands = [
        ["deploy", "roll", "--app", "ray_roll_entities:ENTITIES"],
        ["metrics", "--store", str(tmp_path / "none.db")],
        ["nodes"],
        ["nodes", "drain", "n"],
        ["nodes", "undrain", "n"],
    ]
    for command in commands:
        for namespace in ("a/b", "ns\x1b[2J", "-x"):
            assert main([*command, "--namespace", namespace]) == 2, command
            err = capsys.readouterr().err
            assert err.startswith("error: InvalidArgumentError: namespace must be "), err
            assert err.count("\n") == 1, err
            assert "\x1b" not in err, err


async def _new_store(store: str) -> None:
    async with corral.open_runtime(store, entities=[Counter], host=False):
        pass


def test_the_cli_refuses_an_address_that_is_not_plain_text(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = str(tmp_path / "s.db")
    asyncio.run(_new_store(store))
    commands = [
        ["deploy", "roll", "--app", "ray_roll_entities:ENTITIES"],
        ["metrics", "--store", store, "--namespace", "ns"],
        ["nodes"],
        ["nodes", "drain", "n"],
    ]
    for command in commands:
        for address in ("127.0.0.1:6379\x1b[2J", "\udfff", "a\nb"):
            assert main([*command, "--address", address]) == 2, command
            err = capsys.readouterr().err
            assert err.startswith("error: InvalidArgumentError: address must be "), err
            assert err.count("\n") == 1, err
            assert "\x1b" not in err, err


async def test_an_unknown_node_id_is_refused_naming_the_alive_nodes(
        tmp_path: Path, namespace: str) -> None:
    async with corral.open_runtime(str(tmp_path / "s.db"), backend="ray", deploy=True,
                                   namespace=namespace,
                                   shards=2, entities=[Counter], hosts=1) as rt:
        await rt.ref(Counter, "k").signal_with_start(Counter.add, Item(id="a"),
                                                     start=Start(tenant="t"))
        node = ray.get_runtime_context().get_node_id()
        for verb in (drain_node, undrain_node):
            with pytest.raises(corral.InvalidArgumentError) as caught:
                await asyncio.to_thread(verb, "f" * 56, namespace=namespace)
            assert "f" * 56 in str(caught.value)
            assert node in str(caught.value)
        await asyncio.to_thread(undrain_node, node, namespace=namespace)  # alive: fine
