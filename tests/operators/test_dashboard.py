"""The web dashboard over real HTTP: who may use it, what its writes record, and what it
refuses, checked against the store afterwards.

The dashboard is `corral.dashboard.run` in a subprocess (a pure client, as `corral ui`
runs it), one per store for the whole module (`dashboard`); the test process hosts the
entities on the same store (`rt`), so what the dashboard delivers or replays is applied
here. Each test uses keys of its own. Requests go through httpx; the browser walk is in
`test_dashboard_browser.py`.
"""

from __future__ import annotations

import base64
import html
import importlib.util
import json
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
import pytest

import corral
from dashboard_app import (
    BROKEN,
    ENTITIES,
    Dashboard,
    Decision,
    Ledger,
    Note,
    Refund,
    RefundInput,
    Stuck,
    Tally,
    dead_notes,
    eventually,
    fresh,
    start,
    waiting_refund,
)
from pg import create_database, find_bindir
from step_history_entities import Gated, Hostile, Ticket, TicketInput

CSRF = re.compile(r'name="csrf" value="([0-9a-f]{64})"')
DELIVERY_KEY = re.compile(r'name="delivery_key" value="(ui-[A-Za-z0-9_-]+)"')


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def dashboard(request: pytest.FixtureRequest,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    """A dashboard on a fresh store of each kind, for the whole module (a subprocess
    costs about a second to start; the tests keep to keys of their own)."""
    tmp = tmp_path_factory.mktemp("dashboard")
    if request.param == "sqlite":
        store = str(tmp / "corral.db")
    else:
        if importlib.util.find_spec("asyncpg") is None:
            pytest.fail("asyncpg is not installed: `pip install -e '.[dev]'`")
        port = urlsplit(request.getfixturevalue("postgres_url")).port
        bindir = find_bindir()
        assert bindir is not None
        assert port is not None
        store = create_database(bindir, port)
    with start(store, tmp) as running:
        yield running


@pytest.fixture
async def rt(dashboard: Dashboard) -> AsyncIterator[corral.Runtime]:
    """The application's host: applies what the dashboard delivers and replays."""
    async with corral.open_runtime(dashboard.store, entities=ENTITIES) as runtime:
        yield runtime


@pytest.fixture
async def web(dashboard: Dashboard) -> AsyncIterator[httpx.AsyncClient]:
    """A client signed in with the bearer token."""
    async with httpx.AsyncClient(base_url=dashboard.url, timeout=20, headers={
            "Authorization": f"Bearer {dashboard.token}"}) as client:
        yield client


@pytest.fixture
def broken() -> Iterator[None]:
    """`Ledger.add` raises until the test clears `BROKEN` (and after it, never)."""
    BROKEN.set()
    yield
    BROKEN.clear()


def entity_path(entity_type: str, key: str) -> str:
    return f"/entities/{quote(entity_type, safe='')}/{quote(key, safe='')}"


async def csrf_of(client: httpx.AsyncClient) -> str:
    page = await client.get("/waits")
    assert page.status_code == 200, page.text
    found = CSRF.search(page.text)
    assert found is not None, page.text
    return found.group(1)


def deliver_form(csrf: str, key: str, payload: str, delivery_key: str, *, run_id: int = 1,
                 **extra: str) -> dict[str, Any]:
    return {"csrf": csrf, "entity_type": "Refund", "key": key, "name": "approval",
            "run_id": str(run_id), "payload": payload, "delivery_key": delivery_key, **extra}


def shown(page: httpx.Response, element: str) -> str:
    """The text of the element with this id (`<... id="x">text</...>`)."""
    found = re.search(rf'id="{element}">([^<]*)<', page.text)
    assert found is not None, page.text
    return html.unescape(found.group(1))


# -- progress, from the store -------------------------------------------------------------


async def test_the_entity_page_and_listing_show_the_backlog_until_a_host_applies_it(
    dashboard: Dashboard, web: httpx.AsyncClient,
) -> None:
    key = fresh("behind")
    async with corral.open_runtime(dashboard.store, entities=ENTITIES, host=False) as client:
        ref = client.ref(Ledger, key)
        for i in range(3):  # accepted; no host is running to apply them
            await ref.signal_with_start(Ledger.add, Note(text=f"n{i}"), start=None,
                                        message_id=f"n{i}")
        page = await web.get(entity_path("Ledger", key))
        assert page.status_code == 200, page.text
        assert (shown(page, "applied"), shown(page, "backlog").split(",")[0]) == (
            "0", "3 messages")
        assert "the oldest accepted" in shown(page, "backlog")
        listing = await web.get("/?type=Ledger&limit=1000")
        assert re.search(rf">{re.escape(key)}</a>.*?<td class=\"backlog\">3</td>",
                         listing.text, re.S)
        async with corral.open_runtime(dashboard.store, entities=ENTITIES):  # a host

            async def applied() -> bool:
                now = await web.get(entity_path("Ledger", key))
                return (shown(now, "applied"), shown(now, "backlog")) == ("3", "0 messages")
            await eventually(applied, what="the page shows all three applied")
            await ref.terminate("done")  # no later test's host recovers it

            async def closed() -> bool:
                return (await ref.describe()).status is corral.RunStatus.TERMINATED
            await eventually(closed, what="the run is terminated")


# -- who may use it --------------------------------------------------------------------


async def test_without_the_token_every_page_and_every_post_is_refused_with_401_and_nothing_changes(
    dashboard: Dashboard, rt: corral.Runtime, web: httpx.AsyncClient,
) -> None:
    key = fresh("refund")
    ref = await waiting_refund(rt, key)
    pages = ["/", "/waits", "/dead-letters", entity_path("Refund", key), "/?type=Refund"]
    csrf = await csrf_of(web)
    form = deliver_form(csrf, key, '{"approved": true}', "k-anon", sender="dashboard")
    assert dashboard.token is not None
    for credentials in ({}, {"Authorization": "Bearer not-the-token-at-all"},
                        {"Authorization": f"Basic {dashboard.token}"},
                        {"Cookie": "corral_dashboard=not-the-token-at-all"}):
        async with httpx.AsyncClient(base_url=dashboard.url, headers=credentials) as anon:
            for path in pages:
                page = await anon.get(path)
                assert page.status_code == 401, (credentials, path)
                assert page.headers["www-authenticate"].startswith("Bearer")
                assert 'name="token"' in page.text  # the sign-in form, and nothing else
                assert 'class="entity"' not in page.text
                assert "running" not in page.text
            for path, data in (("/waits/deliver", form),
                               ("/dead-letters/discard", {"csrf": csrf, "entity_type": "Ledger",
                                                          "key": key, "id": "1"})):
                refused = await anon.post(path, data=data)
                assert refused.status_code == 401, (credentials, path)
    assert [w.name for w in (await ref.describe()).open_waits] == ["approval"]
    for path in pages:
        page = await web.get(path)
        assert page.status_code == 200, (path, page.text)
        assert dashboard.token not in page.text
        assert page.headers["content-security-policy"].startswith("default-src 'none'")
        assert page.headers["cache-control"] == "no-store"


async def test_signing_in_sets_an_httponly_strict_cookie_and_signing_out_clears_it(
    dashboard: Dashboard,
) -> None:
    assert dashboard.token is not None
    async with httpx.AsyncClient(base_url=dashboard.url) as browser:
        wrong = await browser.post("/login", data={"token": "x" * 43, "next": "/waits"})
        assert wrong.status_code == 401
        assert "not the dashboard&#x27;s token" in wrong.text
        assert "set-cookie" not in wrong.headers
        foreign = await browser.post("/login", data={"token": dashboard.token},
                                     headers={"Origin": "http://evil.example"})
        assert foreign.status_code == 403
        assert "set-cookie" not in foreign.headers

        asked = await browser.get(entity_path("Ledger", "led/ger#1"))  # then sign in
        assert asked.status_code == 401
        target = re.search(r'name="next" value="([^"]*)"', asked.text)
        assert target is not None
        assert html.unescape(target.group(1)) == "/entities/Ledger/led/ger%231"
        signed = await browser.post("/login", data={"token": dashboard.token,
                                                    "next": html.unescape(target.group(1))})
        assert signed.status_code == 303
        assert signed.headers["location"] == "/entities/Ledger/led/ger%231"
        back = await browser.get(signed.headers["location"])
        assert back.status_code == 200
        assert "<title>Ledger led/ger#1" in back.text
        cookie = signed.headers["set-cookie"].lower()
        assert "httponly" in cookie
        assert "samesite=strict" in cookie
        assert "path=/" in cookie
        page = await browser.get("/waits")  # the cookie alone signs in
        assert page.status_code == 200
        assert "signed in as" in page.text
        assert dashboard.token not in page.text
        csrf = CSRF.search(page.text)
        assert csrf is not None

        out = await browser.post("/logout", data={"csrf": csrf.group(1)})
        assert out.status_code == 303
        assert (await browser.get("/waits")).status_code == 401

    async with httpx.AsyncClient(base_url=dashboard.url) as browser:
        link = await browser.get(f"/login?token={dashboard.token}")  # what `run` prints
        assert link.status_code == 303
        assert link.headers["location"] == "/"
        assert (await browser.get("/")).status_code == 200
    async with httpx.AsyncClient(base_url=dashboard.url) as browser:
        away = await browser.post("/login", data={"token": dashboard.token,
                                                  "next": "//evil.example/"})
        assert away.headers["location"] == "/"


async def test_metrics_and_health_answer_without_signing_in(dashboard: Dashboard) -> None:
    async with httpx.AsyncClient(base_url=dashboard.url) as anon:
        health = await anon.get("/healthz")
        assert health.status_code == 200
        assert health.text == "ok"
        metrics = await anon.get("/metrics")
        assert metrics.status_code == 200
        assert metrics.headers["content-type"].startswith("text/plain")
        assert re.search(r"^# HELP corral_\w+ ", metrics.text, re.MULTILINE), metrics.text
        # The deployment's census from the store, though the dashboard hosts nothing.
        assert re.search(r"^corral_store_up 1\.0$", metrics.text, re.MULTILINE), metrics.text
        assert re.search(r"^corral_store_shards 16\.0$", metrics.text, re.MULTILINE)


async def test_every_response_carries_the_security_headers_starlettes_own_errors_too(
    dashboard: Dashboard, web: httpx.AsyncClient,
) -> None:
    async with httpx.AsyncClient(base_url=dashboard.url) as anon:
        answers = [await web.get("/no/such/page"), await web.post("/healthz"),
                   await web.delete("/"), await web.get("/waits"), await anon.get("/"),
                   await anon.get("/healthz"), await anon.get("/metrics"),
                   await anon.post("/login", data={"token": "x"})]
    assert [a.status_code for a in answers] == [404, 405, 405, 200, 401, 200, 200, 401]
    for answer in answers:
        headers = answer.headers
        assert headers["content-security-policy"].startswith("default-src 'none'"), answer
        assert headers["x-content-type-options"] == "nosniff", answer
        assert headers["x-frame-options"] == "DENY", answer
        assert headers["referrer-policy"] == "same-origin", answer
        assert headers["cache-control"] == "no-store", answer
    style = await web.get("/style.css")
    assert style.headers["cache-control"] == "max-age=3600"  # a route's own header stays
    assert style.headers["x-content-type-options"] == "nosniff"


# -- what its writes record ------------------------------------------------------------


async def test_a_decision_is_recorded_with_the_signed_in_operator_as_sender_whatever_the_form_says(
    rt: corral.Runtime, web: httpx.AsyncClient,
) -> None:
    key = fresh("refund")
    ref = await waiting_refund(rt, key)
    page = await web.get("/waits")
    assert entity_path("Refund", key) in page.text
    keys = DELIVERY_KEY.findall(page.text)
    assert keys
    assert not set(keys) & set(DELIVERY_KEY.findall((await web.get("/waits")).text))  # fresh
    csrf = await csrf_of(web)
    form = deliver_form(csrf, key, '{"approved": true, "note": "<i>paid</i>"}', keys[0],
                        sender="mallory")

    done = await web.post("/waits/deliver", data=form)
    assert done.status_code == 200, done.text
    assert shown(done, "delivery-status") == "delivered"
    assert shown(done, "winner") == "dashboard"
    assert "&lt;i&gt;paid&lt;/i&gt;" in done.text
    assert "<i>" not in done.text
    decision = Decision(approved=True, note="<i>paid</i>")
    assert await ref.result(timeout=15) == decision
    # The store recorded the operator: a retry as them is a duplicate, as anyone else a
    # conflict.
    retry = await ref.deliver(Refund.approval, decision, key=keys[0], sender="dashboard")
    assert retry.status == "duplicate"
    assert retry.sender == "dashboard"
    with pytest.raises(corral.IdempotencyConflictError):
        await ref.deliver(Refund.approval, decision, key=keys[0], sender="mallory")

    again = await web.post("/waits/deliver", data=form)  # a reload of the result page
    assert again.status_code == 200
    assert shown(again, "delivery-status") == "duplicate"
    late = await web.post("/waits/deliver", data={**form, "delivery_key": "k-late",
                                                  "payload": '{"approved": false}'})
    assert late.status_code == 200  # another operator, too late: told who decided what
    assert shown(late, "delivery-status") == "already_delivered"
    assert shown(late, "winner") == "dashboard"
    assert "&quot;approved&quot;: true" in late.text
    assert await ref.result(timeout=15) == decision


async def test_dead_letters_are_listed_replayed_and_discarded_by_the_operator(
    rt: corral.Runtime, web: httpx.AsyncClient, broken: None,
) -> None:
    key = fresh("ledger/a#b")  # a key that needs escaping in a URL
    first, second = await dead_notes(rt, key, "<b>first</b>", "second")
    BROKEN.clear()  # the fix is deployed
    ref = rt.ref(Ledger, key)
    detail = await web.get(entity_path("Ledger", key))
    assert detail.status_code == 200, detail.text
    assert "<dt>Dead letters</dt><dd>2</dd>" in detail.text
    listed = await web.get("/dead-letters?type=Ledger")
    for letter in (first, second):
        assert f'id="dead-letter-{letter.id}"' in listed.text
    assert "&lt;b&gt;first&lt;/b&gt;" in listed.text
    assert "<b>first</b>" not in listed.text
    assert f'href="{html.escape(entity_path("Ledger", key))}"' in listed.text
    # One per page, from just before the first (older letters of other tests come before).
    one = await web.get(f"/dead-letters?type=Ledger&limit=1&after={first.id - 1}")
    assert f'id="dead-letter-{first.id}"' in one.text
    assert f'id="dead-letter-{second.id}"' not in one.text
    following = await web.get(html.unescape(
        re.search(r'<a rel="next" href="([^"]+)"', one.text).group(1)))  # type: ignore[union-attr]
    assert f'id="dead-letter-{second.id}"' in following.text
    assert f'id="dead-letter-{first.id}"' not in following.text
    assert "End of the list." in following.text
    assert (await web.get("/dead-letters?after=x")).status_code == 400

    csrf = await csrf_of(web)
    replay = {"csrf": csrf, "entity_type": "Ledger", "key": key, "id": str(first.id),
              "sender": "mallory"}  # authorize refuses mallory: the form's sender is ignored
    done = await web.post("/dead-letters/replay", data=replay)
    assert done.status_code == 200, done.text
    assert f"Dead letter {first.id} replayed (accepted)" in done.text

    async def applied() -> bool:
        return await ref.query(Ledger.lines) == ["<b>first</b>"]

    await eventually(applied, what="the replayed note applied")
    twice = await web.post("/dead-letters/replay", data=replay)
    assert twice.status_code == 200
    assert f"Dead letter {first.id} replayed (duplicate)" in twice.text

    discard = {**replay, "id": str(second.id)}
    dropped = await web.post("/dead-letters/discard", data=discard)
    assert dropped.status_code == 200
    assert f"Dead letter {second.id} discarded." in dropped.text
    gone = await web.post("/dead-letters/discard", data=discard)
    assert gone.status_code == 200
    assert "already gone" in gone.text
    missing = await web.post("/dead-letters/replay", data=discard)
    assert missing.status_code == 404
    assert "DeadLetterNotFoundError" in missing.text
    for bad in ("x1", "0", ""):
        refused = await web.post("/dead-letters/replay", data={**replay, "id": bad})
        assert refused.status_code == 400, bad
    assert await ref.dead_letters() == []
    assert await ref.query(Ledger.lines) == ["<b>first</b>"]
    assert "No dead letters." in (await web.get(entity_path("Ledger", key))).text


# -- what it refuses -------------------------------------------------------------------


async def test_a_post_without_the_form_token_or_from_another_site_is_refused_and_changes_nothing(
    dashboard: Dashboard, rt: corral.Runtime, web: httpx.AsyncClient, broken: None,
) -> None:
    key = fresh("refund")
    ref = await waiting_refund(rt, key)
    ledger = fresh("ledger")
    [letter] = await dead_notes(rt, ledger, "kept")
    BROKEN.clear()
    csrf = await csrf_of(web)
    good = deliver_form(csrf, key, '{"approved": true}', "k-csrf")
    replay = {"csrf": csrf, "entity_type": "Ledger", "key": ledger, "id": str(letter.id)}
    forged: list[tuple[dict[str, Any], dict[str, str]]] = [
        ({k: v for k, v in good.items() if k != "csrf"}, {}),
        ({**good, "csrf": "0" * 64}, {}),
        ({**good, "csrf": csrf[:-1]}, {}),
        (good, {"Origin": "http://evil.example"}),
        (good, {"Origin": "null"}),
        (good, {"Referer": "http://evil.example/page"}),
    ]
    for data, headers in forged:
        refused = await web.post("/waits/deliver", data=data, headers=headers)
        assert refused.status_code == 403, (data, headers)
        assert "Nothing was changed" in refused.text
    for path in ("/dead-letters/replay", "/dead-letters/discard"):
        assert (await web.post(path, data={**replay, "csrf": ""})).status_code == 403
        assert (await web.post(path, data=replay, headers={
            "Origin": "http://evil.example"})).status_code == 403
    multipart = await web.post("/waits/deliver", data=good, files={"f": b"x"})
    assert multipart.status_code == 415
    assert [w.name for w in (await ref.describe()).open_waits] == ["approval"]
    assert [d.id for d in await rt.ref(Ledger, ledger).dead_letters()] == [letter.id]

    # The same form from the dashboard's own page (as a browser sends it) is accepted,
    # and its key was never stored by the refused posts.
    done = await web.post("/waits/deliver", data=good, headers={"Origin": dashboard.url})
    assert done.status_code == 200, done.text
    assert shown(done, "delivery-status") == "delivered"


async def test_a_decision_the_runtime_refuses_is_shown_as_a_4xx_page_and_nothing_is_stored(
    rt: corral.Runtime, web: httpx.AsyncClient,
) -> None:
    key = fresh("refund")
    ref = await waiting_refund(rt, key)
    csrf = await csrf_of(web)
    good = deliver_form(csrf, key, '{"approved": false}', "k-bad")
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"payload": "{approved: yes"}, 400, "not JSON"),
        ({"payload": "[" * 50_000}, 400, "not JSON"),
        ({"payload": '{"approved": "maybe"}'}, 400, "InvalidPayloadError"),
        ({"payload": '{"approved": true, "refund_to": "attacker"}'}, 400, "InvalidPayloadError"),
        ({"payload": "[true]"}, 400, "InvalidPayloadError"),
        ({"payload": "NaN"}, 400, "InvalidPayloadError"),
        ({"payload": ""}, 400, "not JSON"),
        ({"delivery_key": "k\x01"}, 400, "InvalidKeyError"),
        ({"delivery_key": ""}, 400, "InvalidKeyError"),
        ({"delivery_key": "k" * 513}, 400, "InvalidKeyError"),
        ({"entity_type": "Nope"}, 404, "UnknownEntityTypeError"),
        ({"name": "payment"}, 404, "UnknownHandlerError"),
        ({"key": "not a key!"}, 400, "InvalidKeyError"),
        ({"run_id": "one"}, 400, "whole number"),
        ({"run_id": "0"}, 400, "InvalidArgumentError"),
        ({"key": fresh("never-started")}, 409, "EntityNotRunningError"),
    ]
    for change, status, says in cases:
        page = await web.post("/waits/deliver", data={**good, **change})
        assert page.status_code == status, (change, page.text)
        assert says in page.text, (change, page.text)
        assert 'role="alert"' in page.text
    retried = await web.post("/waits/deliver", data={**good, "payload": '{"approved": 1.5}'})
    assert '<textarea name="payload" required placeholder="{&quot;approved&quot;: true}">' \
           '{&quot;approved&quot;: 1.5}</textarea>' in retried.text  # kept to fix and resend
    assert 'name="delivery_key" value="k-bad"' in retried.text
    big = await web.post("/waits/deliver", data={**good, "payload": "1" * (1 << 20)})
    assert big.status_code == 413

    assert [w.name for w in (await ref.describe()).open_waits] == ["approval"]
    done = await web.post("/waits/deliver", data=good)  # "k-bad" was never stored
    assert done.status_code == 200
    assert shown(done, "delivery-status") == "delivered"
    assert await ref.result(timeout=15) == Decision(approved=False)


