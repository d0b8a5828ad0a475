"""The webhook ingress example (`examples/webhook_ingress.py`) on uvicorn and the local
runtime, over real HTTP on 127.0.0.1: signed deliveries are applied once each, and
forged or broken ones are refused with nothing stored; a traced delivery's trace runs
from its HTTP request's span through corral's accept and apply."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

import corral
from procs import wait_until
from stores import sql
from trace_spans import named, parent_of, recording, span_id, trace_id
from webhook_traffic import (
    BROKEN,
    EXAMPLES,
    PATH,
    SECRET,
    applied_by_ticket,
    burst,
    check_burst,
    check_store,
    event_body,
    load_example,
    post_all,
)


@pytest.fixture(scope="module")
def example() -> ModuleType:
    return load_example()


@contextlib.asynccontextmanager
async def endpoint(example: ModuleType, store: str) -> AsyncIterator[tuple[str, corral.Runtime]]:
    """The example's app on uvicorn, on a runtime this test holds too; yields (url, rt)."""
    async with corral.open_runtime(store, entities=[example.Ticket]) as rt, \
            example.serve_http(example.create_app(rt, secret=SECRET)) as url:
        yield url, rt


async def test_200_concurrent_webhooks_for_20_tickets_apply_each_event_once(
    example: ModuleType, db_path: str,
) -> None:
    deliveries = burst(example, posts=200, tickets=20, distinct=120, forged=10, invalid=10)
    async with endpoint(example, db_path) as (url, rt):
        replies = await post_all(url, deliveries)
        tickets = {d.ticket for d in deliveries if d.expect == 200}
        applied = await applied_by_ticket(rt, example, tickets)
    assert len(tickets) == 20
    check_burst(deliveries, replies, applied, db_path)


CALLER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"  # the provider's span


async def test_a_traced_delivery_is_one_trace_from_the_http_request_to_the_apply(
    example: ModuleType, db_path: str,
) -> None:
    """The request's server span (the middleware's) continues the provider's
    `traceparent` header, corral's accept span is its child, the apply its grandchild."""
    body = event_body("evt-traced", 11)
    with recording() as spans:
        async with endpoint(example, db_path) as (url, _), httpx.AsyncClient() as client:
            answer = await client.post(url + PATH, content=body, headers={
                **example.sign(SECRET, body), "traceparent": CALLER})
            assert answer.status_code == 200, answer.text
            await wait_until(lambda: bool(named(spans.get_finished_spans(),
                                                "corral apply Ticket.customer_reply")),
                             "the reply is applied")
        got = spans.get_finished_spans()
    [request] = named(got, f"POST {PATH}")
    [accept] = named(got, "corral accept Ticket.customer_reply")
    [apply] = named(got, "corral apply Ticket.customer_reply")
    assert {trace_id(s) for s in got} == {int(CALLER.split("-")[1], 16)}
    assert parent_of(request) == int(CALLER.split("-")[2], 16)
    assert parent_of(accept) == span_id(request)
    assert parent_of(apply) == span_id(accept)
    assert request.attributes is not None
    assert request.attributes["http.status_code"] == 200
    assert len(got) == 3  # one span a request: not one per ASGI message


