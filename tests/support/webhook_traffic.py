"""Webhook traffic for the ingress example's tests, and what must come of it.

A plain module, like `procs`: `tests/examples/test_webhook_ingress.py` (uvicorn, local runtime)
and `tests/examples/test_webhook_serve.py` (Ray Serve, Ray backend) post the same kind of burst
and check it the same way. The example is imported by its own name, `webhook_ingress`,
from `examples/` (on `sys.path` here, and on the Ray workers' `PYTHONPATH` through
`RUNTIME_ENV`), so Serve replicas and shard actors import the very module the test uses.

"Applied once" is checked on what each ticket says it applied (`Ticket.applied`, in
application order), and "nothing stored" on the store's own tables.
"""

from __future__ import annotations

import asyncio
import collections
import importlib
import json
import random
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx

from ray_workers import TESTS_DIR
from stores import sql

EXAMPLES = str(Path(TESTS_DIR).parents[1] / "examples")
RUNTIME_ENV: dict[str, Any] = {"env_vars": {
    "PYTHONPATH": f"{EXAMPLES}:{TESTS_DIR}", "RAY_AUTH_MODE": "disabled"}}
"""What Serve replicas and shard actors need to import `webhook_ingress` by name."""
SECRET = b"whsec-test-5f2c"
PATH = "/webhooks/tickets"


def load_example() -> ModuleType:
    """`examples/webhook_ingress.py`, imported as `webhook_ingress`."""
    if EXAMPLES not in sys.path:
        sys.path.insert(0, EXAMPLES)
    return importlib.import_module("webhook_ingress")


@dataclass(frozen=True)
class Delivery:
    """One POST: its event id, the ticket key it names, and the status it must get."""

    event_id: str
    ticket: str
    body: bytes
    headers: dict[str, str]
    expect: int


AT = datetime(2026, 1, 1, 9, 30, tzinfo=timezone.utc)
BROKEN: list[dict[str, Any]] = [  # what a validly signed but broken body may get wrong
    {"at": None},  # missing
    {"at": "2026-01-01T09:30:00"},  # no time zone
    {"ticket_id": "ninety-one"},
    {"tenant": ""},
]


def event_body(event_id: str, ticket: int, text: str = "hello", **override: Any) -> bytes:
    """A webhook body as the provider serializes it; `override` a field with None drops it."""
    fields: dict[str, Any] = {"id": event_id, "ticket_id": ticket, "tenant": "acme",
                              "body": text, "at": AT.isoformat()}
    fields.update(override)
    return json.dumps({k: v for k, v in fields.items() if v is not None}).encode()


def burst(example: ModuleType, *, posts: int, tickets: int, distinct: int, forged: int,
          invalid: int, seed: int = 9104) -> list[Delivery]:
    """`posts` signed deliveries of `distinct` events over `tickets` tickets (the rest
    are redeliveries of them, signed again with another timestamp as providers do), plus
    `forged` wrongly signed and `invalid` validly signed but broken ones, shuffled.

    The forged and invalid ones carry fresh event ids; half of them name tickets that
    no good delivery names (ticket ids from 900_000), so nothing may exist for those.
    """
    rng = random.Random(seed)
    events = [(f"evt-{n}", 1 + rng.randrange(tickets)) for n in range(distinct)]
    events[:tickets] = [(f"evt-{n}", 1 + n) for n in range(tickets)]  # every ticket used
    bodies = {mid: event_body(mid, t, f"reply {mid}") for mid, t in events}
    now = int(time.time())
    out = [Delivery(mid, f"ticket-{t}", bodies[mid], example.sign(SECRET, bodies[mid]), 200)
           for mid, t in events]
    for _ in range(posts - distinct):  # a retry: the same body, signed again later
        mid, t = rng.choice(events)
        out.append(Delivery(mid, f"ticket-{t}", bodies[mid], example.sign(
            SECRET, bodies[mid], timestamp=now - rng.randrange(1, 120)), 200))
    for n in range(forged):
        ticket = 900_000 + n if n % 2 else 1 + rng.randrange(tickets)
        body = event_body(f"forged-{n}", ticket)
        out.append(Delivery(f"forged-{n}", f"ticket-{ticket}", body,
                            example.sign(b"not-the-secret", body), 401))
    for n in range(invalid):
        ticket = 900_500 + n if n % 2 else 1 + rng.randrange(tickets)
        body = event_body(f"invalid-{n}", ticket, **BROKEN[n % len(BROKEN)])
        out.append(Delivery(f"invalid-{n}", f"ticket-{ticket}", body,
                            example.sign(SECRET, body), 422))
    rng.shuffle(out)
    return out


