"""The console in a real browser: headless Chromium (Debian's ``chromium``, driven by
Playwright) against ``toolfleet console`` and a real fleet.

Screenshots of every test go to ``.artifacts/console/``; with
``TOOLFLEET_CONSOLE_SCREENSHOT=docs/console.png`` (``make console-screenshot``) the live page's
is also written there, for the README.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, Locator, Page, async_playwright, expect
from redis.asyncio import Redis

from kernel.settings import Settings
from kernel.stores.keys import Keys
from kernel.stores.tasks import StoredTask, TaskStore
from tests.conftest import wait_for
from tests.integration.console_support import (
    TRACE_TEMPLATE,
    ConsoleProcess,
    console_fleet,
    turn,
)
from tests.integration.console_tools import runs_key
from toolfleet.client import FleetClient
from toolfleet.testing import LocalFleet, connected_client, result_of

pytestmark = [pytest.mark.integration, pytest.mark.layout_free]

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).parents[2] / ".artifacts" / "console"
OPERATOR = {"X-Forwarded-User": "alice"}
"""What the auth proxy in front of the console adds to every request."""
LIVE_WITHIN_S = 2.0


@pytest.fixture(scope="module")
def fleet(settings: Settings, topics: list[str]) -> Iterator[LocalFleet]:
    with console_fleet(settings) as running:
        yield running


@pytest.fixture(scope="module")
async def client(fleet: LocalFleet, settings: Settings) -> AsyncIterator[FleetClient]:
    async with connected_client(fleet, settings) as fleet_client:
        yield fleet_client


@pytest.fixture(scope="module")
async def console(fleet: LocalFleet, client: FleetClient) -> AsyncIterator[str]:
    """``toolfleet console`` behind a (simulated) auth proxy: the operator is the header's."""
    process = ConsoleProcess(
        fleet, "--refresh-s", "0.5", env={"TOOLFLEET_TRACE_URL_TEMPLATE": TRACE_TEMPLATE}
    )
    try:
        yield await process.start()
    finally:
        process.stop()


@pytest.fixture(scope="module")
def chromium() -> Path:
    """Debian's chromium: missing, the tests fail (they never skip)."""
    assert CHROMIUM.exists(), (
        f"{CHROMIUM} is missing: install Debian's chromium (scripts/install-chromium.sh, "
        "run by make setup)"
    )
    return CHROMIUM


@pytest.fixture(scope="module")
async def browser(chromium: Path) -> AsyncIterator[Browser]:
    """One headless Chromium for the module: Debian's, never a downloaded one."""
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=str(chromium), headless=True)
        yield launched
        await launched.close()


@pytest.fixture
async def page(
    browser: Browser, console: str, request: pytest.FixtureRequest
) -> AsyncIterator[Page]:
    """A fresh page as operator alice; its last state is screenshotted when the test ends."""
    context = await browser.new_context(
        base_url=console,
        extra_http_headers=OPERATOR,
        viewport={"width": 1440, "height": 900},
        color_scheme="dark",  # 3 a.m.
        reduced_motion="reduce",  # screenshots without a row's highlight half faded
    )
    tab = await context.new_page()
    try:
        yield tab
    finally:
        await shot(tab, f"{request.node.name}-end")
        await context.close()


async def shot(page: Page, name: str) -> Path:
    """Screenshot ``page`` into the artifacts directory."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name.removeprefix('test_')}.png"
    await page.screenshot(path=str(path), full_page=True)
    return path


def _publish(screenshot: Path) -> None:
    """Copy the live page's screenshot to TOOLFLEET_CONSOLE_SCREENSHOT, when it is set."""
    target = os.environ.get("TOOLFLEET_CONSOLE_SCREENSHOT")
    if target:
        shutil.copyfile(screenshot, target)


async def open_live(page: Page, path: str = "/") -> None:
    """Open the live page and wait until its event stream is connected."""
    await page.goto(path)
    await expect(page.locator("body[data-stream=open]")).to_have_count(1)
    await expect(page.locator("#feed")).to_have_text("feed: live")


def turn_row(page: Page, run_id: str, turn_id: int = 0) -> Locator:
    """The live page's row of one turn."""
    return page.locator(f'#turns tr[data-run="{run_id}"][data-turn="{turn_id}"]')