async def test_the_entity_list_filters_by_type_and_status_and_pages_with_the_cursor(
    rt: corral.Runtime, web: httpx.AsyncClient,
) -> None:
    keys = sorted(f"tally-{i}-{uuid.uuid4().hex[:6]}" for i in range(5))
    for key in keys:
        await rt.ref(Tally, key).signal_with_start(Tally.bump, start=None)
    await rt.ref(Tally, keys[3]).terminate("enough")
    seen: list[str] = []
    path: str | None = "/?type=Tally&limit=2"
    while path is not None:
        page = await web.get(path)
        assert page.status_code == 200, page.text
        rows = re.findall(r'class="entity">([^<]+)</a>', page.text)
        assert len(rows) <= 2
        seen += rows
        after = re.search(r'rel="next" href="([^"]+)"', page.text)
        path = html.unescape(after.group(1)) if after else None
    assert seen == keys
    terminated = await web.get("/?type=Tally&status=terminated")
    assert re.findall(r'class="entity">([^<]+)</a>', terminated.text) == [keys[3]]
    assert '<option value="terminated" selected>' in terminated.text
    detail = await web.get(entity_path("Tally", keys[3]))
    assert shown(detail, "status") == "terminated"
    never = await web.get(entity_path("Tally", "tally-never"))
    assert shown(never, "status") == "never_started"
    for path, status in (("/?after=not-a-cursor", 400), ("/?type=Nope", 404),
                         ("/?status=sleeping", 400), ("/?limit=many", 400),
                         ("/?limit=5000", 400), (entity_path("Nope", "x"), 404),
                         ("/entities/Tally/bad%20key", 400), ("/waits?after=zz", 400)):
        page = await web.get(path)
        assert page.status_code == status, (path, page.text)
        assert 'role="alert"' in page.text


