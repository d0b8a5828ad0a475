"""Metrics: a known workload, then the series scraped over HTTP equal its counts."""

from __future__ import annotations

import urllib.request
from collections import defaultdict
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel

import corral
import corral.metrics
from procs import wait_until


class Item(BaseModel):
    id: str


class Roll(BaseModel):
    generation: int = 0


class Meter(corral.Entity):
    """Counts items ("boom" raises: dead-lettered at once); continues as new on `roll`;
    passivated when idle; keeps mailbox payloads in `held` until `release`."""

    retry = corral.RetryPolicy(max_attempts=1)
    # Long enough that the meter never passivates between the workload's steps, even
    # while a scrape holds up the loop on a slow machine (0.2 s did: a second passivation
    # and reactivation on Python 3.10 in CI); the test waits for the one passivation.
    idle_timeout = 1.0
    held = corral.signal(Item)

    def __init__(self, init: Roll) -> None:
        self.generation = init.generation
        self.items: list[str] = []
        self.rolling = False

    @corral.signal
    def add(self, item: Item) -> None:
        if item.id == "boom":
            raise ValueError("boom")
        self.items.append(item.id)

    @corral.signal
    def roll(self) -> None:
        self.rolling = True

    @corral.update
    def count(self) -> int:
        return len(self.items)

    async def run(self) -> None:
        await self.wait_for(lambda: self.rolling)
        self.continue_as_new(Roll(generation=self.generation + 1))


def scrape(port: int) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Every sample of `/metrics`: {sample name: {sorted labels: value}}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        assert reply.headers["Content-Type"].startswith("text/plain")
        text = reply.read().decode()
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = defaultdict(dict)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[s.name][tuple(sorted(s.labels.items()))] = s.value
    return samples


def value(samples: dict[str, Any], name: str, **labels: str) -> float:
    return float(samples.get(name, {}).get(tuple(sorted(labels.items())), 0.0))


@pytest.fixture(scope="module")
def metrics_port() -> int:
    return corral.metrics.serve(0)


async def test_the_scraped_series_equal_a_known_workloads_counts(
        db_path: str, metrics_port: int) -> None:
    store_label = "postgresql" if db_path.startswith("postgresql") else "sqlite"
    # Leases are renewed every lease_ttl / 3: not during this test.
    async with corral.open_runtime(db_path, entities=[Meter], lease_ttl=120) as rt:
        before = scrape(metrics_port)
        commits_before = rt.store.commits
        ops_before = rt.store.ops_committed
        ref = rt.ref(Meter, "m-1")
        for i in range(5):
            await ref.signal_with_start(Meter.add, Item(id=f"i{i}"), start=Roll(),
                                        message_id=f"i{i}")
        for i in range(2):  # redeliveries
            await ref.signal_with_start(Meter.add, Item(id=f"i{i}"), start=Roll(),
                                        message_id=f"i{i}")
        with pytest.raises(corral.IdempotencyConflictError):
            await ref.signal(Meter.add, Item(id="other"), message_id="i0")
        with pytest.raises(corral.InvalidPayloadError):
            await ref.signal(Meter.add, {"id": 7})
        with pytest.raises(corral.InvalidPayloadError):
            await ref.signal(Meter.add, {"name": "x"})
        await ref.signal(Meter.add, Item(id="boom"))
        for i in range(3):
            await ref.signal(Meter.held, Item(id=f"h{i}"))
        assert await ref.update(Meter.count) == 5
        during = scrape(metrics_port)
        await ref.signal(Meter.roll)  # continue-as-new: run 2 takes the 3 held payloads
        await wait_until(_second_run(ref), "run 2 is live")
        host = rt.host
        assert host is not None
        await wait_until(lambda: host.shards[ref.shard].get("Meter", ref.key) is None,
                         "the meter is passivated")
        commits = rt.store.commits - commits_before
        ops = rt.store.ops_committed - ops_before
        after = scrape(metrics_port)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    m = {"entity_type": "Meter"}
    assert delta("corral_messages_accepted_total", kind="signal", **m) == 5 + 1 + 3 + 1
    assert delta("corral_messages_accepted_total", kind="update", **m) == 1
    assert delta("corral_messages_duplicate_total", kind="signal", **m) == 2
    assert delta("corral_messages_rejected_total", reason="IdempotencyConflictError", **m) == 1
    assert delta("corral_messages_rejected_total", reason="InvalidPayloadError", **m) == 2
    assert delta("corral_accept_seconds_count", **m) == 11
    assert delta("corral_dead_letters_total", **m) == 1
    assert delta("corral_continue_as_new_total", **m) == 1
    assert delta("corral_passivations_total", **m) == 1
    assert delta("corral_snapshots_total", **m) >= 2  # the dead letter's and passivation's
    # Run 1 applied 5 items, the poison one, 3 held payloads, the update and the roll;
    # run 2 the 3 held payloads carried over.
    assert delta("corral_messages_applied_total", **m) == 5 + 1 + 3 + 1 + 1 + 3
    assert delta("corral_activations_total", **m) == 2  # run 1, then run 2
    assert delta("corral_group_commit_ops_count", store=store_label) == commits
    assert delta("corral_group_commit_ops_sum", store=store_label) == ops
    assert value(during, "corral_resident_entities", **m) == 1
    assert value(during, "corral_mailbox_depth", **m) == 3
    assert value(after, "corral_resident_entities", **m) == 0


def _second_run(ref: corral.EntityRef[Meter, Roll]) -> Any:
    async def check() -> bool:
        info = await ref.describe()
        return info.run_id == 2 and info.hosted_here and info.mailbox_depth == 3
    return check