async def _task_for(redis: Redis, keys: Keys, call_id: str) -> StoredTask:
    async def find() -> StoredTask | None:
        return next(
            (t for t in await TaskStore(redis, keys).all() if t.task.call_id == call_id), None
        )

    return await wait_for(find, within=60)


async def test_the_console_loads_shows_turns_live_and_opens_a_call_from_the_keyboard(
    page: Page, client: FleetClient, redis: Redis, keys: Keys
) -> None:
    await open_live(page)
    await expect(page).to_have_title("toolfleet console")
    await expect(page.locator("#operator")).to_have_text("operator: alice")
    await page.keyboard.press("?")
    await expect(page.locator("#help")).to_be_visible()
    await page.keyboard.press("Escape")
    await expect(page.locator("#help")).to_be_hidden()

    # A few turns of every kind, for the page (and the README's screenshot).
    done = turn("acme", ("a", "lookup", {"city": "Lisbon"}), ("b", "book", {"seat": "12A"}))
    waiting = turn("acme", ("t", "transfer", {"amount": 5, "to": "x"}))
    failing = turn("globex", ("q", "quote", {"fail": True}))
    other = turn("globex", ("a", "lookup", {"city": "Oslo"}))
    for event in (done, waiting, failing, other):
        await client.run_turn(event)
    for event in (done, waiting, failing, other):
        await expect(turn_row(page, event.run_id)).to_be_visible()
    await expect(turn_row(page, waiting.run_id)).to_have_attribute("data-status", "interrupted")
    _publish(await shot(page, "live"))

    # j/k move through the rows, Enter opens the selected turn's call: the call's page.
    rows = page.locator("tr.row")
    await page.keyboard.press("j")
    await expect(rows.first).to_have_class(re.compile(r"\bselected\b"))
    selected = page.locator("tr.row.selected")
    while await selected.get_attribute("data-run") != done.run_id:
        await page.keyboard.press("j")
    await page.keyboard.press("Enter")
    call_id = f"{done.run_id}-a"
    await expect(page.locator("h1")).to_have_text(f"call {call_id}")
    await expect(page.locator("#arguments-digest")).to_be_visible()
    await expect(page.locator("#audit tr[data-event=finished]")).to_have_count(1)
    await expect(page.get_by_text("Lisbon", exact=False)).to_have_count(1)  # its output only

    # The trace link: the ledger's trace id, rendered with TOOLFLEET_TRACE_URL_TEMPLATE.
    ledger_key = keys.call("acme", done.run_id, call_id)
    trace_id = (await redis.hget(ledger_key, "trace_id") or b"").decode()
    if not trace_id:  # until the planner records traces: as it would
        trace_id = "0af7651916cd43dd8448eb211c80319c"
        await redis.hset(ledger_key, "trace_id", trace_id)
    await page.reload()
    link = page.locator("#trace-link")
    await expect(link).to_have_attribute("href", TRACE_TEMPLATE.format(trace_id=trace_id))
    await shot(page, "call")


async def test_a_submitted_turn_appears_live_within_2_s_of_its_result(
    page: Page, client: FleetClient
) -> None:
    await open_live(page)
    delays = []
    for n in range(3):
        event = turn("acme", ("a", "lookup", {"city": f"City {n}"}))
        await client.submit(event)
        await client.result(event.run_id, 0)
        received = time.monotonic()  # the client has the TurnResult
        await expect(turn_row(page, event.run_id)).to_be_visible(timeout=LIVE_WITHIN_S * 1000)
        delays.append(time.monotonic() - received)
    assert max(delays) <= LIVE_WITHIN_S, delays
    print(f"result to row: {', '.join(f'{d * 1000:.0f} ms' for d in delays)}")


