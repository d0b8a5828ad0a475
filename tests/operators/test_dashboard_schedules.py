"""The dashboard's schedules over real HTTP: the list and a schedule's page (next ticks,
newest outcomes), and its writes (pause, resume, trigger) with the same CSRF and
`authorize` rules as every write: a post without the form token, or one the hook
refuses, changes nothing."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

import corral
from dashboard_app import ENTITIES, Dashboard, Ledger, Note, eventually, fresh, start

CSRF = re.compile(r'name="csrf" value="([0-9a-f]{64})"')


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    tmp = tmp_path_factory.mktemp("dashboard-schedules")
    with start(str(tmp / "corral.db"), tmp) as running:
        yield running


@pytest.fixture
async def rt(dashboard: Dashboard) -> AsyncIterator[corral.Runtime]:
    async with corral.open_runtime(dashboard.store, entities=ENTITIES) as runtime:
        yield runtime


@pytest.fixture
async def web(dashboard: Dashboard) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=dashboard.url, timeout=20, headers={
            "Authorization": f"Bearer {dashboard.token}"}) as client:
        yield client


async def _schedule(rt: corral.Runtime, key: str) -> str:
    sid = f"s-{key}"
    await rt.schedules.create(sid, rt.ref(Ledger, key), Ledger.add, Note(text="tick"),
                              start=None, spec=corral.Interval(every=3600))
    return sid


async def test_the_list_and_page_show_schedules_and_their_writes_record_the_operator(
        rt: corral.Runtime, web: httpx.AsyncClient) -> None:
    key = fresh("ledger")
    sid = await _schedule(rt, key)
    listing = await web.get("/schedules")
    assert listing.status_code == 200
    assert f'href="/schedules/{sid}"' in listing.text
    page = await web.get(f"/schedules/{sid}")
    assert page.status_code == 200
    assert page.text.count("<li>") == 5  # the next five ticks
    found = CSRF.search(page.text)
    assert found is not None
    csrf = found.group(1)
    paused = await web.post("/schedules/pause", data={"csrf": csrf, "id": sid})
    assert paused.status_code == 200, paused.text
    assert (await rt.schedules.describe(sid)).paused
    triggered = await web.post("/schedules/trigger", data={"csrf": csrf, "id": sid})
    assert "triggered: started" in triggered.text
    await eventually(lambda: rt.ref(Ledger, key).query(Ledger.lines), what="the tick")
    page = await web.get(f"/schedules/{sid}")
    assert 'class="outcome started"' in page.text
    assert (await web.post("/schedules/resume", data={"csrf": csrf, "id": sid})
            ).status_code == 200
    assert not (await rt.schedules.describe(sid)).paused


async def test_a_schedule_post_without_the_token_or_refused_by_authorize_changes_nothing(
        rt: corral.Runtime, web: httpx.AsyncClient) -> None:
    sid = await _schedule(rt, fresh("ledger"))
    page = await web.get(f"/schedules/{sid}")
    found = CSRF.search(page.text)
    assert found is not None
    csrf = found.group(1)
    for data, headers in (({"id": sid}, {}), ({"id": sid, "csrf": "0" * 64}, {}),
                          ({"id": sid, "csrf": csrf}, {"Origin": "http://evil.example"})):
        refused = await web.post("/schedules/pause", data=data, headers=headers)
        assert refused.status_code == 403, (data, headers)
    assert not (await rt.schedules.describe(sid)).paused
    hidden = await _schedule(rt, fresh("hidden"))
    refused = await web.post("/schedules/pause", data={"csrf": csrf, "id": hidden})
    assert refused.status_code == 403
    assert not (await rt.schedules.describe(hidden)).paused
    assert (await web.get("/schedules/nope")).status_code == 404
    assert (await web.post("/schedules/explode", data={"csrf": csrf, "id": sid})
            ).status_code == 404


