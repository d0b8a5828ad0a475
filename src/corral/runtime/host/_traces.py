"""The host's spans: each message applied, each step attempt, each send, a suspension
(the acceptance's span is the client's: `runtime.client._traces`).

Every span continues a stored context (`corral._tracing`), never this process's current
one, so the same trace continues on whichever host applies a message (after a crash and
a takeover too) and across the entities a message's sends reach:

    accept (caller) -> apply (handler) -> step attempt ... -> [Ray task]
                                       -> send -> apply (the target's handler) -> ...

The activation keeps the span of the last message it applied (`RunContext._cause`):
the cause of what its handlers and `run()` do next. `run()` runs beside the handlers,
so its step attempts and sends are children of the message applied last before them.
A host that does not trace (no tracer provider in its process) makes no span, and keeps
the stored context as the cause: its sends and Ray tasks carry the caller's on.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from corral._tracing import Current, api, parent_context, traceparent_of, tracer
from corral.persistence import JournalEntry, Suspension

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

__all__ = ["applying", "outcome", "send_trace", "step_attempt", "suspended"]


def applying(tracer: Tracer, entry: JournalEntry, *, replaying: bool) -> Current:
    """The span of applying `entry` (its handler's calls, a dead letter), the child of
    the span that accepted it, current while the handler runs (its own spans nest)."""
    attributes: dict[str, Any] = {
        "corral.entity_type": entry.entity_type, "corral.key": entry.key,
        "corral.run_id": entry.run_id, "corral.seq": entry.seq}
    if replaying:
        attributes["corral.replaying"] = True
    return Current(tracer.start_span(
        f"corral apply {entry.entity_type}.{entry.name}", parent_context(entry.trace),
        api().trace.SpanKind.CONSUMER, attributes))


def outcome(span: Span, *, attempts: int, dead_letter: str | None,
            update_error: str | None, suspended: bool) -> None:
    """What became of the applied message, on its span (if it records: a sampler may
    have dropped it)."""
    if not span.is_recording():
        return
    span.set_attribute("corral.attempts", attempts)  # one by one: cheaper for so few
    span.set_attribute("corral.outcome", "dead_lettered" if dead_letter is not None else
                       "update_failed" if update_error is not None else "applied")
    if suspended:
        span.set_attribute("corral.run.suspended", True)
    trace = api().trace
    if dead_letter is not None:
        span.set_status(trace.Status(trace.StatusCode.ERROR,
                                     f"dead-lettered: {dead_letter:.500}"))
    elif update_error is not None:
        span.set_status(trace.Status(trace.StatusCode.ERROR,
                                     f"update failed: {update_error:.500}"))


@contextmanager
def step_attempt(cause: str | None, name: str, attempt: int, key: str, *,
                 on_ray: bool) -> Iterator[str | None]:
    """The span of one attempt of step `name` (child of `cause`, the message applied
    last), current while it runs here; yields its traceparent, which a Ray task
    continues (tracing off here: `cause` itself). A raising attempt's span records the
    error."""
    t = tracer()
    if t is None:
        yield cause
        return
    with Current(t.start_span(f"corral step {name}", parent_context(cause), attributes={
            "corral.step": name, "corral.step.attempt": attempt, "corral.step.key": key,
            "corral.step.ray_task": on_ray})) as span:
        yield traceparent_of(span)


def send_trace(cause: str | None, target_type: str, target_key: str, name: str,
               message_id: str | None) -> str | None:
    """A send's span (child of `cause`), ended at once: what its outbox row stores and
    its acceptance into the target carries on. Tracing off here: `cause` itself, so a
    host without a tracer provider still passes its caller's context on."""
    t = tracer()
    if t is None:
        return cause
    attributes: dict[str, Any] = {"corral.target_type": target_type,
                                  "corral.target_key": target_key, "corral.handler": name}
    if message_id is not None:
        attributes["corral.message_id"] = message_id
    span = t.start_span(f"corral send {target_type}.{name}", parent_context(cause),
                        api().trace.SpanKind.PRODUCER, attributes)
    span.end()
    return traceparent_of(span)


def suspended(cause: str | None, suspension: Suspension) -> None:
    """A span saying the run was suspended (`run()` raised, or the activation could not
    be built), child of `cause`, with the error."""
    t = tracer()
    if t is None:
        return
    trace = api().trace
    span = t.start_span(
        f"corral suspend {suspension.entity_type}", parent_context(cause), attributes={
            "corral.entity_type": suspension.entity_type, "corral.key": suspension.key,
            "corral.run_id": suspension.run_id, "corral.outcome": "suspended",
            "corral.attempts": suspension.attempts})
    span.set_status(trace.Status(trace.StatusCode.ERROR, suspension.error[-500:]))
    span.end()
