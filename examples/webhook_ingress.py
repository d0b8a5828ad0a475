"""A signed-webhook HTTP endpoint in front of corral entities (Starlette, uvicorn, Ray Serve).

Run it:

    .venv/bin/python examples/webhook_ingress.py           # uvicorn, local runtime
    .venv/bin/python examples/webhook_ingress.py --serve   # 2 Ray Serve replicas, Ray backend

Either way it starts the endpoint on a free 127.0.0.1 port with a SQLite store in a
temporary directory, posts a few webhooks as a provider would (one of them retried, one
with a forged signature, one with a broken body), prints what each got, and exits.

What the endpoint does with a `POST /webhooks/tickets`, in this order:

1. Authenticates the raw bytes. The provider signs `<timestamp>.<body>` with a shared
   secret and sends `X-Webhook-Timestamp: <unix seconds>` and
   `X-Signature: sha256=<hex HMAC-SHA256>`, as Stripe and Slack do. The digest is
   compared with `hmac.compare_digest`, and a timestamp more than five minutes off is
   refused, so a captured request cannot be replayed later (within those five minutes
   a replay is just a duplicate: see 3). Anything wrong: 401, nothing stored.
2. Validates the body against `WebhookEvent` (pydantic). Invalid: 422 with the
   validation errors, nothing stored.
3. Makes the one corral call, `signal_with_start`, with the provider's event id as the
   `message_id`: the ticket is started if it is not running, and a retried delivery is
   answered `duplicate` by corral and never applied twice.
4. Answers 200 only after that call returned, that is after the message is committed:
   `{"status": "accepted" | "duplicate", "seq": ..., "run_id": ..., ...}`. A provider
   retries anything that is not 2xx, so a crash before the answer costs a retry, which
   is a duplicate, never a lost or doubled reply.
5. Answers 429 with `Retry-After` when the ticket is overloaded: `Ticket.max_backlog`
   replies are accepted but not yet applied (`corral.EntityOverloadedError`, nothing
   stored). Providers retry a 429 after the delay, with the same event id.

Each request runs in its OpenTelemetry server span (`TRACED`: OpenTelemetry's ASGI
middleware, continuing the caller's W3C `traceparent` header), so when the application
configured a tracer provider, corral's accept span is a child of the request's and the
trace goes on to the handler that applies the reply (docs/guides/tracing.md); without
one, the middleware and corral trace nothing.

The same Starlette app runs under Ray Serve (`serve_deployment`): each replica opens its
own corral client on the Ray backend (`backend="ray"`, same store and namespace) in the
app's lifespan, and every replica reaches the same host actors, so duplicates are
caught whichever replica each delivery lands on. The corral deployment is declared
beforehand, with `corral deploy --namespace helpdesk --app webhook_ingress:Ticket
--store URL --runtime-env '{"working_dir": "examples"}'`: a replica is a client, which
never starts, changes or stops a host.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import hmac
import math
import os
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
from pydantic import AwareDatetime, BaseModel, Field, ValidationError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import corral

# -- the entity ---------------------------------------------------------------------------


class TicketInput(BaseModel):
    tenant: str


class Reply(BaseModel):
    message_id: str  # kept to show what was applied; deduplication is corral's
    body: str
    at: datetime


class Ticket(corral.Entity):
    """A support ticket: buffers every customer reply it is sent, once each."""

    max_backlog = 1_000  # replies accepted but not applied: past it, senders get a 429

    replies: list[Reply]  # state: snapshots encode it through pydantic

    def __init__(self, init: TicketInput) -> None:
        self.tenant = init.tenant
        self.replies = []

    @corral.signal
    def customer_reply(self, reply: Reply) -> None:
        self.replies.append(reply)  # buffer only (an agent's run() would answer them)

    @corral.query
    def applied(self) -> list[str]:
        """The message ids applied, in the order they were applied."""
        return [r.message_id for r in self.replies]


# -- what the provider sends --------------------------------------------------------------


class WebhookEvent(BaseModel):
    """The body of a "customer replied" webhook, validated before anything is stored."""

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")  # the provider's id
    ticket_id: int = Field(ge=1, le=10**12)
    tenant: str = Field(min_length=1, max_length=64)
    body: str = Field(max_length=10_000)
    at: AwareDatetime  # the provider's timestamp


SIGNATURE_HEADER = "X-Signature"
TIMESTAMP_HEADER = "X-Webhook-Timestamp"
TOLERANCE = 300.0
"""Seconds a request's timestamp may be off from this server's clock."""
MAX_BODY_BYTES = 64 * 1024


def sign(secret: bytes, body: bytes, *, timestamp: int | None = None) -> dict[str, str]:
    """The headers a provider sends with `body` (what a test or a sender calls)."""
    ts = str(int(time.time()) if timestamp is None else timestamp)
    digest = hmac.new(secret, ts.encode() + b"." + body, hashlib.sha256).hexdigest()
    return {TIMESTAMP_HEADER: ts, SIGNATURE_HEADER: f"sha256={digest}"}


def verify(secret: bytes, body: bytes, headers: Mapping[str, str], *, now: float,
           tolerance: float = TOLERANCE) -> str | None:
    """Why this request is not authentic, or None when it is."""
    ts, signature = headers.get(TIMESTAMP_HEADER), headers.get(SIGNATURE_HEADER)
    if ts is None or signature is None:
        return "missing signature"
    if not (ts.isascii() and ts.isdigit() and len(ts) <= 12):
        return "malformed timestamp"
    if abs(now - int(ts)) > tolerance:
        return "timestamp outside the tolerance"
    scheme, _, given = signature.partition("=")
    expected = hmac.new(secret, ts.encode() + b"." + body, hashlib.sha256).hexdigest()
    # Headers arrive decoded as latin-1; compare bytes (compare_digest refuses non-ASCII
    # str) in constant time.
    if scheme != "sha256" or not hmac.compare_digest(expected.encode(),
                                                     given.encode("latin-1")):
        return "bad signature"
    return None


# -- the endpoint -------------------------------------------------------------------------


async def deliver(rt: corral.Runtime, event: WebhookEvent) -> corral.Ack:
    """The one corral call: start the ticket if needed and deliver, atomically, once."""
    return await rt.ref(Ticket, f"ticket-{event.ticket_id}").signal_with_start(
        Ticket.customer_reply, Reply(message_id=event.id, body=event.body, at=event.at),
        start=TicketInput(tenant=event.tenant),  # sent every time, used only to start
        message_id=event.id,  # a retried delivery is a duplicate
    )


RuntimeOpener = Callable[[], AbstractAsyncContextManager[corral.Runtime]]

TRACED = [Middleware(OpenTelemetryMiddleware, exclude_spans=["receive", "send"])]
"""The request's server span, the parent of corral's accept span: OpenTelemetry's ASGI
middleware (the `examples` extra), which continues the caller's `traceparent` header
(one span a request: not one for each ASGI message it receives or sends)."""


def create_app(runtime: corral.Runtime | RuntimeOpener, *, secret: bytes,
               tolerance: float = TOLERANCE, served_by: str | None = None) -> Starlette:
    """The webhook endpoint, `POST /webhooks/tickets`, as a Starlette app.

    Args:
        runtime: an open runtime (the caller closes it), or a function opening one,
            which the app enters for its lifespan (how a Serve replica gets its own).
        secret: the secret shared with the provider.
        tolerance: seconds a request's timestamp may be off.
        served_by: if given, sent back as `X-Served-By` (which replica answered).
    """
    current: list[corral.Runtime] = []

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if isinstance(runtime, corral.Runtime):
            current.append(runtime)
            yield
            return
        async with runtime() as rt:
            current.append(rt)
            yield

    async def receive(request: Request) -> JSONResponse:
        extra = {"X-Served-By": served_by} if served_by else None
        body = await _read_body(request)
        if body is None:
            return JSONResponse({"error": "body too large"}, 413, headers=extra)
        problem = verify(secret, body, request.headers, now=time.time(), tolerance=tolerance)
        if problem is not None:
            return JSONResponse({"error": problem}, 401, headers=extra)
        try:
            event = WebhookEvent.model_validate_json(body)
        except ValidationError as err:
            detail = err.errors(include_url=False, include_context=False, include_input=False)
            return JSONResponse({"error": "invalid body", "detail": detail}, 422, headers=extra)
        try:
            ack = await deliver(current[0], event)
        except corral.IdempotencyConflictError:  # the same id with another body
            return JSONResponse({"error": f"event {event.id} was sent with another body"},
                                409, headers=extra)
        except corral.StoreUnavailableError:  # maybe committed: the retry (same id) tells
            return JSONResponse({"error": "store unavailable"}, 503, headers=extra)
        except corral.EntityOverloadedError as err:  # nothing stored: retry later
            return JSONResponse({"error": f"ticket-{event.ticket_id} is overloaded"}, 429,
                                headers={**(extra or {}),
                                         "Retry-After": str(math.ceil(err.retry_after))})
        return JSONResponse({
            "status": ack.status, "seq": ack.seq, "run_id": ack.run_id,
            "started": ack.started, "ticket": f"ticket-{event.ticket_id}",
            "message_id": event.id,
        }, headers=extra)

    return Starlette(routes=[Route("/webhooks/tickets", receive, methods=["POST"])],
                     lifespan=lifespan, middleware=TRACED)


async def _read_body(request: Request) -> bytes | None:
    """The raw body (the signature covers these bytes), or None past MAX_BODY_BYTES."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