async def test_an_application_authenticate_hook_names_the_operator_and_there_is_no_token(
    tmp_path: Path,
) -> None:
    store = str(tmp_path / "corral.db")
    with start(store, tmp_path, app="header") as dashboard:
        assert dashboard.token is None
        async with corral.open_runtime(store, entities=ENTITIES) as host:
            key = fresh("refund")
            ref = await waiting_refund(host, key)
            async with httpx.AsyncClient(base_url=dashboard.url) as anon:
                for headers in ({}, {"X-Operator": "mallory"}):
                    refused = await anon.get("/waits", headers=headers)
                    assert refused.status_code == 401
                    assert 'name="token"' not in refused.text
                assert (await anon.get("/login")).status_code == 404
            async with httpx.AsyncClient(base_url=dashboard.url,
                                         headers={"X-Operator": "ops-ana"}) as ana:
                page = await ana.get("/waits")
                assert 'signed in as <strong class="operator">ops-ana</strong>' in page.text
                assert "Sign out" not in page.text
                csrf = await csrf_of(ana)
                form = deliver_form(csrf, key, '{"approved": true}', "k-ana", sender="ops-bob")
                bob = await ana.post("/waits/deliver", data=form,
                                     headers={"X-Operator": "ops-bob"})
                assert bob.status_code == 403  # ana's form token is not bob's
                done = await ana.post("/waits/deliver", data=form)
                assert done.status_code == 200, done.text
                assert shown(done, "winner") == "ops-ana"
            decision = Decision(approved=True)
            assert await ref.result(timeout=15) == decision
            retry = await ref.deliver(Refund.approval, decision, key="k-ana", sender="ops-ana")
            assert retry.status == "duplicate"
            with pytest.raises(corral.IdempotencyConflictError):
                await ref.deliver(Refund.approval, decision, key="k-ana", sender="ops-bob")


