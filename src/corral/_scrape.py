"""One scrape for the whole deployment: the store's census as Prometheus series.

The series below are derived from the store alone (`Runtime.census`, aggregated in
SQL), so any process serves the same numbers for every backend: the dashboard's
`/metrics` (with that process's own `corral.metrics.REGISTRY` after them, and on Ray
every host actor's, `Runtime.host_metrics`) and `corral metrics --store URL --port N`
(with `--namespace NS`, a Ray deployment's host actors' series too). They are gauges
named `corral_store_*`, apart from the per-process series of `corral.metrics` (counters
of what one process did), so the two never collide in one scrape. Scrape one census
server per deployment, not one per process: every process would report the same store.

Series (each type-labelled one is reported for every entity type it labels, 0 when there
is nothing to count, so a series does not vanish when it goes to zero). The types that
label them are bounded, whatever the store holds (a store is input: 2,000 forged types
would make 14,000 series): the `CENSUS_TYPES` (100) types with the most entities, by
name among equals; every other type (and any name that is not an identifier, so never
an entity type's) is summed into `entity_type="(other)"` (its builds into
`build="(other)"`; the oldest unapplied age is their oldest), so totals stay whole:
    corral_store_up                                   1: the census was read; 0: not
    corral_store_census_seconds                       how long the census read took
    corral_store_entities{entity_type,status}         entities by their latest run's status
    corral_store_backlog_messages{entity_type}        accepted, not yet applied (running runs)
    corral_store_entities_behind{entity_type}         running entities with a backlog
    corral_store_oldest_unapplied_age_seconds{entity_type}
                                                      age of the oldest unapplied message
    corral_store_dead_letters{entity_type}            dead letters held
    corral_store_open_waits{entity_type}              durable signal waits open
    corral_store_suspended_runs{entity_type}          running runs suspended
    corral_store_processes{entity_type,build,role}    live processes by build and role
    corral_store_hosts                                hosts holding a live shard lease
    corral_store_shards                               the store's shard count
    corral_store_shards_held                          shards with a live lease
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from corral.metrics import exposition
from corral.persistence import Census, TypeBacklog

__all__ = ["CENSUS_SERIES", "CENSUS_TYPES", "OTHER_TYPES", "HostSeries", "bounded",
           "census_families", "census_text", "serve_census"]

CENSUS_TYPES = 100
"""At most this many entity types label the census series; the rest are `OTHER_TYPES`."""
OTHER_TYPES = "(other)"
"""The `entity_type` (and `build`) label of the types past `CENSUS_TYPES`, summed: not an
identifier, so no entity type is named so."""

CENSUS_SERIES = (
    "corral_store_up", "corral_store_census_seconds", "corral_store_entities",
    "corral_store_backlog_messages", "corral_store_entities_behind",
    "corral_store_oldest_unapplied_age_seconds", "corral_store_dead_letters",
    "corral_store_open_waits", "corral_store_suspended_runs", "corral_store_processes",
    "corral_store_hosts", "corral_store_shards", "corral_store_shards_held",
)
"""Every series name the census exports (the alert rules and dashboard are checked
against a live scrape, `tests/operators/test_scrape.py`)."""

_TYPE = ["entity_type"]


def _by_type(name: str, doc: str, types: Iterable[str],
             counts: Iterable[tuple[str, float]]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=_TYPE)
    known = dict(counts)
    for etype in sorted(set(types) | set(known)):
        family.add_metric([etype], known.get(etype, 0))
    return family


def _summed(rows: Iterable[tuple[tuple[str, ...], int]]) -> tuple[Any, ...]:
    """(labels..., count) of `rows` ((labels, count)), the counts of equal labels summed."""
    totals: dict[tuple[str, ...], int] = {}
    for labels, count in rows:
        totals[labels] = totals.get(labels, 0) + count
    return tuple((*labels, count) for labels, count in sorted(totals.items()))


def bounded(c: Census, types: int = CENSUS_TYPES) -> Census:
    """`c` with at most `types` entity types named: those with the most entities (by
    name among equals), and every other one's numbers summed under `OTHER_TYPES`."""
    counts: dict[str, int] = {}
    for etype, _, count in c.entities:
        counts[etype] = counts.get(etype, 0) + count
    for rows in (c.dead_letters, c.open_waits, c.suspended_runs):
        for etype, _ in rows:
            counts.setdefault(etype, 0)
    for etype in [b.entity_type for b in c.backlog] + [p[0] for p in c.processes]:
        counts.setdefault(etype, 0)
    ranked = sorted((t for t in counts if t.isidentifier()), key=lambda t: (-counts[t], t))
    kept = frozenset(ranked[:types])
    if len(kept) == len(counts):
        return c

    def name(etype: str) -> str:
        return etype if etype in kept else OTHER_TYPES

    backlog: dict[str, TypeBacklog] = {}
    for b in c.backlog:
        t = name(b.entity_type)
        was = backlog.get(t)
        oldest = [x for x in (b.oldest_unapplied_at,
                              None if was is None else was.oldest_unapplied_at)
                  if x is not None]
        backlog[t] = TypeBacklog(t, b.messages + (was.messages if was else 0),
                                 b.entities + (was.entities if was else 0),
                                 min(oldest) if oldest else None)
    return dataclasses.replace(
        c, entities=_summed(((name(t), s), n) for t, s, n in c.entities),
        backlog=tuple(backlog[t] for t in sorted(backlog)),
        dead_letters=_summed(((name(t),), n) for t, n in c.dead_letters),
        open_waits=_summed(((name(t),), n) for t, n in c.open_waits),
        suspended_runs=_summed(((name(t),), n) for t, n in c.suspended_runs),
        processes=_summed(((name(t), b if t in kept else OTHER_TYPES, r), n)
                          for t, b, r, n in c.processes))


