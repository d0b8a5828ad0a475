"""Metrics for a monitoring system: Prometheus series, one scheme on every backend.

Every process that accepts or hosts counts into `REGISTRY` (its own
`prometheus_client.CollectorRegistry`, so an application's registry is never
cluttered): scrape it with `corral.metrics.serve(port)`, from the dashboard's
`/metrics`, or mount `prometheus_client.make_asgi_app(REGISTRY)` yourself. On Ray the
hosts are actors with no port of their own: a deployment's scrape (`corral metrics
--namespace NS`, the dashboard's `/metrics`) pulls each host actor's `REGISTRY` through
one Ray call and serves its series under the same names, with a `host` label naming the
actor (`Runtime.host_metrics`, `corral.runtime.ray._host_metrics`).

A leaf of the package: it imports nothing of corral, so every layer may count.

Series (each labelled by `entity_type`, where it has one):
    corral_messages_accepted_total{kind}      new messages accepted (signal, update, ...)
    corral_messages_duplicate_total{kind}     sends answered `duplicate`
    corral_messages_rejected_total{reason}    sends refused (the error's type name)
    corral_messages_applied_total             journal entries applied
    corral_activations_total                  entities loaded into memory
    corral_passivations_total                 entities snapshotted and evicted
    corral_snapshots_total                    snapshots written
    corral_continue_as_new_total              runs continued as new
    corral_dead_letters_total                 signals dead-lettered
    corral_timers_fired_total                 due durable timers that woke an entity
    corral_run_suspensions_total              run() raising (or an activation failing to
                                              build): each failed attempt suspends the run
    corral_suspended_entities                 runs held suspended by this process (gauge,
                                              at scrape): alert on > 0
    corral_step_attempts_total{step}          attempts of durable steps (`Entity.step`)
    corral_step_failures_total{step}          steps failed for good: their last attempt
                                              failed (`StepFailedError` in `run()`)
    corral_step_seconds{step}                 each attempt's duration (histogram)
    corral_accept_seconds                     acceptance latency (histogram)
    corral_group_commit_ops{store}            write ops per group commit (histogram)
    corral_resident_entities                  entities in memory (gauge, at scrape)
    corral_mailbox_depth                      mailbox payloads waiting (gauge, at scrape)
    corral_host_up{host}                      1 for each host whose series are in this
                                              scrape: locally, each host this process
                                              runs (`host` its owner id, at scrape)
The `step` label is a step's name up to its first ":" (a name the code derives from
what it works on, `f"model:{reply.id}"`, is labelled `model`: never an id), and bounded:
the first `STEP_LABELS` (100) (entity type, step) pairs a process counts are named, any
later one is counted under `step="(other)"` (`OTHER_STEPS`), so 100,000 distinct names
make at most 100 series per metric beside one "(other)" per type.
On Ray, pulled from the host actors, each also labelled `host` (the actor's name), and
`corral_host_up{host}` set by the pull instead: 1 the host actor answered, 0 it did not
(its series are missing from that scrape). Locally a process that does not answer is
missing as a whole: Prometheus's own `up` of its job is 0.
"""

from __future__ import annotations

import bisect
import itertools
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

__all__ = [
    "HOST_UP",
    "OTHER_STEPS",
    "REGISTRY",
    "STEP_LABELS",
    "accepted",
    "activated",
    "applied",
    "batch",
    "continued",
    "dead_lettered",
    "duplicate",
    "exposition",
    "merge",
    "passivated",
    "rejected",
    "schedule_fired",
    "schedule_skipped",
    "serve",
    "snapshotted",
    "step_attempted",
    "step_failed",
    "step_label",
    "suspended",
    "timer_fired",
    "track_residents",
    "untrack_residents",
]

REGISTRY = CollectorRegistry(auto_describe=True)
"""Every corral series of this process."""

_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                 120.0, 300.0)
_LATENCY_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                    1.0, 2.5, 5.0)
_LATENESS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
                     3600.0)