async def test_the_entity_page_and_listing_show_a_suspended_run_with_its_error(
    rt: corral.Runtime, web: httpx.AsyncClient,
) -> None:
    key = fresh("stuck")
    ref = rt.ref(Stuck, key)
    await ref.start(start=None)

    async def suspended() -> bool:
        return (await ref.describe()).suspension is not None
    await eventually(suspended, what="the run is suspended")
    page = await web.get(entity_path("Stuck", key))
    assert page.status_code == 200, page.text
    assert shown(page, "status") == "running (suspended)"
    assert 'id="suspension"' in page.text
    assert "1 failed attempt(s)" in page.text
    assert "KeyError: &#x27;no template &lt;b&gt;for&lt;/b&gt; this&#x27;" in page.text
    listing = await web.get("/", params={"type": "Stuck"})
    assert listing.status_code == 200, listing.text
    assert re.search(rf"{key}</a></td><td class=\"status\">running \(suspended\)</td>",
                     listing.text), listing.text


async def test_a_forged_listing_cursor_is_a_400_page_not_a_503(web: httpx.AsyncClient) -> None:
    def forged(fields: list[Any]) -> str:
        return quote(base64.urlsafe_b64encode(json.dumps(fields).encode()).decode())

    surrogate, nul = forged(["\ud800", "k"]), forged(["Tally", "k\x00"])
    too_big = forged([1.0, "Refund", "r", 2**64, "approval"])  # a run id over 2^63
    for path in (f"/?after={surrogate}", f"/?type=Tally&after={nul}",
                 f"/waits?after={too_big}"):
        page = await web.get(path)
        assert page.status_code == 400, (path, page.text)
        assert "not a cursor of this listing" in page.text


