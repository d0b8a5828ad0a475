"""One webhook's trace, from the HTTP request to the entity it notified (OpenTelemetry).

Run it:

    .venv/bin/python examples/tracing_demo.py            # the trace as a tree
    .venv/bin/python examples/tracing_demo.py --console  # also the SDK's console exporter

It configures the OpenTelemetry SDK (what a traced application does at its start),
serves the webhook endpoint of `webhook_ingress.py` over real HTTP (uvicorn, a SQLite
store in a temporary directory) with an agent in place of its buffering ticket, posts
one signed webhook carrying a `traceparent` header, as a traced provider would, and
prints the spans of that one trace:

- the request's span (OpenTelemetry's ASGI middleware, `webhook_ingress.TRACED`), the
  child of the caller's;
- corral's `accept` span, in it: its traceparent is stored with the journal entry;
- the `apply` span where the host applied the message (its handler), whichever host;
- one `step` span per attempt of the model call, which fails twice and then answers;
- the `send` span of the message the agent sent to the notifier, and the notifier's
  `apply` span, which continues the context stored with that send.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import httpx
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import corral

sys.path.insert(0, str(Path(__file__).resolve().parent))
import webhook_ingress as ingress

CALLER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"  # the provider's span


class Note(BaseModel):
    text: str


class NotifierInput(BaseModel):
    channel: str = "email"


class Notifier(corral.Entity):
    """Tells the customer: keeps each note it is sent."""

    notes: list[str]

    def __init__(self, init: NotifierInput) -> None:
        self.notes = []

    @corral.signal
    def note(self, note: Note) -> None:
        self.notes.append(note.text)

    @corral.query
    def sent(self) -> list[str]:
        return self.notes


_calls: dict[str, int] = {}


def draft_answer(message_id: str, body: str) -> str:
    """The model call: unavailable on its first two attempts for each reply."""
    _calls[message_id] = _calls.get(message_id, 0) + 1
    if _calls[message_id] <= 2:
        raise ConnectionError("model endpoint unavailable (503)")
    return f"We are on it: {body[:40]}"


class TicketAgent(corral.Entity):
    """A support ticket answering each customer reply in `run()`: a model step,
    retried, then a note to the customer's notifier."""

    replies: list[ingress.Reply]
    answered: int

    def __init__(self, init: ingress.TicketInput) -> None:
        self.replies = []
        self.answered = 0

    @corral.signal
    def customer_reply(self, reply: ingress.Reply) -> None:
        self.replies.append(reply)

    async def run(self) -> None:
        retry = corral.RetryPolicy(max_attempts=4, initial_backoff=0.05)
        while True:
            await self.wait_for(lambda: self.answered < len(self.replies))
            reply = self.replies[self.answered]
            text = await self.step(draft_answer, reply.message_id, reply.body,
                                   name=f"draft:{reply.message_id}", retry=retry)
            self.send(Notifier, f"customer-of-{self.key}", Notifier.note, Note(text=text),
                      start=NotifierInput())
            self.answered += 1


def app(rt: corral.Runtime) -> Starlette:
    """The endpoint (`webhook_ingress.create_app`'s, without its signature check): the
    one corral call, in the request's span (the middleware's)."""

    async def receive(request: Request) -> JSONResponse:
        event = ingress.WebhookEvent.model_validate_json(await request.body())
        ack = await rt.ref(TicketAgent, f"ticket-{event.ticket_id}").signal_with_start(
            TicketAgent.customer_reply,
            ingress.Reply(message_id=event.id, body=event.body, at=event.at),
            start=ingress.TicketInput(tenant=event.tenant), message_id=event.id)
        return JSONResponse({"status": ack.status, "seq": ack.seq})

    return Starlette(routes=[Route("/webhooks/tickets", receive, methods=["POST"])],
                     middleware=ingress.TRACED)


def ordered(spans: Sequence[ReadableSpan]) -> list[tuple[int, ReadableSpan]]:
    """(depth, span) of each span, under its parent, siblings in start order."""
    ids = {s.context.span_id for s in spans if s.context is not None}
    children: dict[int | None, list[ReadableSpan]] = {}
    for s in sorted(spans, key=lambda s: s.start_time or 0):
        parent = s.parent.span_id if s.parent is not None else None
        children.setdefault(parent if parent in ids else None, []).append(s)
    rows: list[tuple[int, ReadableSpan]] = []

    def walk(parent: int | None, depth: int) -> None:
        for s in children.get(parent, []):
            rows.append((depth, s))
            assert s.context is not None
            walk(s.context.span_id, depth + 1)
    walk(None, 0)
    return rows


def tree(spans: Sequence[ReadableSpan]) -> list[str]:
    """The spans as an indented tree, children in start order, with a few attributes."""
    lines: list[str] = []
    for depth, s in ordered(spans):
        a = s.attributes or {}
        shown = [f"{k.removeprefix('corral.')}={a[k]!s}" for k in (
            "corral.key", "corral.seq", "corral.step.attempt", "corral.outcome",
            "corral.target_key") if k in a]
        ms = ((s.end_time or 0) - (s.start_time or 0)) / 1e6
        status = "" if s.status.is_ok else f"  ERROR {s.status.description}"
        lines.append(f"{'  ' * depth}{s.name}  [{ms:.1f} ms]  {' '.join(shown)}{status}")
    return lines


async def one_webhook(*, console: bool = False) -> list[ReadableSpan]:
    """Post the one webhook and wait until the notifier applied its note: the spans of
    its trace (the caller's, `CALLER`), as the in-memory exporter got them."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    if console:
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    trace.set_tracer_provider(provider)

    with tempfile.TemporaryDirectory() as tmp:
        async with corral.open_runtime(f"{tmp}/store.db",
                                       entities=[TicketAgent, Notifier]) as rt:
            async with ingress.serve_http(app(rt)) as url, httpx.AsyncClient() as http:
                body = json.dumps({"id": "evt-9104", "ticket_id": 9104, "tenant": "acme",
                                   "body": "The export has been failing since Monday",
                                   "at": datetime.now(timezone.utc).isoformat()})
                answer = await http.post(f"{url}/webhooks/tickets", content=body, headers={
                    "traceparent": CALLER, "content-type": "application/json"})
                answer.raise_for_status()
            notifier = rt.ref(Notifier, "customer-of-ticket-9104")
            while True:
                try:
                    if await notifier.query(Notifier.sent):
                        break
                except corral.CorralError:  # not started yet
                    pass
                await asyncio.sleep(0.05)
    provider.shutdown()
    return [s for s in exporter.get_finished_spans()
            if s.context is not None and f"{s.context.trace_id:032x}" in CALLER]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--console", action="store_true",
                        help="also print every span as the SDK's console exporter does")
    args = parser.parse_args()
    print(f"trace {CALLER.split('-')[1]} (the caller's span: {CALLER.split('-')[2]})")
    print("\n".join(tree(asyncio.run(one_webhook(console=args.console)))))
