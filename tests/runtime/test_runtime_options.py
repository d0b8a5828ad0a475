"""`open_runtime` refuses a bad option before anything starts (guarantee 11 at the
runtime's own boundary): a typed `InvalidArgumentError` naming the option, no store
file created, no shard taken, and a good runtime opened next on the same path works.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

import corral
from acceptances import opened
from corral.persistence import open_store
from entities import Reply, Start, Ticket, fresh_key
from stores import sql

START = Start(tenant="acme")

GOOD: dict[str, Any] = {"entities": [Ticket]}

BAD: list[tuple[str, dict[str, Any]]] = [
    ("backend", {"backend": "lokal"}),
    ("entities", {"entities": Ticket}),
    ("entities", {"entities": "Ticket"}),
    ("entities", {"entities": [int]}),
    ("entities", {"entities": [Ticket, Reply]}),
    ("shards", {"shards": 0}),
    ("shards", {"shards": -3}),
    ("shards", {"shards": True}),
    ("shards", {"shards": 2.0}),
    ("shards", {"shards": "16"}),
    ("shards", {"shards": corral.runtime.MAX_SHARDS + 1}),
    ("shards", {"shards": 10**7}),
    ("host", {"host": "yes"}),
    ("host", {"host": 1}),
    ("authorize", {"authorize": "root"}),
    ("limits", {"limits": {"max_payload_bytes": 10}}),
    ("lease_ttl", {"lease_ttl": 0}),
    ("lease_ttl", {"lease_ttl": -1.0}),
    ("lease_ttl", {"lease_ttl": math.inf}),
    ("lease_ttl", {"lease_ttl": math.nan}),
    ("lease_ttl", {"lease_ttl": "10"}),
    ("lease_ttl", {"lease_ttl": 10**6}),
    ("poll_interval", {"poll_interval": 0.0}),
    ("poll_interval", {"poll_interval": math.nan}),
    ("poll_interval", {"poll_interval": False}),
    ("clock", {"clock": object()}),
    # options of the Ray backend, refused rather than silently ignored
    ("hosts", {"hosts": 2}),
    ("env_vars", {"env_vars": {"A": "1"}}),
    ("ray_options", {"ray_options": {"num_cpus": 1}}),
    ("address", {"address": "auto"}),
]


@pytest.mark.parametrize(("option", "bad"), BAD, ids=[f"{o}={v[o]!r}"[:40] for o, v in BAD])
async def test_a_bad_option_is_refused_before_the_store_is_touched(
        tmp_path: Path, option: str, bad: dict[str, Any]) -> None:
    path = tmp_path / "corral.db"
    with pytest.raises(corral.InvalidArgumentError, match=option):
        async with corral.open_runtime(str(path), **{**GOOD, **bad}):
            pass
    assert not path.exists()
    async with corral.open_runtime(str(path), **GOOD) as rt:  # nothing left behind
        key = fresh_key()
        ack = await rt.ref(Ticket, key).signal_with_start(Ticket.reply, Reply(text="hi"),
                                                          start=START)
        assert ack.started


NAMESPACES = ["", "a/b", "a\x00b", "a\ud800", "-lead", "x" * 65, "a b", "ns\n", 7]


@pytest.mark.parametrize("namespace", NAMESPACES, ids=[repr(n)[:20] for n in NAMESPACES])
def test_a_namespace_is_a_plain_name(namespace: Any) -> None:
    with pytest.raises(corral.InvalidArgumentError, match="namespace"):
        corral.runtime.client._options.check_namespace(namespace)


HOSTS = [0, -2, "2", 2.5, True, 10**9, {}, {"node": 0}, {"node": -1}, {"node": "1"},
         {"": 1}, {"n\x00": 1}, {1: 1}, [1, 2]]


@pytest.mark.parametrize("hosts", HOSTS, ids=[repr(h)[:20] for h in HOSTS])
def test_hosts_is_a_positive_count_or_a_map_of_counts(hosts: Any) -> None:
    with pytest.raises(corral.InvalidArgumentError, match="hosts"):
        corral.runtime.client._options.check_hosts(hosts)


def test_hosts_are_at_most_one_per_shard() -> None:
    check = corral.runtime.client._options.check_hosts
    assert check(8, 8) == 8
    assert check({"a": 3, "b": 0}, 8) == {"a": 3, "b": 0}
    for hosts in (9, {"a": 5, "b": 4}):
        with pytest.raises(corral.InvalidArgumentError, match="at most one per shard"):
            check(hosts, 8)


# -- the shard count is the store's, whatever the store is given as -------------------


def _leases(db_path: str) -> list[int]:
    return [r[0] for r in sql(db_path, "SELECT shard FROM leases ORDER BY shard")]


async def test_a_store_object_is_routed_by_its_own_shard_count_and_another_is_refused(
        db_path: str) -> None:
    store = await open_store(db_path, shards=4)
    try:
        with pytest.raises(corral.ShardCountError, match=r"shards=16.*shards=4") as refused:
            async with corral.open_runtime(store, entities=[Ticket], shards=16):
                pass
        assert (refused.value.store_shards, refused.value.shards) == (4, 16)
        assert all(shard < 4 for shard in _leases(db_path))  # nothing taken

        async with corral.open_runtime(store, entities=[Ticket]) as rt:  # no shards=: 4
            for _ in range(8):
                ref = rt.ref(Ticket, fresh_key())
                await ref.signal_with_start(Ticket.reply, Reply(text="hi"), start=START)
                assert (await ref.query(Ticket.status)).inbox == ["acme:hi"]
            assert rt.host is not None
            assert sorted(rt.host.shards) == [0, 1, 2, 3]
        assert _leases(db_path) in ([], [0, 1, 2, 3])  # PostgreSQL makes the 4 rows
        assert {r[0] for r in sql(db_path, "SELECT shard FROM entities")} <= {0, 1, 2, 3}
    finally:
        await store.close()
    with pytest.raises(corral.ShardCountError) as refused:  # a path: the same refusal
        async with corral.open_runtime(db_path, entities=[Ticket], shards=8):
            pass
    assert (refused.value.store_shards, refused.value.shards) == (4, 8)


async def test_a_store_refuses_a_lease_past_its_shard_count_and_makes_no_row(
        db_path: str) -> None:
    async with opened(db_path, 4) as store:
        for asked in ([4], [3, 15], [-1]):
            with pytest.raises(corral.ShardCountError, match="past this store's 4 shards"):
                await store.acquire_leases("wrong", asked, 60.0)
        assert all(shard < 4 for shard in _leases(db_path))
        assert sql(db_path, "SELECT count(*) FROM leases WHERE owner = 'wrong'") == [(0,)]
        # a Ray dedicated entity's pseudo-shard, MAX_SHARDS past the count or more
        dedicated = 4 + corral.runtime.MAX_SHARDS
        assert await store.acquire_leases("ray", [dedicated], 60.0) == {dedicated: 1}