async def post_all(url: str, deliveries: list[Delivery]) -> list[httpx.Response]:
    """Post every delivery at once (one connection each), over real HTTP."""
    limits = httpx.Limits(max_connections=len(deliveries), max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60.0) as client:
        return list(await asyncio.gather(*(
            client.post(PATH, content=d.body, headers=d.headers) for d in deliveries)))


async def applied_by_ticket(rt: Any, example: ModuleType, tickets: set[str], *,
                            timeout: float = 15.0) -> dict[str, list[str]]:
    """What each ticket says it applied (all asked at once). A query waits until its
    entity has applied everything accepted before it, so one that does not answer in
    `timeout` seconds is an entity that stopped applying: fail naming it, rather than
    hang until pytest-timeout."""
    async def applied(ticket: str) -> list[str] | None:
        try:
            return list(await asyncio.wait_for(
                rt.ref(example.Ticket, ticket).query(example.Ticket.applied), timeout))
        except asyncio.TimeoutError:  # not the builtin before 3.11
            return None

    keys = sorted(tickets)
    answers = dict(zip(keys, await asyncio.gather(*(applied(t) for t in keys)), strict=True))
    stuck = [t for t, ids in answers.items() if ids is None]
    if stuck:
        described = [await rt.ref(example.Ticket, t).describe() for t in stuck[:3]]
        raise AssertionError(f"{len(stuck)} ticket(s) never answered a query within "
                             f"{timeout} s (accepted but not applied): {stuck}; {described}")
    return {t: ids for t, ids in answers.items() if ids is not None}


def check_burst(deliveries: list[Delivery], replies: list[httpx.Response],
                applied: dict[str, list[str]], store: str) -> None:
    """Every delivery got the status it must; every event was accepted once and answered
    `duplicate` on every redelivery; every ticket applied each of its events exactly
    once, in acceptance order; the store holds nothing of the refused deliveries."""
    codes = [(d.event_id, d.expect, r.status_code, r.text[:200])
             for d, r in zip(deliveries, replies, strict=True)]
    wrong = [c for c in codes if c[1] != c[2]]
    assert not wrong, f"{len(wrong)} deliveries got the wrong status: {wrong[:5]}"
    answers: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for d, r in zip(deliveries, replies, strict=True):
        if d.expect == 200:
            answer = r.json()
            assert (answer["ticket"], answer["message_id"]) == (d.ticket, d.event_id)
            answers[d.event_id].append(answer)
    accepted: dict[str, dict[str, Any]] = {}
    for event_id, got in answers.items():
        statuses = sorted(a["status"] for a in got)
        assert statuses == ["accepted"] + ["duplicate"] * (len(got) - 1), (event_id, got)
        first = next(a for a in got if a["status"] == "accepted")
        assert all((a["seq"], a["run_id"]) == (first["seq"], first["run_id"]) for a in got)
        accepted[event_id] = first
    by_ticket: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for answer in accepted.values():
        by_ticket[answer["ticket"]].append(answer)
    assert set(applied) == set(by_ticket)
    for ticket, acks in by_ticket.items():
        acks.sort(key=lambda a: a["seq"])
        assert [a["seq"] for a in acks] == list(range(1, len(acks) + 1)), ticket
        assert {a["run_id"] for a in acks} == {1}
        assert sum(a["started"] for a in acks) == 1, f"{ticket} started more than once"
        twice = [m for m, n in collections.Counter(applied[ticket]).items() if n > 1]
        assert not twice, f"{ticket} applied {twice} more than once"
        assert applied[ticket] == [a["message_id"] for a in acks], ticket
    check_store(store, accepted=set(accepted), tickets=set(by_ticket))


def check_store(store: str, *, accepted: set[str], tickets: set[str]) -> None:
    """The store holds exactly the accepted events of exactly these tickets."""
    assert {r[0] for r in sql(store, "SELECT message_id FROM dedupe")} == accepted
    journal = [r[0] for r in sql(store, "SELECT message_id FROM journal")]
    assert sorted(journal) == sorted(accepted)
    assert {r[0] for r in sql(store, "SELECT key FROM entities")} == tickets
    assert {r[0] for r in sql(store, "SELECT key FROM runs")} == tickets