# -- hosting it: uvicorn in this process, or Ray Serve -------------------------------------


class _Server(uvicorn.Server):
    """uvicorn's server, with an event set once it listens."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.listening = asyncio.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self.listening.set()


@contextlib.asynccontextmanager
async def serve_http(app: Starlette) -> AsyncIterator[str]:
    """Run `app` under uvicorn in this event loop on a free 127.0.0.1 port; yields its URL.

    The socket is bound here (port 0: the kernel picks a free one), so no other program
    can take the port between choosing and binding it.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = _Server(uvicorn.Config(app, lifespan="on", log_config=None, access_log=False,
                                    ws="none", timeout_graceful_shutdown=5))

    async def serve() -> None:
        try:
            await server.serve(sockets=[sock])
        except SystemExit as exit_:  # uvicorn's way to report a failed startup
            raise RuntimeError("the webhook server failed to start") from exit_

    task = asyncio.create_task(serve())
    try:
        listening = asyncio.create_task(server.listening.wait())
        await asyncio.wait({task, listening}, return_when=asyncio.FIRST_COMPLETED)
        listening.cancel()
        if task.done():
            task.result()  # raises why it stopped
            raise RuntimeError("the webhook server stopped before it listened")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()


def serve_deployment(store: str, *, secret: bytes, namespace: str = "helpdesk",
                     shards: int = 16, replicas: int = 2,
                     runtime_env: Mapping[str, Any] | None = None,
                     max_ongoing_requests: int = 100, **options: Any) -> Any:
    """The same app as a Ray Serve application of `replicas` replicas (bind it with
    `serve.run`). Each replica opens its own client on corral's Ray backend, to the
    deployment that `corral deploy` declared beforehand in `namespace`.

    Args:
        store: the store every replica and shard actor opens (an absolute SQLite path on
            one machine, or a PostgreSQL URL).
        secret: the provider's secret (in production, read it from your secret store
            in the replica rather than shipping it in the deployment's arguments).
        namespace: the corral deployment whose host actors the replicas call (declared
            with `corral deploy`; the replicas never start or stop its hosts).
        shards: the store's shard count (held by the deployment's host actors, one per
            node by default). Every client of the deployment must use the same.
        runtime_env: Ray runtime environment of the replicas (so they can import this
            module; not needed when it is installed). The host actors have the
            release's own (`corral deploy --runtime-env`).
        max_ongoing_requests: per replica. Serve's default is 5; webhook requests spend
            their time waiting for a commit, and more of them in flight share commits.
        options: more `serve.deployment` options (autoscaling, graceful shutdown...).
    """
    from ray import serve

    env = dict(runtime_env) if runtime_env else None

    def build() -> Starlette:  # runs in each replica, at its start
        replica = serve.get_replica_context().replica_id.unique_id
        return create_app(
            lambda: corral.open_runtime(  # a client: its close stops no host
                store, entities=[Ticket], backend="ray", namespace=namespace, shards=shards),
            secret=secret, served_by=f"{replica}@{os.getpid()}")

    actor_options: dict[str, Any] = {"num_cpus": 0}  # I/O bound: leave the CPUs to Ray
    if env:
        actor_options["runtime_env"] = env
    ingress = serve.deployment(
        name="webhook-ingress", num_replicas=replicas,
        max_ongoing_requests=max_ongoing_requests, ray_actor_options=actor_options, **options,
    )(serve.ingress(build)())
    return ingress.bind()