# -- search, state and history, terminate, query ----------------------------------------


async def test_the_entity_list_is_searched_by_key_prefix_and_marks_its_live_region(
    rt: corral.Runtime, web: httpx.AsyncClient,
) -> None:
    stem = fresh("find")
    for key in (f"{stem}-a", f"{stem}-b", f"other-{stem}"):
        await rt.ref(Tally, key).signal_with_start(Tally.bump, start=None)
    page = await web.get("/", params={"key": f"{stem}-", "refresh": "2"})
    assert page.status_code == 200, page.text
    assert re.findall(r'class="entity">([^<]+)</a>', page.text) == [f"{stem}-a", f"{stem}-b"]
    assert f'name="key" value="{stem}-"' in page.text
    assert 'id="live" data-live="2000"' in page.text
    assert '<script src="/live.js" defer></script>' in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    script = await web.get("/live.js")
    assert script.headers["content-type"].startswith("text/javascript")
    assert "getElementById(\"live\")" in script.text
    off = await web.get("/", params={"key": f"{stem}-", "refresh": "0"})
    assert 'data-live="0"' in off.text
    for bad in ("bad\x00", "k" * 600):
        refused = await web.get("/", params={"key": bad})
        assert refused.status_code == 400, refused.text


async def test_an_entity_page_shows_its_state_history_result_and_start_input_escaped(
    rt: corral.Runtime, web: httpx.AsyncClient,
) -> None:
    ref = rt.ref(Refund, fresh("refund"))
    await ref.start(start=RefundInput(amount=40))
    await ref.deliver(Refund.approval, Decision(approved=True, note="<b>card</b>"),
                      key="k-1", sender="ops-ana")
    assert (await ref.result(timeout=15)).note == "<b>card</b>"
    page = await web.get(entity_path("Refund", ref.key))
    assert page.status_code == 200, page.text
    assert "&lt;b&gt;card&lt;/b&gt;" in page.text  # the result, escaped
    assert "<b>card</b>" not in page.text
    assert '<code>{&quot;amount&quot;:40}</code>' in page.text  # the start input
    history = await web.get(entity_path("Refund", ref.key), params={"view": "history"})
    assert history.status_code == 200, history.text
    assert re.search(r'<td>approval</td><td class="status">delivered</td>', history.text)
    assert "<td>ops-ana</td>" in history.text

    ledger = rt.ref(Ledger, fresh("ledger"))
    await ledger.signal_with_start(Ledger.add, Note(text="<i>one</i>"), start=None,
                                   message_id="m-1", sender="ops-bob")
    await eventually(lambda: _applied(ledger, ["<i>one</i>"]), what="the note applied")
    detail = await web.get(entity_path("Ledger", ledger.key))
    assert 'id="pending"' in detail.text or 'id="state"' in detail.text
    listed = await web.get(entity_path("Ledger", ledger.key), params={"view": "history"})
    assert re.search(r"<td>1</td><td>1</td><td>signal</td>\s*<td>add</td>", listed.text)
    assert "<code>m-1</code>" in listed.text
    assert "&lt;i&gt;one&lt;/i&gt;" in listed.text
    assert "<i>one</i>" not in listed.text
    for bad in ("?view=history&after=x", "?after=-1", "?view=history&limit=5000"):
        refused = await web.get(entity_path("Ledger", ledger.key) + bad)
        assert refused.status_code == 400, (bad, refused.text)


