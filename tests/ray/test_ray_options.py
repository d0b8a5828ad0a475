"""A bad option of a Ray deployment is refused at the caller before any actor is asked:
`hosts=` that is not a count (it reached the placer, failed there as a `RayTaskError`
and poisoned the deployment's setting for every later client; `10**9` hung), more hosts
than shards, a namespace that is not a plain name. The deployment goes on serving."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import corral
from corral.runtime.ray._directory import assignment
from ray_workers import Counter, Item, Start

SHARDS = 4


def runtime(store: str, namespace: str, **kwargs: Any) -> Any:
    return corral.open_runtime(store, backend="ray", deploy=True, namespace=namespace,
                               shards=SHARDS, entities=[Counter], lease_ttl=5.0, **kwargs)


BAD_HOSTS = [0, -2, "2", 2.5, True, 10**9, {}, {"no-such-node": 0}, SHARDS + 1]


async def test_bad_hosts_are_refused_and_the_deployment_goes_on(
        db_path: str, namespace: str) -> None:
    async with runtime(db_path, namespace, hosts=1) as rt:
        ref = rt.ref(Counter, "k")
        await ref.signal_with_start(Counter.add, Item(id="a"), start=Start(tenant="t"))
        before = assignment(namespace)
        for i, hosts in enumerate(BAD_HOSTS):
            with pytest.raises(corral.InvalidArgumentError, match="hosts"):
                async with runtime(db_path, namespace, hosts=hosts):
                    pass
            await ref.signal(Counter.add, Item(id=f"b{i}"))  # the first client is unhurt
        assert assignment(namespace) == before
        async with runtime(db_path, namespace) as other:  # a later client is unhurt too
            seen = await other.ref(Counter, "k").query(Counter.seen)
        assert seen.items == ["a"] + [f"b{i}" for i in range(len(BAD_HOSTS))]


@pytest.mark.parametrize("namespace_given", ["a/b", "a\x00b", "a\ud800b", ""])
async def test_a_namespace_that_is_not_a_plain_name_is_refused(
        tmp_path: Path, namespace_given: str) -> None:
    with pytest.raises(corral.InvalidArgumentError, match="namespace"):
        async with runtime(str(tmp_path / "s.db"), namespace_given):
            pass
    assert not (tmp_path / "s.db").exists()
