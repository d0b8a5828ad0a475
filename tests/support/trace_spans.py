"""The OpenTelemetry SDK with its in-memory exporter, as a traced application sets it up.

The global tracer provider can be set once per process, so it is set once, by the
first test that asks, and samples only while a test records (`recording`): the tests
that run after it in the session trace nothing (every span is dropped, unsampled).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind
from opentelemetry.util.types import Attributes

_EXPORTER = InMemorySpanExporter()


class _WhileRecording(Sampler):
    on = False

    def should_sample(self, parent_context: Context | None, trace_id: int, name: str,
                      kind: SpanKind | None = None, attributes: Attributes = None,
                      links: Sequence[Link] | None = None, trace_state: Any = None
                      ) -> SamplingResult:
        return SamplingResult(Decision.RECORD_AND_SAMPLE if self.on else Decision.DROP,
                              attributes)

    def get_description(self) -> str:
        return "while a test records"


_SAMPLER = _WhileRecording()


@contextmanager
def recording() -> Iterator[InMemorySpanExporter]:
    """Record every span ended in this process while inside (the exporter holds them)."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider(sampler=_SAMPLER)
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    _SAMPLER.on = True
    try:
        yield _EXPORTER
    finally:
        _SAMPLER.on = False
        _EXPORTER.clear()


@contextmanager
def dropping() -> Iterator[None]:
    """Inside `recording`: the sampler drops every span started inside (each records
    nothing, as a trace sampled out does)."""
    _SAMPLER.on = False
    try:
        yield
    finally:
        _SAMPLER.on = True


def named(spans: Sequence[ReadableSpan], prefix: str) -> list[ReadableSpan]:
    """The spans whose name starts with `prefix`, by start time."""
    return sorted((s for s in spans if s.name.startswith(prefix)),
                  key=lambda s: s.start_time or 0)


def parent_of(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def span_id(span: ReadableSpan) -> int:
    context = span.get_span_context()
    assert context is not None
    return context.span_id


def trace_id(span: ReadableSpan) -> int:
    context = span.get_span_context()
    assert context is not None
    return context.trace_id
