"""The placer's decision (`ray._placer.plan_moves`), a pure function of what a round
observed: least-shard allocation, a limit per round, lost shards all at once."""

from __future__ import annotations

from corral.runtime.ray._placer import host_name, plan_moves


def host(node: str, n: int = 0, tag: str = "t1") -> str:
    return host_name("ns", node, n, tag)


def loads_after(shards: int, directory: dict[int, str], plan: list[tuple[int, str, bool]]
                ) -> dict[str, int]:
    after = dict(directory)
    after.update((shard, to) for shard, to, _ in plan)
    counts: dict[str, int] = {}
    for name in after.values():
        counts[name] = counts.get(name, 0) + 1
    return counts


def test_unplaced_shards_go_to_the_least_loaded_hosts_all_at_once() -> None:
    wanted = [host("n1"), host("n2"), host("n3")]
    plan = plan_moves(256, {}, wanted, {"n1", "n2", "n3"}, set(wanted), limit=8)
    assert len(plan) == 256
    assert all(force for _, _, force in plan)
    assert sorted(loads_after(256, {}, plan).values()) == [85, 85, 86]


def test_a_joining_node_takes_at_most_the_limit_per_round_until_balanced() -> None:
    old, new = host("n1"), host("n2")
    directory = dict.fromkeys(range(16), old)
    rounds = 0
    while plan := plan_moves(16, directory, [old, new], {"n1", "n2"}, {old, new}, limit=3):
        assert len(plan) <= 3
        assert not any(force for _, _, force in plan)
        directory.update((shard, to) for shard, to, _ in plan)
        rounds += 1
    assert rounds == 3  # 8 moves, 3 per round
    assert sorted(loads_after(16, directory, []).values()) == [8, 8]


def test_a_lost_nodes_shards_are_forced_over_the_limit_and_a_drained_ones_stay_on_the_node(
        ) -> None:
    lost, drained, kept = host("n1"), host("n2"), host("n3")
    directory = {0: lost, 1: lost, 2: lost, 3: drained, 4: drained, 5: kept}
    plan = plan_moves(6, directory, [kept, host("n3", 1)], {"n2", "n3"},
                      {lost, drained, kept, host("n3", 1)}, limit=1)
    forced = sorted(shard for shard, _, force in plan if force)
    assert forced == [0, 1, 2], "the lost node's shards all move, taken over"
    assert [shard for shard, _, force in plan if not force] == [3], "one drained per round"


def test_an_older_builds_shard_moves_to_the_new_build_on_its_own_node() -> None:
    old1, old2 = host("n1", tag="old"), host("n2", tag="old")
    new1, new2 = host("n1", tag="new"), host("n2", tag="new")
    directory = {0: old1, 1: old2}
    plan = plan_moves(2, directory, [new1, new2], {"n1", "n2"}, {old1, old2, new1, new2},
                      limit=2, balance=False)
    assert plan == [(0, new1, False), (1, new2, False)]
