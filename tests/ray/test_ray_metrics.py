"""One metric scheme on both backends: what a Ray host actor counts is scraped under the
names, labels and meanings of the local backend, from where the operating guide says to
scrape a Ray deployment (`corral metrics --namespace NS`, the dashboard's `/metrics`).

The host actors run in the session's Ray instance; `corral metrics` is a real
subprocess (a Ray driver of its own) scraped over HTTP.
"""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

import corral
import corral.metrics
from corral.dashboard import create_app
from corral.runtime.ray._host_metrics import HOST_LABEL, pull_hosts
from metrics_cli import scrape, scrape_corral_metrics, unknown_series
from ray_workers import Item, Metered, Seen
from webhook_traffic import load_example

SENDS, KEYS = 30, 3


def series(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(sample name, labels, value) of every sample of a text exposition."""
    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text)
            for s in family.samples]


def metered(samples: list[tuple[str, dict[str, str], float]]) -> dict[str, float]:
    """Each sample name of `Metered`, summed over hosts."""
    totals: dict[str, float] = {}
    for name, labels, value in samples:
        if labels.get("entity_type") == "Metered":
            totals[name] = totals.get(name, 0.0) + value
    return totals


async def workload(rt: corral.Runtime) -> None:
    """SENDS signals over KEYS entities, then a query of each (so all are applied)."""
    for i in range(SENDS):
        await rt.ref(Metered, f"m-{i % KEYS}").signal_with_start(
            Metered.add, Item(id=str(i)), start=None, message_id=f"mid-{i}")
    for k in range(KEYS):
        seen: Seen = await rt.ref(Metered, f"m-{k}").query(Metered.seen)
        assert len(seen.items) == SENDS // KEYS


async def test_corral_metrics_serves_what_ray_host_actors_counted_under_the_corral_names(
        db_path: str, namespace: str, ray_address: str) -> None:
    async with corral.open_runtime(db_path, entities=[Metered], backend="ray", deploy=True,
                                   namespace=namespace, shards=2) as rt:
        await workload(rt)
        text = await scrape_corral_metrics("--store", db_path, "--namespace", namespace,
                                           "--address", ray_address)
    got = series(text)
    assert not [n for n, _, _ in got if n.startswith("ray_")]
    totals = metered(got)
    assert totals["corral_messages_accepted_total"] == SENDS
    assert totals["corral_messages_applied_total"] == SENDS
    assert totals["corral_accept_seconds_count"] == SENDS
    assert totals["corral_activations_total"] == KEYS
    assert totals["corral_resident_entities"] == KEYS  # a gauge, taken at the scrape
    hosts = {labels[HOST_LABEL] for _, labels, _ in got if HOST_LABEL in labels}
    assert hosts, "no sample names its host actor"
    assert all(h.startswith(f"corral/{namespace}/host-") for h in hosts), hosts  # host actors
    up = {labels[HOST_LABEL]: v for n, labels, v in got if n == "corral_host_up"}
    assert set(up) == hosts
    # One each: the pull's verdict, not also the actor's own report of its hosts.
    assert len([n for n, _, _ in got if n == "corral_host_up"]) == len(hosts)
    assert set(up.values()) == {1.0}
    assert ("corral_store_up", {}, 1.0) in got  # the census, in the same scrape
    assert unknown_series(text) == []  # the shipped alerts and Grafana panels work on Ray


async def test_the_series_of_a_ray_deployment_have_the_local_backends_names_and_labels(
        db_path: str, namespace: str, tmp_path: Path) -> None:
    def scheme(samples: list[tuple[str, dict[str, str], float]]) -> set[tuple[str, ...]]:
        """(name, label names but host) of each sample of Metered: the scheme."""
        return {(name, *sorted(set(labels) - {HOST_LABEL}))
                for name, labels, _ in samples if labels.get("entity_type") == "Metered"}

    before = metered(series(corral.metrics.exposition().decode()))
    async with corral.open_runtime(str(tmp_path / "local.db"), entities=[Metered]) as rt:
        await workload(rt)
        local = series(corral.metrics.exposition().decode())
    assert not before  # this process counted nothing of Metered before
    async with corral.open_runtime(db_path, entities=[Metered], backend="ray", deploy=True,
                                   namespace=namespace, shards=2) as rt:
        await workload(rt)
        # The dashboard's /metrics over HTTP: the census, this process's own series
        # (the local run's, above) and the host actors' (`rt.host_metrics()`).
        app = create_app(rt, token=secrets.token_urlsafe())
        async with load_example().serve_http(app) as url:
            scraped = series(await asyncio.to_thread(scrape, f"{url}/metrics"))
    on_ray = [s for s in scraped if HOST_LABEL in s[1]]
    here = [s for s in scraped if HOST_LABEL not in s[1]
            and not s[0].startswith(("corral_store_", "corral_host_up"))]  # census, pull
    assert on_ray, "no series of a host actor"
    assert scheme(on_ray) == scheme(local)
    latency = {"corral_accept_seconds_bucket", "corral_accept_seconds_sum"}
    assert {k: v for k, v in metered(on_ray).items() if k not in latency} == \
        {k: v for k, v in metered(local).items() if k not in latency}  # the same counts
    # This process's own counts, beside the hosts' (its local runtime closed meanwhile:
    # nothing of it is resident any more).
    resident = {"corral_resident_entities", "corral_mailbox_depth"}
    assert metered(here) == {k: v for k, v in metered(local).items() if k not in resident}


async def test_a_host_actor_that_does_not_answer_in_time_is_reported_down_not_dropped(
        db_path: str, namespace: str) -> None:
    async with corral.open_runtime(db_path, entities=[Metered], backend="ray", deploy=True,
                                   namespace=namespace, shards=2) as rt:
        await workload(rt)
        answered = await pull_hosts(namespace)
        late = await pull_hosts(namespace, timeout=0.0)  # no Ray call answers that fast
    hosts = {s.labels[HOST_LABEL] for f in answered if f.name == "corral_host_up"
             for s in f.samples}
    assert hosts
    assert [(f.name, {s.labels[HOST_LABEL]: s.value for s in f.samples}) for f in late] == \
        [("corral_host_up", dict.fromkeys(hosts, 0.0))]  # and none of their series