async def test_the_history_tab_lists_each_step_with_its_attempts_outcome_and_traceback(
    rt: corral.Runtime, web: httpx.AsyncClient, tmp_path: Path,
) -> None:
    ticket = rt.ref(Ticket, fresh("ticket"))
    await ticket.start(start=TicketInput(log=str(tmp_path / "ticket.log")))
    await ticket.result(timeout=30)
    page = await web.get(entity_path("Ticket", ticket.key), params={"view": "history"})
    assert page.status_code == 200, page.text
    steps = page.text[page.text.index('id="steps"'):]
    assert re.search(r'<td><code>model:9104</code></td>\s*<td class="status">completed</td>'
                     r'<td class="attempts">3</td>', steps)
    assert re.search(r'<td><code>tool:9104</code></td>\s*<td class="status">failed</td>'
                     r'<td class="attempts">3</td>', steps)
    assert "&quot;answer to 9104&quot;" in steps  # the result's summary, escaped
    assert "<summary>RuntimeError: tool for 9104 is down</summary>" in steps
    assert re.search(r'<pre class="traceback">[^<]*in tool_is_down', steps)
    assert steps.count("<td>host</td>") == 2  # neither ran as a Ray task

    gated = rt.ref(Gated, fresh("gated"))
    await gated.start(start=TicketInput(log=str(tmp_path / "gated.log")))

    async def retrying() -> str | None:
        found = await web.get(entity_path("Gated", gated.key), params={"view": "history"})
        return found.text if '<td class="status">retrying</td>' in found.text else None
    shown_retrying = await eventually(retrying, what="the step retrying on the page")
    assert "<summary>ConnectionRefusedError: the gate is shut</summary>" in shown_retrying
    Path(str(tmp_path / "gated.log") + ".gate").write_text("")  # noqa: ASYNC240 (tiny)
    assert await gated.result(timeout=30) == "through"

    hostile = rt.ref(Hostile, fresh("hostile"))
    await hostile.start(start=TicketInput(log=str(tmp_path / "hostile.log")))
    await hostile.result(timeout=30)
    page = await web.get(entity_path("Hostile", hostile.key), params={"view": "history"})
    assert page.status_code == 200, page.text
    assert "<summary>ValueError: bad &lt;b&gt;\\ud800 \\x00" in page.text
    assert "<b>" not in page.text[page.text.index('id="steps"'):]