# -- the demo -----------------------------------------------------------------------------


@dataclass
class Report:
    answers: list[tuple[str, int, dict[str, Any]]] = field(default_factory=list)
    applied: dict[str, list[str]] = field(default_factory=dict)


DEMO_SECRET = b"whsec-demo-not-a-secret"


def demo_deliveries(secret: bytes) -> list[tuple[str, bytes, dict[str, str]]]:
    """What the demo provider posts: (what it is, body, headers)."""
    def event(mid: str, ticket: int, text: str) -> bytes:
        return WebhookEvent(id=mid, ticket_id=ticket, tenant="acme", body=text,
                            at=datetime.now(timezone.utc)).model_dump_json().encode()

    first, second = event("wh-1", 9104, "It still fails"), event("wh-2", 9104, "Any news?")
    other = event("wh-3", 9105, "Thanks!")
    forged = event("wh-4", 9104, "Refund me")
    broken = b'{"id": "wh-5", "ticket_id": 9104, "tenant": "acme"}'
    return [
        ("wh-1, ticket 9104", first, sign(secret, first)),
        ("wh-1 again (a provider retry)", first, sign(secret, first)),
        ("wh-2, ticket 9104", second, sign(secret, second)),
        ("wh-3, ticket 9105", other, sign(secret, other)),
        ("wh-4 signed with a wrong secret", forged, sign(b"guess", forged)),
        ("wh-5 without body and at", broken, sign(secret, broken)),
    ]