def census_families(census: Census | None, seconds: float = 0.0, *,
                    type_limit: int = CENSUS_TYPES) -> list[GaugeMetricFamily]:
    """The census as metric families (None: it could not be read, `corral_store_up` 0),
    at most `type_limit` entity types named (`bounded`)."""
    up = GaugeMetricFamily("corral_store_up", "1 if the store's census was read.")
    up.add_metric([], 0 if census is None else 1)
    took = GaugeMetricFamily("corral_store_census_seconds", "Seconds the census read took.")
    took.add_metric([], seconds)
    if census is None:
        return [up, took]
    c = bounded(census, type_limit)
    types = {etype for etype, _, _ in c.entities}
    entities = GaugeMetricFamily("corral_store_entities", "Entities by their latest run's "
                                 "status.", labels=["entity_type", "status"])
    for etype, status, count in c.entities:
        entities.add_metric([etype, status], count)
    processes = GaugeMetricFamily("corral_store_processes", "Live processes by entity "
                                  "type, build fingerprint and role (host or client).",
                                  labels=["entity_type", "build", "role"])
    for etype, build, role, count in c.processes:
        processes.add_metric([etype, build, role], count)
    singles = [("corral_store_hosts", "Hosts holding a live shard lease.", c.hosts),
               ("corral_store_shards", "The store's shard count.", c.shards),
               ("corral_store_shards_held", "Shards with a live lease.", c.shards_held)]
    families = [up, took, entities, *(
        _by_type(name, doc, types, counts) for name, doc, counts in (
            ("corral_store_backlog_messages", "Messages accepted and not yet applied, of "
             "running runs.", [(b.entity_type, b.messages) for b in c.backlog]),
            ("corral_store_entities_behind", "Running entities with messages not yet "
             "applied.", [(b.entity_type, b.entities) for b in c.backlog]),
            ("corral_store_oldest_unapplied_age_seconds", "Seconds since the oldest message "
             "not yet applied was accepted (0: none).",
             [(b.entity_type, max(0.0, c.at - b.oldest_unapplied_at)) for b in c.backlog
              if b.oldest_unapplied_at is not None]),
            ("corral_store_dead_letters", "Dead letters held.", c.dead_letters),
            ("corral_store_open_waits", "Durable signal waits open.", c.open_waits),
            ("corral_store_suspended_runs", "Running runs suspended.", c.suspended_runs),
        )), processes]
    for name, doc, value in singles:
        family = GaugeMetricFamily(name, doc)
        family.add_metric([], value)
        families.append(family)
    return families


async def census_text(read: Callable[[], Awaitable[Census]]) -> bytes:
    """The Prometheus text exposition of a census `read()` now (`corral_store_up` 0 if
    the read fails: the scrape itself still answers)."""
    began = time.perf_counter()
    try:
        census: Census | None = await read()
    except Exception:
        census = None
    return exposition(census_families(census, time.perf_counter() - began))


HostSeries = Callable[[], Awaitable[list[Metric]]]
"""Pulls the series of hosts outside this process (a Ray deployment's host actors)."""


class _Live(Collector):
    """Reads a census (and the hosts' series) on the event loop `loop` at each scrape
    (from the HTTP thread)."""

    def __init__(self, read: Callable[[], Awaitable[Census]], hosts: HostSeries | None,
                 loop: asyncio.AbstractEventLoop, timeout: float) -> None:
        self._read, self._hosts, self._loop, self._timeout = read, hosts, loop, timeout

    def collect(self) -> Iterator[Metric]:
        began = time.perf_counter()
        try:
            census: Census | None = self._on_loop(self._read())
        except Exception:
            census = None
        yield from census_families(census, time.perf_counter() - began)
        if self._hosts is not None:
            yield from self._on_loop(self._hosts())

    def _on_loop(self, call: Awaitable[Any]) -> Any:
        async def run() -> Any:
            return await call
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(self._timeout)


def serve_census(read: Callable[[], Awaitable[Census]], port: int, addr: str = "127.0.0.1",
                 *, hosts: HostSeries | None = None, timeout: float = 10.0) -> int:
    """Serve the census at `http://addr:port/metrics` from a daemon thread, each scrape
    reading it through `read()` on the running event loop (keep it running), and the
    series `hosts()` pulls after it (a Ray deployment's host actors); returns the port
    (0: a free one)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Live(read, hosts, asyncio.get_running_loop(), timeout))
    server, _ = start_http_server(port, addr, registry=registry)
    return int(server.server_address[1])