async def test_a_request_not_signed_now_with_the_secret_gets_401_and_stores_nothing(
    example: ModuleType, db_path: str,
) -> None:
    body, now = event_body("evt-1", 7), int(time.time())
    good = example.sign(SECRET, body)
    sig, ts = example.SIGNATURE_HEADER, example.TIMESTAMP_HEADER
    cases: list[tuple[str, bytes, dict[str, Any]]] = [
        ("bad signature", body, example.sign(b"not-the-secret", body)),
        ("bad signature", body.replace(b"hello", b"HELLO"), good),  # tampered body
        ("bad signature", body, {**good, sig: good[sig].removeprefix("sha256=")}),
        ("bad signature", body, {**good, sig: good[sig].replace("sha256=", "sha1=")}),
        ("bad signature", body, {**good, sig: good[sig][:-1]}),
        ("bad signature", body, {**good, sig: good[sig][:-1].encode() + b"\xe9"}),
        ("bad signature", body, {**good, ts: str(int(good[ts]) - 1)}),  # re-stamped replay
        ("missing signature", body, {ts: good[ts]}),
        ("missing signature", body, {sig: good[sig]}),
        ("malformed timestamp", body, {**good, ts: "-5"}),
        ("malformed timestamp", body, {**good, ts: "1.5e9"}),
        ("timestamp outside the tolerance", body, example.sign(SECRET, body,
                                                               timestamp=now - 3600)),
        ("timestamp outside the tolerance", body, example.sign(SECRET, body,
                                                               timestamp=now + 3600)),
    ]
    # This time the app opens its own runtime, in its lifespan, as a Serve replica does.
    app = example.create_app(lambda: corral.open_runtime(db_path, entities=[example.Ticket]),
                             secret=SECRET)
    async with example.serve_http(app) as url, httpx.AsyncClient(base_url=url) as client:
        for why, content, headers in cases:
            reply = await client.post(PATH, content=content, headers=headers)
            assert (reply.status_code, reply.json()) == (401, {"error": why}), headers
        check_store(db_path, accepted=set(), tickets=set())
        control = await client.post(PATH, content=body, headers=good)
    assert control.status_code == 200, control.text  # the secret and clock are right
    check_store(db_path, accepted={"evt-1"}, tickets={"ticket-7"})


async def test_a_signed_body_that_does_not_fit_the_model_gets_422_and_stores_nothing(
    example: ModuleType, db_path: str,
) -> None:
    cases: list[tuple[bytes, list[list[Any]]]] = [
        (b"not json at all", [[]]),
        (b"[1, 2]", [[]]),
        *[(event_body("evt-1", 7, **fault), [[next(iter(fault))]]) for fault in BROKEN],
        (event_body("evt 1", 7), [["id"]]),
        (event_body("evt-1", 0), [["ticket_id"]]),
        (event_body("evt-1", 7, tenant=None, body=None), [["tenant"], ["body"]]),
    ]
    async with endpoint(example, db_path) as (url, _), \
            httpx.AsyncClient(base_url=url) as client:
        for content, locs in cases:
            reply = await client.post(PATH, content=content,
                                      headers=example.sign(SECRET, content))
            assert reply.status_code == 422, content
            answer = reply.json()
            assert answer["error"] == "invalid body"
            assert [e["loc"] for e in answer["detail"]] == locs, answer
            assert all(e["msg"] for e in answer["detail"])
        huge = event_body("evt-1", 7, "x" * example.MAX_BODY_BYTES)
        reply = await client.post(PATH, content=huge, headers=example.sign(SECRET, huge))
        assert (reply.status_code, reply.json()) == (413, {"error": "body too large"})
        check_store(db_path, accepted=set(), tickets=set())


async def test_an_event_id_sent_again_with_another_body_is_refused_with_409(
    example: ModuleType, db_path: str,
) -> None:
    first, other = event_body("evt-1", 7, "first"), event_body("evt-1", 7, "other")
    async with endpoint(example, db_path) as (url, rt), \
            httpx.AsyncClient(base_url=url) as client:
        reply = await client.post(PATH, content=first, headers=example.sign(SECRET, first))
        assert reply.json() == {"status": "accepted", "seq": 1, "run_id": 1, "started": True,
                                "ticket": "ticket-7", "message_id": "evt-1"}
        refused = await client.post(PATH, content=other, headers=example.sign(SECRET, other))
        assert refused.status_code == 409
        assert refused.json() == {"error": "event evt-1 was sent with another body"}
        again = await client.post(PATH, content=first, headers=example.sign(SECRET, first))
        assert again.json()["status"] == "duplicate"
        applied = await rt.ref(example.Ticket, "ticket-7").query(example.Ticket.applied)
    assert applied == ["evt-1"]
    check_store(db_path, accepted={"evt-1"}, tickets={"ticket-7"})


