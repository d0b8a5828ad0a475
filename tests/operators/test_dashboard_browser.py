"""The dashboard in a real headless Chromium (selenium and Debian's chromedriver): sign
in, list, an entity's detail, replay its dead letter, decide a refund; search by key,
watch the list and an entity page refresh by themselves, terminate from the page; read
a ticket's steps on its History tab and unfold a failed step's traceback; then
the store is checked from the test process, which hosts the entities.

Selenium blocks, so the walk runs in a thread (`asyncio.to_thread`) while this event
loop hosts the entities and applies what the browser delivers.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as seen
from selenium.webdriver.support.wait import WebDriverWait

import corral
from dashboard_app import (
    BROKEN,
    ENTITIES,
    Dashboard,
    Decision,
    Ledger,
    Refund,
    Tally,
    dead_notes,
    eventually,
    fresh,
    start,
    waiting_refund,
)
from step_history_entities import Ticket, TicketInput

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
STEP = 15.0  # seconds any one page may take to appear


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    """A headless Chromium with a profile of its own, for both stores (it starts in
    about 3 s; each dashboard has its own token, so the walk always signs in afresh)."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        why = f"{' and '.join(missing)} missing: apt-get install chromium chromium-driver"
        if os.environ.get("CORRAL_REQUIRE_BROWSER") == "1":  # .ci/run: never pass by skipping
            pytest.fail(f"CORRAL_REQUIRE_BROWSER=1 but {why}", pytrace=False)
        pytest.skip(why)
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless", "--no-sandbox", "--disable-gpu",
                 "--disable-background-networking", "--no-first-run",
                 "--disable-dev-shm-usage", "--window-size=1280,1000",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def walk(driver: WebDriver, dashboard: Dashboard, refund: str, ledger: str, letter: int) -> str:
    """What an operator does, click by click; the delivery key the decision went with."""
    until = WebDriverWait(driver, STEP, poll_frequency=0.02).until
    assert dashboard.token is not None

    driver.get(f"{dashboard.url}/")  # not signed in: the sign-in form
    driver.find_element(By.NAME, "token").send_keys(dashboard.token)
    driver.find_element(By.CSS_SELECTOR, "form[action='/login'] button").click()
    until(seen.title_contains("Entities"))
    assert dashboard.token not in driver.page_source

    driver.find_element(By.LINK_TEXT, refund)  # listed
    driver.find_element(By.LINK_TEXT, ledger).click()
    until(seen.title_contains(ledger))
    assert driver.find_element(By.ID, "status").text == "running"
    dead = driver.find_element(By.ID, f"dead-letter-{letter}")
    assert "ledger is broken" in dead.text
    dead.find_element(By.CSS_SELECTOR, "form.replay button").click()
    until(seen.title_contains("Replayed"))
    assert f"Dead letter {letter} replayed (accepted)" in \
        driver.find_element(By.ID, "message").text
    driver.find_element(By.LINK_TEXT, f"Ledger {ledger}").click()
    until(seen.title_contains(ledger))
    assert "No dead letters." in driver.page_source

    driver.find_element(By.LINK_TEXT, "Open waits").click()
    until(seen.title_contains("Open waits"))
    form = driver.find_element(
        By.XPATH, f"//div[contains(@class, 'wait')][.//a[text()='{refund}']]//form")
    key = form.find_element(By.NAME, "delivery_key").get_attribute("value")
    assert key is not None
    assert key.startswith("ui-")
    form.find_element(By.NAME, "payload").send_keys('{"approved": true, "note": "to card"}')
    # A field a hostile script slipped into the form: the server must ignore it.
    driver.execute_script(
        "const f = document.createElement('input'); f.type = 'hidden'; f.name = 'sender';"
        "f.value = 'mallory'; arguments[0].appendChild(f);", form)
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    until(seen.title_contains("Delivery"))
    assert driver.find_element(By.ID, "delivery-status").text == "delivered"
    assert driver.find_element(By.ID, "winner").text == "dashboard"
    assert '"note": "to card"' in driver.find_element(By.ID, "winner-payload").text

    driver.find_element(By.LINK_TEXT, refund).click()
    until(seen.title_contains(refund))
    assert "No open waits." in driver.page_source
    return key


async def test_an_operator_replays_a_dead_letter_and_decides_a_refund_in_a_real_browser(
    browser: WebDriver, db_path: str, tmp_path: Path,
) -> None:
    with start(db_path, tmp_path) as dashboard:
        async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
            refund = await waiting_refund(rt, fresh("refund"))
            ledger = rt.ref(Ledger, fresh("ledger"))
            BROKEN.set()
            try:
                [letter] = await dead_notes(rt, ledger.key, "refund issued")
            finally:
                BROKEN.clear()  # the fix is deployed; now replay
            assert await ledger.query(Ledger.lines) == []

            key = await asyncio.to_thread(walk, browser, dashboard, refund.key, ledger.key,
                                          letter.id)

            decision = Decision(approved=True, note="to card")
            assert await refund.result(timeout=15) == decision
            # Recorded as the signed-in operator, not as the field the script added.
            retry = await refund.deliver(Refund.approval, decision, key=key, sender="dashboard")
            assert retry.status == "duplicate"
            with pytest.raises(corral.IdempotencyConflictError):
                await refund.deliver(Refund.approval, decision, key=key, sender="mallory")

            async def applied() -> bool:
                return await ledger.query(Ledger.lines) == ["refund issued"]

            await eventually(applied, what="the replayed note applied")
            assert await ledger.dead_letters() == []
            assert (await ledger.describe()).status is corral.RunStatus.RUNNING


