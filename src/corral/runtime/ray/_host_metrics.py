"""The metrics of a Ray deployment's hosts, pulled into one scrape.

Locally the process that hosts a shard counts into its own `corral.metrics.REGISTRY`
and serves it. On Ray the hosts are actors: they count into the `REGISTRY` of their
own processes, which have no port to scrape. A scrape of the deployment (`corral metrics
--namespace NS`, the dashboard's `/metrics`, `Runtime.host_metrics`) asks every host
actor of the namespace for its exposition (`ShardHost.metrics`, one Ray call each, all
at once) and serves their series under the very names, labels and meanings of the local
backend, each sample labelled `host` with the actor's name, plus `corral_host_up{host}`
(0 for an actor that did not answer in time: its series are missing from that scrape).

Why a pull and not Ray's own metrics agent (`ray.util.metrics`, which earlier releases
mirrored into): the agent exports every application series as `ray_<name>` from each
node's agent port, never the gauges taken at scrape time (resident entities, mailbox
depth, suspended runs), and only after its export interval; the pull needs nothing
but the Ray cluster corral already uses, and a scrape shows what the hosts count now.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

import corral.metrics as metrics

__all__ = ["HOST_LABEL", "host_actors", "pull_hosts"]

log = logging.getLogger("corral.ray")

HOST_LABEL = "host"
"""The label naming the host actor a pulled sample came from."""

PULL_TIMEOUT = 5.0
"""Seconds a scrape waits for the host actors' answers."""


def host_actors(namespace: str) -> list[str]:
    """The names of the Ray deployment `namespace`'s actors (`corral/<namespace>/...`).
    A GCS read: call it off the event loop."""
    import ray

    prefix = f"corral/{namespace}/"
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a["namespace"] == namespace and a["name"].startswith(prefix))


def _handles(namespace: str) -> list[tuple[str, Any]]:
    import ray

    found = []
    for name in host_actors(namespace):
        try:
            found.append((name, ray.get_actor(name, namespace=namespace)))
        except ValueError:  # gone meanwhile
            continue
    return found


def labelled(text: str, host: str) -> list[Metric]:
    """The metric families of one host's exposition, each sample labelled `host`; but
    the host's own `corral_host_up` (its process's hosts, by owner id), which the pull's
    verdict on the actor replaces."""
    families = []
    for family in text_string_to_metric_families(text):
        if family.name == metrics.HOST_UP:
            continue
        family.samples = [Sample(s.name, {**s.labels, HOST_LABEL: host}, s.value,
                                 s.timestamp, s.exemplar) for s in family.samples]
        families.append(family)
    return families


async def pull_hosts(namespace: str, *, timeout: float = PULL_TIMEOUT) -> list[Metric]:
    """Every host actor's series of the deployment `namespace`, labelled `host`, merged
    by name (`corral.metrics.merge`), and `corral_host_up`; none if the actors cannot
    be listed (Ray's GCS unreachable: the rest of the scrape still answers)."""
    try:
        hosts = await asyncio.to_thread(_handles, namespace)
    except Exception as err:
        log.warning("could not list the host actors of %s: %r", namespace, err)
        return []
    up = GaugeMetricFamily(metrics.HOST_UP, "1 if the host actor answered the metrics "
                           "pull of this scrape, 0 if not.", labels=[HOST_LABEL])
    pulled: list[list[Metric]] = []

    async def pull(name: str, handle: Any) -> None:
        try:
            text: bytes = await asyncio.wait_for(handle.metrics.remote(), timeout)
        except AttributeError:  # an actor of the namespace that is not a host
            return
        except Exception as err:  # dying, restarting, hung: missing from this scrape
            log.info("%s did not answer the metrics pull: %s", name, type(err).__name__)
            up.add_metric([name], 0)
            return
        pulled.append(labelled(text.decode(), name))
        up.add_metric([name], 1)

    await asyncio.gather(*(pull(name, handle) for name, handle in hosts))
    return [*metrics.merge(*pulled), up]