async def post_demo(url: str, rt: corral.Runtime, secret: bytes) -> Report:
    """Post the demo's deliveries one after another, then read what each ticket applied."""
    report = Report()
    async with httpx.AsyncClient(base_url=url) as client:
        for what, body, headers in demo_deliveries(secret):
            answer = await client.post("/webhooks/tickets", content=body, headers=headers)
            report.answers.append((what, answer.status_code, answer.json()))
    for key in ("ticket-9104", "ticket-9105"):
        report.applied[key] = await rt.ref(Ticket, key).query(Ticket.applied)
    return report


def print_report(report: Report) -> None:
    for what, code, answer in report.answers:
        if code == 200:
            told = (f"{answer['status']} (seq {answer['seq']}, run {answer['run_id']}"
                    f"{', started the ticket' if answer['started'] else ''})")
        elif code == 422:
            told = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}"
                             for e in answer["detail"])
        else:
            told = answer["error"]
        print(f"{what:<34} -> {code} {told}")
    for key, ids in report.applied.items():
        print(f"{key} applied {ids}")


async def main(workdir: Path) -> Report:
    """The demo on uvicorn in this process, with the local runtime."""
    async with corral.open_runtime(str(workdir / "webhooks.db"), entities=[Ticket]) as rt, \
            serve_http(create_app(rt, secret=DEMO_SECRET)) as url:
        report = await post_demo(url, rt, DEMO_SECRET)
    print_report(report)
    return report


def main_on_serve(workdir: Path) -> Report:
    """The demo on two Ray Serve replicas and corral's Ray backend (starts Ray locally)."""
    import ray
    from ray import serve

    store, namespace = str(workdir / "webhooks.db"), "webhook-demo"
    with socket.socket() as probe:  # Serve binds the port itself: pick a free one
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=False)
    try:
        # The deployment first (what `corral deploy` does), from this file's directory:
        # its hosts import `webhook_ingress:Ticket` by name.
        corral.runtime.deploy(namespace, app="webhook_ingress:Ticket", store=store,
                              runtime_env={"working_dir": str(Path(__file__).parent)},
                              shards=16)
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(serve_deployment(store, secret=DEMO_SECRET, namespace=namespace),
                  name="webhooks", route_prefix="/")

        async def post() -> Report:
            async with corral.open_runtime(store, entities=[Ticket], backend="ray",
                                           namespace=namespace, shards=16) as rt:
                return await post_demo(f"http://127.0.0.1:{port}", rt, DEMO_SECRET)

        report = asyncio.run(post())
        serve.shutdown()  # type: ignore[no-untyped-call]
        corral.runtime.stop_ray_hosts(namespace)
    finally:
        ray.shutdown()
    print_report(report)
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve", action="store_true",
                        help="run on two Ray Serve replicas and corral's Ray backend")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="corral-webhooks-") as tmp:
        if args.serve:
            main_on_serve(Path(tmp))
        else:
            asyncio.run(main(Path(tmp)))