def live_walk(driver: WebDriver, dashboard: Dashboard, stem: str,
              send: Callable[[str], None]) -> None:
    """Search by key prefix, watch the list and the entity page refresh by themselves
    (no reload: a marker set on the page survives), then terminate from the page.
    `send(key)` has the test process signal that key (creating it if new)."""
    until = WebDriverWait(driver, STEP, poll_frequency=0.05).until
    assert dashboard.token is not None
    driver.get(f"{dashboard.url}/login?token={dashboard.token}")
    until(seen.title_contains("Entities"))

    search = driver.find_element(By.NAME, "key")
    search.send_keys(f"{stem}-")
    search.submit()
    until(seen.url_contains("key="))
    keys = [a.text for a in driver.find_elements(By.CSS_SELECTOR, "a.entity")]
    assert keys == [f"{stem}-a"]
    driver.get(driver.current_url + "&refresh=1")
    driver.execute_script("window.corralMarker = 'same page';")
    send(f"{stem}-b")  # a new entity: the list shows it without a reload
    until(seen.presence_of_element_located((By.LINK_TEXT, f"{stem}-b")))
    assert driver.execute_script("return window.corralMarker;") == "same page"
    assert driver.find_elements(By.LINK_TEXT, f"other-{stem}") == []

    driver.find_element(By.LINK_TEXT, f"{stem}-a").click()
    until(seen.title_contains(f"{stem}-a"))
    driver.get(driver.current_url + "?refresh=1")
    assert driver.find_element(By.ID, "accepted").text == "1"
    driver.execute_script("window.corralMarker = 'detail';")
    send(f"{stem}-a")
    until(seen.text_to_be_present_in_element((By.ID, "accepted"), "2"))
    assert driver.execute_script("return window.corralMarker;") == "detail"

    driver.find_element(By.CSS_SELECTOR, "details.terminate summary").click()
    form = driver.find_element(By.CSS_SELECTOR, "form.terminate")
    form.find_element(By.NAME, "reason").send_keys("closed from the browser")
    form.find_element(By.CSS_SELECTOR, "button[name=terminate]").click()
    until(seen.title_contains("Terminated"))
    assert f"Run 1 of Tally {stem}-a terminated (accepted)." in \
        driver.find_element(By.ID, "message").text
    driver.find_element(By.LINK_TEXT, f"Tally {stem}-a").click()
    until(seen.title_contains(f"{stem}-a"))
    assert driver.find_element(By.ID, "status").text == "terminated"


async def test_an_operator_searches_watches_pages_refresh_and_terminates_in_a_real_browser(
    browser: WebDriver, db_path: str, tmp_path: Path,
) -> None:
    stem = fresh("live")
    with start(db_path, tmp_path) as dashboard:
        async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
            loop = asyncio.get_running_loop()
            for key in (f"{stem}-a", f"other-{stem}"):
                await rt.ref(Tally, key).signal_with_start(Tally.bump, start=None)

            def send(key: str) -> None:
                bump = rt.ref(Tally, key).signal_with_start(Tally.bump, start=None)
                asyncio.run_coroutine_threadsafe(bump, loop).result(timeout=STEP)

            await asyncio.to_thread(live_walk, browser, dashboard, stem, send)

            ref = rt.ref(Tally, f"{stem}-a")
            with pytest.raises(corral.EntityTerminatedError, match="closed from the browser"):
                await ref.result(timeout=15)
            last = (await ref.history()).messages.items[-1]  # the terminate mark
            assert (last.seq, last.sender) == (3, "dashboard")


def steps_walk(driver: WebDriver, dashboard: Dashboard, key: str) -> list[list[str]]:
    """Open a ticket's History tab, unfold its failed step's traceback; the steps
    table's cells, row by row."""
    until = WebDriverWait(driver, STEP, poll_frequency=0.05).until
    assert dashboard.token is not None
    driver.get(f"{dashboard.url}/login?token={dashboard.token}")
    until(seen.title_contains("Entities"))
    driver.find_element(By.LINK_TEXT, key).click()
    until(seen.title_contains(key))
    driver.find_element(By.LINK_TEXT, "History").click()
    until(seen.presence_of_element_located((By.ID, "steps")))
    table = driver.find_element(By.ID, "steps")
    trace = table.find_element(By.CSS_SELECTOR, "tr.failed pre.traceback")
    assert not trace.is_displayed()  # folded under the error
    table.find_element(By.CSS_SELECTOR, "tr.failed details summary").click()
    until(lambda _: trace.is_displayed())
    assert "in tool_is_down" in trace.text
    return [[cell.text for cell in row.find_elements(By.TAG_NAME, "td")]
            for row in table.find_elements(By.CSS_SELECTOR, "tbody tr")]


async def test_an_operator_reads_a_tickets_steps_and_a_failed_steps_traceback_in_a_real_browser(
    browser: WebDriver, db_path: str, tmp_path: Path,
) -> None:
    with start(db_path, tmp_path) as dashboard:
        async with corral.open_runtime(db_path, entities=ENTITIES) as rt:
            ticket = rt.ref(Ticket, fresh("ticket"))
            await ticket.start(start=TicketInput(log=str(tmp_path / "ticket.log")))
            await ticket.result(timeout=30)
            rows = await asyncio.to_thread(steps_walk, browser, dashboard, ticket.key)
    model, tool = rows
    assert model[1:4] == ["model:9104", "completed", "3"]
    assert model[6] == "host"
    assert tool[1:4] == ["tool:9104", "failed", "3"]
    assert tool[8].startswith("RuntimeError: tool for 9104 is down")