async def test_a_local_host_reports_itself_up_while_open_and_not_after_close(
        db_path: str, metrics_port: int) -> None:
    """`corral_host_up{host}` is on both backends: locally 1 for each host the process
    runs (its owner id), while it runs."""
    async with corral.open_runtime(db_path, entities=[Meter]) as rt:
        assert rt.host is not None
        owner = rt.host.owner
        during = scrape(metrics_port)
    after = scrape(metrics_port)
    assert during["corral_host_up"][(("host", owner),)] == 1.0
    assert (("host", owner),) not in after.get("corral_host_up", {})


async def test_a_due_durable_timer_is_counted_when_it_wakes_an_entity(
        tmp_path: Any, metrics_port: int) -> None:
    class Sleeper(corral.Entity):
        idle_timeout = 0.05

        def __init__(self) -> None:
            self.until: float | None = None

        async def run(self) -> str:
            if self.until is None:
                self.until = self.now() + 0.5
                await self.checkpoint()
            await self.sleep_until(self.until)
            return "woke"

    before = scrape(metrics_port)
    async with corral.open_runtime(str(tmp_path / "s.db"), entities=[Sleeper]) as rt:
        ref = rt.ref(Sleeper, "s")
        await ref.start(start=None)
        assert await ref.result(timeout=10) == "woke"
    after = scrape(metrics_port)
    fired = value(after, "corral_timers_fired_total", entity_type="Sleeper") - \
        value(before, "corral_timers_fired_total", entity_type="Sleeper")
    assert fired == 1  # passivated while asleep, woken by its due timer


def test_a_histogram_counts_each_observation_in_its_le_bucket_and_above() -> None:
    """Bucket bounds are inclusive (`le`), counts cumulative, +Inf counts everything."""
    def bucket(le: str) -> float:
        v = corral.metrics.REGISTRY.get_sample_value(
            "corral_accept_seconds_bucket", {"entity_type": "Edges", "le": le})
        return v or 0.0

    for seconds in (0.0002, 0.00021, 0.001, 6.0):
        corral.metrics.accepted("Edges", "signal", seconds)
    assert [bucket(le) for le in ("0.0002", "0.0005", "0.001", "0.002", "5.0", "+Inf")] == \
        [1, 2, 3, 3, 3, 4]
    total = corral.metrics.REGISTRY.get_sample_value("corral_accept_seconds_sum",
                                                      {"entity_type": "Edges"})
    assert total == pytest.approx(0.0002 + 0.00021 + 0.001 + 6.0)
    assert corral.metrics.REGISTRY.get_sample_value(
        "corral_messages_accepted_total", {"entity_type": "Edges", "kind": "signal"}) == 4


def test_a_batch_of_accepts_counts_each_message_at_its_commits_latency() -> None:
    """One call for a group commit's accepts of one kind: every message is counted."""
    def sample(name: str, **labels: str) -> float:
        return corral.metrics.REGISTRY.get_sample_value(name, labels) or 0.0

    corral.metrics.accepted("Batched", "signal", 0.003, count=5)
    corral.metrics.duplicate("Batched", "signal", count=2)
    assert sample("corral_messages_accepted_total", entity_type="Batched", kind="signal") == 5
    assert sample("corral_messages_duplicate_total", entity_type="Batched", kind="signal") == 2
    assert sample("corral_accept_seconds_bucket", entity_type="Batched", le="0.002") == 0
    assert sample("corral_accept_seconds_bucket", entity_type="Batched", le="0.005") == 5
    assert sample("corral_accept_seconds_sum", entity_type="Batched") == pytest.approx(0.015)


def test_the_series_of_several_hosts_merge_into_one_family_per_name() -> None:
    """A scrape must not repeat a family: two hosts' samples of a name become one family
    (the Ray deployment's scrape, `corral.runtime.ray._host_metrics`), told apart by label."""
    from corral.runtime.ray._host_metrics import labelled

    corral.metrics.accepted("Merged", "signal", 0.001)
    text = corral.metrics.exposition().decode()
    merged = corral.metrics.merge(labelled(text, "host-a"), labelled(text, "host-b"))
    again = corral.metrics.exposition(merged).decode()
    assert again.count("# TYPE corral_messages_accepted_total counter") == 1
    found = [(s.labels["host"], s.value) for f in text_string_to_metric_families(again)
             for s in f.samples if s.name == "corral_messages_accepted_total"
             and s.labels["entity_type"] == "Merged"]
    assert found == [("host-a", 1.0), ("host-b", 1.0)]


def test_step_series_stay_bounded_whatever_the_step_names_of_100k_keys() -> None:
    """A step named after its entity's key (`f"model:{key}"`, or a bare key) for 100,000
    keys: the `step` label is the name up to its ":", and past `STEP_LABELS` (type, step)
    pairs the rest count as "(other)"; every attempt is still counted."""

    def series() -> dict[tuple[str, str], float]:
        found: dict[tuple[str, str], float] = {}
        text = corral.metrics.exposition().decode()
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "corral_step_attempts_total" and \
                        s.labels["entity_type"].startswith("Bounded"):
                    found[(s.labels["entity_type"], s.labels["step"])] = s.value
        return found

    before = series()
    for n in range(100_000):
        corral.metrics.step_attempted("BoundedA", f"model:{n}", 0.01)  # one label: model
        corral.metrics.step_attempted("BoundedB", f"key-{n}", 0.01)  # a name per key
    after = series()
    assert after[("BoundedA", "model")] - before.get(("BoundedA", "model"), 0) == 100_000
    assert sum(after.values()) - sum(before.values()) == 200_000
    assert len(after) <= corral.metrics.STEP_LABELS + 2  # one "(other)" per type
    assert ("BoundedB", corral.metrics.OTHER_STEPS) in after
    assert not any(step.startswith("model:") for _, step in after)
