"""OpenTelemetry traces, when the application configured them (the `otel` extra).

A leaf of the package: the client opens a span for each acceptance and stores its W3C
`traceparent` with the message (the journal row, an outbox row); the host continues
that context where it applies the message, runs a step or sends to another entity. The
context is stored, not held in memory, so the host that applies a message after a crash
and a takeover continues the caller's trace.

Off costs one check. corral never imports OpenTelemetry itself: `tracer()` looks for
`opentelemetry.trace` among the modules already imported (an application that
configured a tracer provider imported it), and asks it for the global provider; with
none set (the API's proxy) tracing stays off and nothing else runs. A provider, once
set, is the process's for good (the API refuses a second), so the tracer is kept.

Per span, corral does no more than the SDK needs (its spans cost the SDK ~10-15 us
apiece, more than a signal costs corral; `benchmarks/tracing.py`): the API's pieces are
imported once (`api()`), a span is made current only where code of the application runs
inside it (a handler, a step: `Current`), its attributes go in at its start, those known
only at its end only when it records, and the W3C traceparent is formatted and parsed
here rather than by the global propagator.

What is stored is what `traceparent_of` formats (as the W3C propagator writes it) from a
span this process started, never a header a caller sent; a text from elsewhere (a Ray
caller's acceptance, a stored row) is checked by `is_traceparent` before it is stored
or used.
"""

from __future__ import annotations

import re
import sys
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer

__all__ = ["Api", "Current", "api", "end", "is_traceparent", "parent_context",
           "traceparent_of", "tracer"]

# W3C Trace Context, version 00: lowercase hex, neither id all zeros.
_TRACEPARENT = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")
_LENGTH = 55


class Api(NamedTuple):
    """The OpenTelemetry API's pieces the traced paths use, imported once (an import
    statement in a function costs ~1 us a call even when the module is loaded)."""

    trace: Any  # the `opentelemetry.trace` module
    context: Any  # the `opentelemetry.context` module
    empty: Context  # an empty context: a span's parent when it starts a trace


_tracer: Tracer | None = None  # set once a real provider is found
_api: Api | None = None


def tracer() -> Tracer | None:
    """corral's tracer, or None when tracing is off (OpenTelemetry not imported, or no
    tracer provider configured): the one check every traced path makes."""
    if _tracer is not None:
        return _tracer
    trace = sys.modules.get("opentelemetry.trace")
    return None if trace is None else _configured(trace)


def api() -> Api:
    """The API's pieces (imported by the first call: only where there is a trace to
    continue, a tracer provider or a stored traceparent)."""
    global _api
    if _api is None:
        from opentelemetry import context, trace
        from opentelemetry.context import Context

        _api = Api(trace, context, Context())
    return _api


def _configured(trace: Any) -> Tracer | None:
    global _tracer
    provider = trace.get_tracer_provider()
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return None
    _tracer = provider.get_tracer("corral")
    return _tracer


def is_traceparent(text: object) -> bool:
    """`text` is a W3C `traceparent` header value of version 00 (what corral stores)."""
    return type(text) is str and len(text) == _LENGTH and \
        _TRACEPARENT.fullmatch(text) is not None


def traceparent_of(span: Span) -> str | None:
    """The `traceparent` of `span`, as the W3C propagator writes it (formatted here
    from the span's own context: the propagator's `inject` costs ~4 us a call, this
    ~1 us). None for a span that is not valid: it has nothing to continue."""
    context = span.get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def parent_context(traceparent: str | None) -> Context:
    """The context to continue from a stored `traceparent` (a remote parent, as the
    propagator's `extract` makes it); an empty one (the span starts a trace) when there
    is none or it is not one. Never the current context: a host's task may have been
    started inside a caller's span, which is not the cause of what it applies."""
    a = api()
    if not is_traceparent(traceparent):
        return a.empty
    assert traceparent is not None
    trace = a.trace
    return trace.set_span_in_context(trace.NonRecordingSpan(trace.SpanContext(  # type: ignore[no-any-return]
        int(traceparent[3:35], 16), int(traceparent[36:52], 16), True,
        trace.TraceFlags(int(traceparent[53:55], 16)))), a.empty)


def end(span: Span, error: BaseException | None = None) -> None:
    """End `span`; `error`, raised by the code inside it, recorded on it first, as the
    API's `use_span` does (an `Exception`: a cancellation or an exit is no error)."""
    if isinstance(error, Exception) and span.is_recording():
        trace = api().trace
        span.record_exception(error)
        span.set_status(trace.Status(trace.StatusCode.ERROR,
                                     f"{type(error).__name__}: {error}"))
    span.end()


class Current:
    """`span` current while the block runs (spans the application starts in it nest
    under it), ended after it; an error raised in it is recorded on it. What the API's
    `use_span` does, without its generator (~3 us less a span)."""

    __slots__ = ("_span", "_token")

    def __init__(self, span: Span) -> None:
        self._span = span
        self._token: object = None

    def __enter__(self) -> Span:
        a = api()
        self._token = a.context.attach(a.trace.set_span_in_context(self._span))
        return self._span

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        api().context.detach(self._token)
        end(self._span, error)