# Counters: name -> (help, label names); each series is labelled by `entity_type` first.
_COUNTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "corral_messages_accepted": ("New messages accepted.", ("entity_type", "kind")),
    "corral_messages_duplicate": ("Sends answered duplicate.", ("entity_type", "kind")),
    "corral_messages_rejected": ("Sends refused, by error type.", ("entity_type", "reason")),
    "corral_messages_applied": ("Journal entries applied.", ("entity_type",)),
    "corral_activations": ("Entities loaded into memory.", ("entity_type",)),
    "corral_passivations": ("Entities snapshotted and evicted.", ("entity_type",)),
    "corral_snapshots": ("Snapshots written.", ("entity_type",)),
    "corral_continue_as_new": ("Runs continued as new.", ("entity_type",)),
    "corral_dead_letters": ("Signals dead-lettered.", ("entity_type",)),
    "corral_timers_fired": ("Due durable timers that woke an entity.", ("entity_type",)),
    "corral_run_suspensions": ("Failed attempts of run() or of an activation, each of which "
                               "suspended its run.", ("entity_type",)),
    "corral_schedule_ticks_fired": ("Schedule ticks fired, by outcome (accepted, started, "
                                    "duplicate, refused).", ("entity_type", "outcome")),
    "corral_schedule_ticks_skipped": ("Schedule ticks skipped, by reason (missed: older "
                                      "than the catch-up window; overlap).",
                                      ("entity_type", "reason")),
    "corral_step_attempts": ("Attempts of durable steps.", ("entity_type", "step")),
    "corral_step_failures": ("Durable steps failed for good (their last attempt failed).",
                             ("entity_type", "step")),
}
# Histograms: name -> (help, label names, bucket upper bounds).
_HISTOGRAMS: dict[str, tuple[str, tuple[str, ...], tuple[float, ...]]] = {
    "corral_accept_seconds": ("Acceptance latency, send to durable.", ("entity_type",),
                              _LATENCY_BUCKETS),
    "corral_group_commit_ops": ("Write ops per group-commit transaction.", ("store",),
                                _BATCH_BUCKETS),
    "corral_schedule_lateness_seconds": ("How late each fired schedule tick was (from its "
                                         "time, jitter included).", ("entity_type",),
                                         _LATENESS_BUCKETS),
    "corral_step_seconds": ("Duration of each attempt of a durable step.",
                            ("entity_type", "step"), _STEP_BUCKETS),
}

# The series themselves, counted in plain numbers under one lock (~0.4 us a count, where
# prometheus_client's labelled metrics cost 2-5 us, on every message) and turned into
# metric families only when scraped (`_Series`). Keys are (name, label values).
_counting = threading.Lock()
_counts: dict[tuple[str, tuple[str, ...]], float] = {}
# Per histogram series: each bucket's count (the last one +Inf), then each bucket's sum.
_observed: dict[tuple[str, tuple[str, ...]], list[float]] = {}

def _count(name: str, values: tuple[str, ...], value: float = 1.0) -> None:
    key = (name, values)
    with _counting:
        _counts[key] = _counts.get(key, 0.0) + value


def _observe(name: str, values: tuple[str, ...], value: float, count: int = 1) -> None:
    """`count` observations of `value` (a batch of accepts shares its commit's latency)."""
    bounds = _HISTOGRAMS[name][2]
    bucket = bisect.bisect_left(bounds, value)  # the first bound >= value (`le`)
    key = (name, values)
    with _counting:
        series = _observed.get(key)
        if series is None:
            series = _observed[key] = [0.0] * (2 * len(bounds) + 2)
        series[bucket] += count
        series[len(bounds) + 1 + bucket] += value * count


