"""The client's spans: one for each acceptance, in the caller's trace context.

The span's W3C traceparent goes into the `Acceptance`, which stores it with the journal
entry (`corral._tracing`): the host that applies the message, whichever and whenever,
continues the trace from it (its spans: `runtime.host._traces`). Only called when
tracing is on (`tracer()` is not None).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from corral._tracing import api, end, traceparent_of
from corral.persistence import Acceptance, AcceptResult

from ._requests import SignalBatch

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

    from ._backend import Backend

__all__ = ["accept_batch_traced", "accept_traced"]


async def accept_traced(tracer: Tracer, backend: Backend, acc: Acceptance) -> AcceptResult:
    """Accept `acc` inside its span (a child of the caller's current one; not made
    current itself: nothing of the application's runs inside it)."""
    span = tracer.start_span(f"corral accept {acc.entity_type}.{acc.name or acc.kind.value}",
                             kind=api().trace.SpanKind.PRODUCER, attributes={
                                 "corral.entity_type": acc.entity_type, "corral.key": acc.key,
                                 "corral.message_id": acc.message_id})
    try:
        result: AcceptResult = await backend.handle(acc._replace(trace=traceparent_of(span)))
    except BaseException as err:
        end(span, err)
        raise
    if span.is_recording():  # one by one: cheaper than `set_attributes` for so few
        e = result.entry
        span.set_attribute("corral.run_id", e.run_id)
        span.set_attribute("corral.seq", e.seq)
        if result.duplicate:
            span.set_attribute("corral.duplicate", True)
    span.end()
    return result


async def accept_batch_traced(tracer: Tracer, backend: Backend,
                              accs: Sequence[Acceptance]) -> list[AcceptResult]:
    """Accept a batch (`Runtime.signal_many`) inside one span, the parent of each item's
    application."""
    span = tracer.start_span("corral accept batch", kind=api().trace.SpanKind.PRODUCER,
                             attributes={"corral.batch.size": len(accs)})
    trace = traceparent_of(span)
    try:
        results: list[AcceptResult] = await backend.handle(
            SignalBatch([acc._replace(trace=trace) for acc in accs]))
    except BaseException as err:
        end(span, err)
        raise
    span.set_attribute("corral.batch.duplicates", sum(r.duplicate for r in results))
    span.end()
    return results