async def test_the_endpoint_answers_only_once_the_message_is_committed(
    example: ModuleType, tmp_path: Path,
) -> None:
    """While another connection holds the SQLite file's write lock, nothing can commit:
    the endpoint must not answer until the lock is gone and the message is stored."""
    store, body = str(tmp_path / "tickets.db"), event_body("evt-1", 7)
    async with endpoint(example, store) as (url, _), \
            httpx.AsyncClient(base_url=url, timeout=60) as client:
        blocker = sqlite3.connect(store, isolation_level=None)
        try:
            blocker.execute("BEGIN IMMEDIATE")  # corral's writer now waits (busy_timeout)
            post = asyncio.ensure_future(
                client.post(PATH, content=body, headers=example.sign(SECRET, body)))
            done, _ = await asyncio.wait({post}, timeout=0.5)
            assert not done, "answered before the message could be committed"
            assert sql(store, "SELECT count(*) FROM dedupe") == [(0,)]
            blocker.execute("ROLLBACK")
        finally:
            blocker.close()
        reply = await post
    assert (reply.status_code, reply.json()["status"]) == (200, "accepted")
    check_store(store, accepted={"evt-1"}, tickets={"ticket-7"})


def test_the_example_runs_as_a_script_and_says_what_each_delivery_got(tmp_path: Path) -> None:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    done = subprocess.run([sys.executable, str(Path(EXAMPLES) / "webhook_ingress.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split("-> ")[1] for line in lines[:6]] == [
        "200 accepted (seq 1, run 1, started the ticket)",
        "200 duplicate (seq 1, run 1)",
        "200 accepted (seq 2, run 1)",
        "200 accepted (seq 1, run 1, started the ticket)",
        "401 bad signature",
        "422 body: Field required; at: Field required",
    ]
    assert lines[6:] == ["ticket-9104 applied ['wh-1', 'wh-2']",
                         "ticket-9105 applied ['wh-3']"]
    assert not list(tmp_path.iterdir())  # its store lived in a temporary directory


async def test_an_overloaded_ticket_answers_429_with_retry_after_and_stores_nothing(
    example: ModuleType, db_path: str,
) -> None:
    """Web workers are pure clients: with no host applying, a ticket's backlog fills up
    to `Ticket.max_backlog`, then a delivery gets 429 and a retry once it drained, 200."""
    bound = example.Ticket.max_backlog
    start, key = example.TicketInput(tenant="acme"), "ticket-7"
    async with corral.open_runtime(db_path, entities=[example.Ticket], host=False) as rt, \
            example.serve_http(example.create_app(rt, secret=SECRET)) as url, \
            httpx.AsyncClient(base_url=url) as client:
        ref = rt.ref(example.Ticket, key)
        reply = example.Reply(message_id="r", body="b", at="2026-01-01T00:00:00Z")
        await asyncio.gather(*(ref.signal_with_start(example.Ticket.customer_reply, reply,
                                                     start=start, message_id=f"fill-{n}")
                               for n in range(bound)))
        body = event_body("evt-over", 7)
        refused = await client.post(PATH, content=body, headers=example.sign(SECRET, body))
        assert refused.status_code == 429
        assert refused.json() == {"error": "ticket-7 is overloaded"}
        assert int(refused.headers["Retry-After"]) >= 1
        assert sql(db_path, "SELECT count(*) FROM dedupe WHERE message_id = 'evt-over'") == [(0,)]
        async with corral.open_runtime(db_path, entities=[example.Ticket]) as host:
            applied = await host.ref(example.Ticket, key).query(example.Ticket.applied)
            assert len(applied) == bound
            codes: list[int] = []

            async def retried() -> bool:  # the pure client sees the host's snapshot
                answer = await client.post(PATH, content=body,
                                           headers=example.sign(SECRET, body))
                codes.append(answer.status_code)
                return answer.status_code == 200

            await wait_until(retried, "the retry accepted once the backlog drained")
    assert set(codes) <= {200, 429}
    assert sql(db_path, "SELECT count(*) FROM dedupe WHERE message_id = 'evt-over'") == [(1,)]