class _Series(Collector):
    """Every counter and histogram of this process, as metric families at scrape time."""

    def collect(self) -> Iterator[CounterMetricFamily | HistogramMetricFamily]:
        with _counting:
            counts = sorted(_counts.items())
            observed = sorted((key, list(series)) for key, series in _observed.items())
        for name, (doc, labels) in _COUNTERS.items():
            counter = CounterMetricFamily(name, doc, labels=labels)
            for (of, values), total in counts:
                if of == name:
                    counter.add_metric(values, total)
            yield counter
        for name, (doc, labels, bounds) in _HISTOGRAMS.items():
            histogram = HistogramMetricFamily(name, doc, labels=labels)
            edges = [repr(float(b)) for b in bounds] + ["+Inf"]  # as `le` is written
            for (of, values), series in observed:
                if of == name:
                    cumulative = list(itertools.accumulate(series[:len(edges)]))
                    histogram.add_metric(values, list(zip(edges, cumulative, strict=True)),
                                         sum_value=sum(series[len(edges):]))
            yield histogram


REGISTRY.register(_Series())


def accepted(etype: str, kind: str, seconds: float, count: int = 1) -> None:
    """`count` new messages accepted, each `seconds` after it was sent (one commit)."""
    _count("corral_messages_accepted", (etype, kind), count)
    _observe("corral_accept_seconds", (etype,), seconds, count)


def duplicate(etype: str, kind: str, count: int = 1) -> None:
    _count("corral_messages_duplicate", (etype, kind), count)


def rejected(etype: str, reason: str) -> None:
    _count("corral_messages_rejected", (etype, reason))


def applied(etype: str) -> None:
    _count("corral_messages_applied", (etype,))


def activated(etype: str) -> None:
    _count("corral_activations", (etype,))


def passivated(etype: str) -> None:
    _count("corral_passivations", (etype,))


def snapshotted(etype: str) -> None:
    _count("corral_snapshots", (etype,))


def continued(etype: str) -> None:
    _count("corral_continue_as_new", (etype,))


def dead_lettered(etype: str) -> None:
    _count("corral_dead_letters", (etype,))


def timer_fired(etype: str) -> None:
    _count("corral_timers_fired", (etype,))


def schedule_fired(etype: str, outcome: str, late: float | None) -> None:
    """A schedule tick fired with `outcome`, `late` seconds past its time (None: a
    trigger or backfill, which has no lateness)."""
    _count("corral_schedule_ticks_fired", (etype, outcome))
    if late is not None:
        _observe("corral_schedule_lateness_seconds", (etype,), max(late, 0.0))


def schedule_skipped(etype: str, reason: str, count: int) -> None:
    _count("corral_schedule_ticks_skipped", (etype, reason), count)


def suspended(etype: str) -> None:
    """A run's `run()` raised (or its activation failed to build): it is suspended."""
    _count("corral_run_suspensions", (etype,))


STEP_LABELS = 100
"""At most this many (entity type, step) pairs label the step series of a process."""
OTHER_STEPS = "(other)"
"""The `step` label of the steps past `STEP_LABELS` (a step named "(other)" is counted
with them)."""

_step_labels: set[tuple[str, str]] = set()  # the pairs named so far (under `_counting`)


def step_label(etype: str, name: str) -> str:
    """The `step` label of step `name` of `etype`: its name up to its first ":", while
    fewer than `STEP_LABELS` pairs are named, else `OTHER_STEPS` for a pair not named
    yet."""
    label = name.split(":", 1)[0]
    with _counting:
        if (etype, label) in _step_labels:
            return label
        if len(_step_labels) < STEP_LABELS:
            _step_labels.add((etype, label))
            return label
    return OTHER_STEPS


def step_attempted(etype: str, name: str, seconds: float) -> None:
    """An attempt of step `name` took `seconds` (it succeeded or raised)."""
    label = step_label(etype, name)
    _count("corral_step_attempts", (etype, label))
    _observe("corral_step_seconds", (etype, label), seconds)


def step_failed(etype: str, name: str) -> None:
    """Step `name` failed for good: its last attempt failed."""
    _count("corral_step_failures", (etype, step_label(etype, name)))