async def _applied(ref: corral.EntityRef[Ledger, None], lines: list[str]) -> bool:
    return await ref.query(Ledger.lines) == lines


async def test_terminate_from_the_entity_page_records_the_operator_and_needs_the_form_token(
    rt: corral.Runtime, web: httpx.AsyncClient,
) -> None:
    ref = rt.ref(Tally, fresh("tally"))
    await ref.signal_with_start(Tally.bump, start=None)
    page = await web.get(entity_path("Tally", ref.key))
    assert 'action="/entities/terminate"' in page.text
    csrf = await csrf_of(web)
    form = {"csrf": csrf, "entity_type": "Tally", "key": ref.key, "reason": "<enough>",
            "sender": "mallory"}
    refused = await web.post("/entities/terminate", data={**form, "csrf": "0" * 64})
    assert refused.status_code == 403
    assert (await ref.describe()).status is corral.RunStatus.RUNNING
    done = await web.post("/entities/terminate", data=form)
    assert done.status_code == 200, done.text
    assert f"Run 1 of Tally {ref.key} terminated (accepted)." in done.text
    with pytest.raises(corral.EntityTerminatedError, match="<enough>"):
        await ref.result(timeout=15)
    last = (await ref.history()).messages.items[-1]  # the terminate mark (its journal
    assert (last.seq, last.sender) == (2, "dashboard")  # entry may be gone by now)
    again = await web.post("/entities/terminate", data=form)
    assert again.status_code == 409  # not running any more
    assert "EntityNotRunningError" in again.text


