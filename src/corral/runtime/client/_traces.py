"""The client's spans: one for each acceptance, in the caller's trace context.

The span's W3C traceparent goes into the `Acceptance`, which stores it with the journal
entry (`corral._tracing`): the host that applies the message, whichever and whenever,
continues the trace from it (its spans: `runtime.host._traces`). Only called when
tracing is on (`tracer()` is not None).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from corral._tracing import traceparent_of
from corral.persistence import Acceptance, AcceptResult

from ._requests import SignalBatch

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

    from ._backend import Backend

__all__ = ["accept_batch_traced", "accept_traced"]


async def accept_traced(tracer: Tracer, backend: Backend, acc: Acceptance) -> AcceptResult:
    """Accept `acc` inside its span (a child of the caller's current one)."""
    from opentelemetry.trace import SpanKind

    what = acc.name or acc.kind.value
    with tracer.start_as_current_span(
            f"corral accept {acc.entity_type}.{what}", kind=SpanKind.PRODUCER,
            attributes=_attributes(acc)) as span:
        result: AcceptResult = await backend.handle(acc._replace(trace=traceparent_of(span)))
        span.set_attributes(_outcome(result))
        return result


async def accept_batch_traced(tracer: Tracer, backend: Backend,
                              accs: Sequence[Acceptance]) -> list[AcceptResult]:
    """Accept a batch (`Runtime.signal_many`) inside one span, the parent of each item's
    application."""
    from opentelemetry.trace import SpanKind

    with tracer.start_as_current_span(
            "corral accept batch", kind=SpanKind.PRODUCER,
            attributes={"corral.batch.size": len(accs)}) as span:
        trace = traceparent_of(span)
        results: list[AcceptResult] = await backend.handle(
            SignalBatch([acc._replace(trace=trace) for acc in accs]))
        span.set_attribute("corral.batch.duplicates", sum(r.duplicate for r in results))
        return results


def _attributes(acc: Acceptance) -> dict[str, Any]:
    # Few: the SDK checks each attribute, ~1 us apiece (the handler is in the name).
    return {"corral.entity_type": acc.entity_type, "corral.key": acc.key,
            "corral.message_id": acc.message_id}


def _outcome(result: AcceptResult) -> dict[str, Any]:
    e = result.entry
    return {"corral.run_id": e.run_id, "corral.seq": e.seq,
            "corral.duplicate": result.duplicate}