async def test_a_tenant_filter_hides_other_tenants_turns(page: Page, client: FleetClient) -> None:
    run = f"shared-{time.monotonic_ns()}"  # one run id, two tenants: one partition, in order
    globex = turn("globex", ("a", "lookup", {"city": "Oslo"}), run_id=run)
    acme = turn("acme", ("a", "lookup", {"city": "Porto"}), run_id=run, turn_id=1)
    await open_live(page)
    for event in (globex, acme):
        await client.run_turn(event)
    await expect(turn_row(page, run, 0)).to_be_visible()
    await expect(turn_row(page, run, 1)).to_be_visible()

    await page.keyboard.press("/")  # focuses the tenant filter
    await page.keyboard.type("acme")
    await page.keyboard.press("Enter")
    await expect(page).to_have_url(re.compile(r"/\?tenant=acme$"))
    await expect(page.locator("body[data-stream=open]")).to_have_count(1)
    await expect(turn_row(page, run, 1)).to_be_visible()  # from the console's recent turns
    await expect(turn_row(page, run, 0)).to_have_count(0)
    await expect(page.locator('#turns tr[data-tenant="globex"]')).to_have_count(0)

    # Live too: the other tenant's next turn never shows; ours, right after it, does.
    later = turn("globex", ("a", "lookup", {"city": "Bergen"}), run_id=run, turn_id=2)
    ours = turn("acme", ("a", "lookup", {"city": "Faro"}), run_id=run, turn_id=3)
    for event in (later, ours):
        await client.run_turn(event)
    await expect(turn_row(page, run, 3)).to_be_visible()
    await expect(page.locator('#turns tr[data-tenant="globex"]')).to_have_count(0)
    await expect(page.locator('#outcomes tr[data-tenant="globex"]')).to_have_count(0)


async def test_an_operator_resolves_a_human_task_by_clicking(
    page: Page, client: FleetClient, fleet: LocalFleet, redis: Redis, keys: Keys
) -> None:
    event = turn("acme", ("n", "note", {"text": "n1", "mode": "apply_then_drop"}))
    await client.submit(event)
    call_id = event.function_calls[0].call_id
    task = await _task_for(redis, keys, call_id)
    await page.goto("/tasks")
    row = page.locator(f'#tasks tr[data-task="{task.task.task_id}"]')
    await expect(row).to_be_visible()
    await row.get_by_role("button", name="Resolve…").click()
    form = page.locator("tr.form-row form")
    await expect(form.locator("select[name=resolution]")).to_have_value("applied")
    await form.locator("input[name=output]").fill("noted, checked upstream")
    await form.locator("input[name=note]").fill("found it in the upstream's log")
    await shot(page, "resolve-form")
    await form.get_by_role("button", name="Confirm resolve").click()
    await expect(page.locator("#banner")).to_contain_text(f"Sent: {task.task.task_id} → applied")

    result = await result_of(fleet, client, event.run_id)
    assert (result.status, result.outputs[0].output) == ("completed", "noted, checked upstream")
    await expect(row).to_have_count(0)  # resolved: no longer in the queue
    stored = await TaskStore(redis, keys).get(task.task.task_id)
    assert stored is not None and stored.resolution is not None
    assert stored.resolution["decided_by"] == "alice"


async def test_an_operator_approves_a_pending_call_by_clicking_and_it_then_runs(
    page: Page, client: FleetClient, redis: Redis, keys: Keys
) -> None:
    event = turn("acme", ("t", "transfer", {"amount": 250, "to": "DE02 1203"}))
    first = await client.run_turn(event)
    assert first.status == "interrupted"
    call_id = event.function_calls[0].call_id
    await page.goto("/tasks")
    row = page.locator(f'#approvals tr[data-call="{call_id}"]')
    await expect(row).to_be_visible()
    await expect(row).not_to_contain_text("DE02")  # the arguments' digest, not their values
    await row.get_by_role("button", name="Approve").click()
    await page.get_by_role("button", name="Confirm approve").click()
    await expect(page.locator("#banner")).to_contain_text(f"Approved {call_id} as alice")

    async def recorded() -> bool:  # the planner has the decision
        return bool(await redis.hexists(keys.approvals("acme", event.run_id), f"call:{call_id}"))

    await wait_for(recorded)
    await expect(row).to_contain_text("approved by alice")
    assert int(await redis.get(runs_key(call_id)) or 0) == 0  # nothing ran yet

    # The agent runtime resumes the turn: the approved call runs, once.
    done = await client.run_turn(event.model_copy(update={"resume": True}))
    assert (done.status, done.outputs[0].output) == ("completed", "transferred 250")
    assert int(await redis.get(runs_key(call_id)) or 0) == 1
    await expect(row).to_have_count(0)
    await page.goto(f"/calls/acme/{call_id}?run={event.run_id}")
    decision = page.locator("#audit tr[data-event=approval_decision]")
    await expect(decision).to_contain_text('"by":"alice"')