def batch(store: str, ops: int) -> None:
    """One group-commit transaction of `ops` write ops."""
    _observe("corral_group_commit_ops", (store,), ops)


# -- gauges, read at scrape time from whatever hosts this process runs ----------------

ResidentSource = Callable[[], Iterator[tuple[str, int, int]]]
"""Yields (entity_type, resident entities, mailbox depth) for what a host holds."""

_sources: weakref.WeakSet[Any] = weakref.WeakSet()

HOST_UP = "corral_host_up"
"""The series saying which hosts' series a scrape holds (see the module docstring)."""


def track_residents(host: Any) -> None:
    """Count `host`'s resident entities at every scrape while it lives, and report it up
    (`host` has an `owner` id, a `residents()` method yielding (entity_type, entities,
    mailbox depth), and a `suspended()` method yielding (entity_type, suspended runs))."""
    _sources.add(host)


def untrack_residents(host: Any) -> None:
    """Stop counting `host` (it is closing: no longer up)."""
    _sources.discard(host)


class _Residents(Collector):
    def collect(self) -> Iterator[GaugeMetricFamily]:
        entities = GaugeMetricFamily("corral_resident_entities", "Entities in memory.",
                                     labels=["entity_type"])
        depth = GaugeMetricFamily("corral_mailbox_depth", "Mailbox payloads waiting for "
                                  "run().", labels=["entity_type"])
        held = GaugeMetricFamily("corral_suspended_entities", "Runs suspended (run() raised, "
                                 "or the activation failed to build) held by this process.",
                                 labels=["entity_type"])
        up = GaugeMetricFamily(HOST_UP, "1 for each host whose series are in this scrape "
                               "(on Ray 0 for a host actor that did not answer the pull).",
                               labels=["host"])
        totals: dict[str, list[int]] = {}
        suspended: dict[str, int] = {}
        for host in sorted(_sources, key=lambda h: str(h.owner)):
            up.add_metric([str(host.owner)], 1)
            for etype, count, waiting in host.residents():
                t = totals.setdefault(etype, [0, 0])
                t[0] += count
                t[1] += waiting
            for etype, count in host.suspended():
                suspended[etype] = suspended.get(etype, 0) + count
        for etype, (count, waiting) in sorted(totals.items()):
            entities.add_metric([etype], count)
            depth.add_metric([etype], waiting)
        for etype, count in sorted(suspended.items()):
            held.add_metric([etype], count)
        yield entities
        yield depth
        yield held
        yield up


REGISTRY.register(_Residents())


# -- exporting -------------------------------------------------------------------------

_served: dict[tuple[str, int], Any] = {}
_lock = threading.Lock()


def serve(port: int, addr: str = "127.0.0.1") -> int:
    """Serve `REGISTRY` at `http://addr:port/metrics` from a daemon thread (once per
    address); returns the port (pass 0 for a free one)."""
    with _lock:
        server, _ = start_http_server(port, addr, registry=REGISTRY)
        bound = int(server.server_address[1])
        _served[(addr, bound)] = server
        return bound


def exposition(families: Iterable[Metric] | None = None) -> bytes:
    """The Prometheus text exposition of `families` (default: every series of this
    process, `REGISTRY`)."""
    if families is None:
        return generate_latest(REGISTRY)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(families)))
    return generate_latest(registry)


def merge(*sources: Iterable[Metric]) -> list[Metric]:
    """The metric families of several sources as one list, each name once (a scrape
    must not repeat a family): the samples of a name, in the order of the sources.
    Samples are assumed told apart by their labels (a `host` label, say)."""
    merged: dict[str, Metric] = {}
    for source in sources:
        for family in source:
            into = merged.get(family.name)
            if into is None:
                into = merged[family.name] = Metric(family.name, family.documentation,
                                                    family.type, family.unit)
            into.samples.extend(family.samples)
    return list(merged.values())


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families