async def test_a_query_runs_from_the_entity_page_through_the_authorize_hook(
    rt: corral.Runtime, web: httpx.AsyncClient,
) -> None:
    ref = rt.ref(Tally, fresh("tally"))
    secret = rt.ref(Tally, fresh("secret"))
    for tally in (ref, ref, secret):
        await tally.signal_with_start(Tally.bump, start=None)
    csrf = await csrf_of(web)
    form = {"csrf": csrf, "entity_type": "Tally", "key": ref.key, "name": "total",
            "payload": ""}
    answered = await web.post("/entities/query", data=form)
    assert answered.status_code == 200, answered.text
    assert shown(answered, "query-result") == "2"
    refused = await web.post("/entities/query", data={**form, "key": secret.key})
    assert refused.status_code == 403  # the application's hook refused it
    assert "UnauthorizedError" in refused.text
    for bad, status in ((dict(name="bump"), 404), (dict(payload="{"), 400),
                        (dict(payload='{"x": 1}'), 400), (dict(csrf=""), 403)):
        page = await web.post("/entities/query", data={**form, **bad})
        assert page.status_code == status, (bad, page.text)


async def test_a_read_the_authorize_hook_refuses_is_a_403_page(
    rt: corral.Runtime, web: httpx.AsyncClient, tmp_path: Path,
) -> None:
    hidden = rt.ref(Tally, fresh("hidden"))
    await hidden.signal_with_start(Tally.bump, start=None)
    for path in (entity_path("Tally", hidden.key), entity_path("Tally", hidden.key) +
                 "?view=history"):
        page = await web.get(path)
        assert page.status_code == 403, (path, page.text)
        assert "UnauthorizedError: read" in page.text, path
        assert 'class="entity"' not in page.text
    store = str(tmp_path / "corral.db")
    with start(store, tmp_path, app="header") as dashboard:  # ops-bob may read nothing
        async with httpx.AsyncClient(base_url=dashboard.url) as client:
            for path in ("/", "/?type=Tally", "/waits", "/dead-letters",
                         entity_path("Tally", "t-1")):
                bob = await client.get(path, headers={"X-Operator": "ops-bob"})
                assert bob.status_code == 403, (path, bob.text)
                assert "UnauthorizedError: read" in bob.text, path
                ana = await client.get(path, headers={"X-Operator": "ops-ana"})
                assert ana.status_code == 200, (path, ana.text)
