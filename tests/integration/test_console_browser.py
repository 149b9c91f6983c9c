"""The console in a real browser: headless Chromium (Debian's ``chromium``, driven by
Playwright) against the console and a real fleet, signing in through a real OpenID Connect
provider's login page (panva's oidc-provider, started by the test): an operator decides, a
viewer sees no decision buttons and is refused by the API, an operator of one tenant sees and
decides nothing of another, an identity without a role is refused, sign-out ends the session
at the provider too, and ``toolfleet console`` with nothing configured signs in through the
login URL it prints.

Screenshots of every test go to ``.artifacts/console/``; with
``TOOLFLEET_CONSOLE_SCREENSHOTS=docs`` (``make console-screenshot``) the live page's and a run
view's are also written there (``console.png``, ``console-run.png``), for the docs and the
README.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import os
import re
import shutil
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, BrowserContext, Locator, Page, async_playwright, expect
from pydantic import SecretStr
from redis.asyncio import Redis

from kernel.settings import Settings
from kernel.stores.keys import Keys
from kernel.stores.ledger import Ledger
from kernel.stores.registry import pinned_version, unpin_version
from kernel.stores.tasks import StoredTask, TaskStore
from schemas import ProgressEvent, TurnResult
from tests.conftest import wait_for
from tests.integration.console_support import (
    TRACE_TEMPLATE,
    ConsoleProcess,
    OidcProvider,
    console_fleet,
    free_socket,
    fresh_circuits,
    served_console,
    turn,
    url_of,
)
from tests.integration.console_tools import runs_key
from toolfleet.app.console import ConsoleOptions
from toolfleet.client import FleetClient
from toolfleet.testing import LocalFleet, connected_client, result_of

pytestmark = [pytest.mark.integration, pytest.mark.layout_free]

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).parents[2] / ".artifacts" / "console"
LIVE_WITHIN_S = 2.0
CLIENT_ID = "toolfleet-console"
CLIENT_SECRET = "client-secret-of-this-test-0123456789"
ACCOUNTS: dict[str, dict[str, Any]] = {
    "alice": {
        "email": "alice@corp", "email_verified": True, "name": "Alice",
        "toolfleet_roles": ["operator"], "toolfleet_tenants": ["*"],
    },
    "ana": {
        "email": "ana@acme.example", "email_verified": True,
        "toolfleet_roles": ["operator"], "toolfleet_tenants": ["acme"],
    },
    "victor": {
        "email": "victor@corp", "email_verified": True,
        "toolfleet_roles": ["viewer"], "toolfleet_tenants": ["*"],
    },
    "nemo": {"email": "nemo@corp", "email_verified": True, "toolfleet_tenants": ["*"]},
    "adele": {
        "email": "adele@corp", "email_verified": True,
        "toolfleet_roles": ["admin"], "toolfleet_tenants": ["*"],
    },
}  # fmt: skip
"""The identity provider's accounts (the login name) and their claims."""
ALICE = "oidc:alice@corp"


@pytest.fixture(autouse=True)
async def _fresh_circuits(redis: Redis, settings: Settings) -> None:
    await fresh_circuits(redis, settings)


@pytest.fixture(scope="module")
def fleet(settings: Settings, topics: list[str]) -> Iterator[LocalFleet]:
    with console_fleet(settings) as running:
        yield running


@pytest.fixture(scope="module")
async def client(fleet: LocalFleet, settings: Settings) -> AsyncIterator[FleetClient]:
    async with connected_client(fleet, settings) as fleet_client:
        yield fleet_client


@pytest.fixture(scope="module")
def console_socket() -> Iterator[socket.socket]:
    """The console's socket, bound first: its URL is the redirect URI the provider knows."""
    sock = free_socket()
    yield sock
    sock.close()


@pytest.fixture(scope="module")
async def provider(fleet: LocalFleet, console_socket: socket.socket) -> AsyncIterator[str]:
    """A real OpenID Connect provider with the console as its client; its issuer URL."""
    console_url = url_of(console_socket)
    client = {
        "client_id": CLIENT_ID,
        "client_secret": CLIENT_SECRET,
        "redirect_uris": [f"{console_url}/auth/callback"],
        "post_logout_redirect_uris": [f"{console_url}/auth/signed-out"],
        "grant_types": ["authorization_code"],
        "response_types": ["code"],
    }
    running = OidcProvider([client], ACCOUNTS, fleet.log_dir)
    try:
        yield await running.start()
    finally:
        running.stop()


@pytest.fixture(scope="module")
async def console(
    settings: Settings, client: FleetClient, provider: str, console_socket: socket.socket
) -> AsyncIterator[str]:
    """The console with OpenID Connect login through ``provider`` (the roles and tenants come
    from the provider's claims)."""
    update = {
        "trace_url_template": TRACE_TEMPLATE,
        "console_public_url": url_of(console_socket),
        "console_oidc_issuer": provider,
        "console_oidc_client_id": CLIENT_ID,
        "console_oidc_client_secret": SecretStr(CLIENT_SECRET),
        "console_oidc_scopes": "openid email profile toolfleet",
        "console_session_secret": SecretStr("session-secret-of-this-test-0123456789"),
    }
    options = ConsoleOptions(refresh_s=0.5)
    async with served_console(
        settings.model_copy(update=update), options, sock=console_socket
    ) as url:
        yield url


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


async def new_context(browser: Browser, base_url: str) -> BrowserContext:
    """A fresh browser profile (no cookies) that reaches nothing but this machine."""
    context = await browser.new_context(
        base_url=base_url,
        viewport={"width": 1440, "height": 900},
        color_scheme="dark",  # 3 a.m.
        reduced_motion="reduce",  # screenshots without a row's highlight half faded
    )
    await context.route(re.compile(r"^https?://(?!127\.0\.0\.1[:/])"), lambda r: r.abort())
    return context


async def sign_in(page: Page, login: str, path: str = "/") -> None:
    """Open ``path``: the console sends the browser to the provider, whose login form and
    consent page a person fills in; back on the console, the page has loaded."""
    await page.goto(path)
    form = page.locator("input[name=login]")
    await expect(form).to_be_visible()
    await form.fill(login)
    await page.locator("input[name=password]").fill("any password")
    await page.get_by_role("button", name="Sign-in").click()
    await page.get_by_role("button", name="Continue").click()  # consent, the first time


@pytest.fixture
async def signed_in(
    browser: Browser, console: str, request: pytest.FixtureRequest
) -> AsyncIterator[Any]:
    """Sign in as an account of the provider: ``await signed_in("alice")`` gives a fresh
    page, signed in; every page's last state is screenshotted when the test ends."""
    contexts: list[tuple[BrowserContext, Page]] = []

    async def open_as(login: str, path: str = "/") -> Page:
        context = await new_context(browser, console)
        tab = await context.new_page()
        contexts.append((context, tab))
        await sign_in(tab, login, path)
        return tab

    try:
        yield open_as
    finally:
        for n, (context, tab) in enumerate(contexts):
            await shot(tab, f"{request.node.name}-end{'' if n == 0 else f'-{n}'}")
            await context.close()


@pytest.fixture
async def page(signed_in: Any) -> Page:
    """A fresh page, signed in as alice (an operator of every tenant) at the live page."""
    tab: Page = await signed_in("alice")
    await expect(page_ready(tab)).to_have_count(1)
    return tab


def page_ready(page: Page) -> Locator:
    """Present once the console's script has rendered the page."""
    return page.locator("body[data-ready]:not([data-ready=none])")


async def shot(page: Page, name: str) -> Path:
    """Screenshot ``page`` into the artifacts directory."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name.removeprefix('test_')}.png"
    await page.screenshot(path=str(path), full_page=True)
    return path


def _publish(screenshot: Path, name: str) -> None:
    """Copy a page's screenshot to TOOLFLEET_CONSOLE_SCREENSHOTS/NAME, when that (a folder:
    ``make console-screenshot`` sets ``docs``) is set."""
    folder = os.environ.get("TOOLFLEET_CONSOLE_SCREENSHOTS")
    if folder:
        shutil.copyfile(screenshot, Path(folder) / name)


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
    await expect(page.locator("#operator")).to_have_text(f"{ALICE} · operator")
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
    _publish(await shot(page, "live"), "console.png")

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

    # A failed call's page shows what the tool raised: its type, message and traceback.
    failed = f"{failing.run_id}-q"
    await page.goto(f"/calls/globex/{failed}?run={failing.run_id}")
    await expect(page.locator("h1")).to_have_text(f"call {failed}")
    await expect(page.locator("#failure")).to_contain_text("RuntimeError: quote v2 is broken")
    traceback = page.locator("#failure-traceback")
    await expect(traceback).to_contain_text("Traceback (most recent call last)")
    await expect(traceback).to_contain_text('raise RuntimeError("quote v2 is broken")')
    await shot(page, "failed-call")


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
    assert stored.resolution["decided_by"] == ALICE


async def test_an_operator_assigns_a_human_task_to_a_colleague_by_clicking(
    page: Page, client: FleetClient, fleet: LocalFleet, redis: Redis, keys: Keys
) -> None:
    event = turn("acme", ("n", "note", {"text": "n2", "mode": "apply_then_drop"}))
    await client.submit(event)
    task = await _task_for(redis, keys, event.function_calls[0].call_id)
    await page.goto("/tasks")
    row = page.locator(f'#tasks tr[data-task="{task.task.task_id}"]')
    await row.get_by_role("button", name="Assign…").click()
    form = page.locator("tr.form-row form")
    await form.locator("input[name=to]").fill("oidc:bob@corp")
    await form.get_by_role("button", name="Confirm assign").click()
    await expect(page.locator("#banner")).to_have_text(
        f"{task.task.task_id} is oidc:bob@corp's now."
    )
    await expect(row.locator(".assignee")).to_have_text(" · oidc:bob@corp")
    stored = await TaskStore(redis, keys).get(task.task.task_id)
    assert stored is not None and stored.assignee is not None
    assert (stored.assignee["to"], stored.assignee["by"]) == ("oidc:bob@corp", ALICE)
    answer = {"resolution": "applied", "output": "done"}  # leave nothing open
    await row.get_by_role("button", name="Resolve…").click()
    await page.locator("tr.form-row form input[name=output]").fill(answer["output"])
    await page.get_by_role("button", name="Confirm resolve").click()
    assert (await result_of(fleet, client, event.run_id)).status == "completed"


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
    await expect(page.locator("#banner")).to_contain_text(f"Approved {call_id} as {ALICE}")

    async def recorded() -> bool:  # the planner has the decision
        return bool(await redis.hexists(keys.approvals("acme", event.run_id), f"call:{call_id}"))

    await wait_for(recorded)
    await expect(row).to_contain_text(f"approved by {ALICE}")
    assert int(await redis.get(runs_key(call_id)) or 0) == 0  # nothing ran yet

    # The agent runtime resumes the turn: the approved call runs, once.
    done = await client.run_turn(event.model_copy(update={"resume": True}))
    assert (done.status, done.outputs[0].output) == ("completed", "transferred 250")
    assert int(await redis.get(runs_key(call_id)) or 0) == 1
    await expect(row).to_have_count(0)
    await page.goto(f"/calls/acme/{call_id}?run={event.run_id}")
    decision = page.locator("#audit tr[data-event=approval_decision]")
    await expect(decision).to_contain_text(f'"by":"{ALICE}"')


async def _fetch(page: Page, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    """``path`` fetched by the page's own script context (its session cookie; a POST with the
    session's CSRF token, as the console's page sends it): status and JSON."""
    status, data = await page.evaluate(
        """async ([path, body]) => {
          const config = await (await fetch("/api/config")).json();
          const init = body === null ? {} : {
            method: "POST", body: JSON.stringify(body),
            headers: { "Content-Type": "application/json", "X-Toolfleet-CSRF": config.csrf },
          };
          const response = await fetch(path, init);
          return [response.status, await response.json()];
        }""",
        [path, body],
    )
    return int(status), data


async def test_a_viewer_sees_no_decision_buttons_and_the_api_refuses_her_decisions(
    signed_in: Any, client: FleetClient, redis: Redis, keys: Keys
) -> None:
    event = turn("acme", ("t", "transfer", {"amount": 9, "to": "y"}))
    assert (await client.run_turn(event)).status == "interrupted"
    call_id = event.function_calls[0].call_id
    page: Page = await signed_in("victor", "/tasks")
    await expect(page.locator("#operator")).to_have_text("oidc:victor@corp · viewer")
    row = page.locator(f'#approvals tr[data-call="{call_id}"]')
    await expect(row).to_be_visible()  # a viewer reads
    await expect(row.get_by_role("button")).to_have_count(0)  # and has nothing to press
    await page.goto("/circuits")
    await expect(page_ready(page)).to_have_count(1)
    await expect(page.locator("#tools")).to_be_visible()
    await expect(page.locator("main button")).to_have_count(0)

    body = {"tenant_id": "acme", "run_id": event.run_id, "call_id": call_id, "approve": True}
    status, data = await _fetch(page, "/api/approvals/decide", body)
    assert status == 403, data
    assert "needs the operator role; oidc:victor@corp has the viewer role" in data["error"]
    assert not await redis.hexists(keys.approvals("acme", event.run_id), f"call:{call_id}")


async def test_an_admin_limits_a_tenant_on_the_fleet_page_and_a_viewer_has_nothing_to_press(
    signed_in: Any, client: FleetClient, redis: Redis, keys: Keys
) -> None:
    await client.run_turn(turn("acme", ("f", "lookup", {"city": "Lima"})))
    tenant = f"weighted-{time.monotonic_ns()}"
    page: Page = await signed_in("adele", "/fleet")
    await expect(page_ready(page)).to_have_count(1)
    await expect(page.locator("#pools tr.row", has_text="default")).to_be_visible()
    worker = page.locator("#workers tr.row", has_text="live")
    await expect(worker).to_have_count(1)
    await expect(worker).to_contain_text("lookup@")  # the tools it serves, and their versions

    await page.get_by_role("button", name="Limit a tenant…").click()
    form = page.locator("form.decision")
    await form.locator("input[name=name]").fill(tenant)
    await form.locator("input[name=weight]").fill("3")
    await form.locator("input[name=max_concurrency]").fill("4")
    await form.get_by_role("button", name="Confirm limits").click()
    await expect(page.locator("#banner")).to_have_text(f"{tenant}: max_concurrency=4 weight=3.")
    row = page.locator(f"#tenants tr.row[data-tenant='{tenant}']")
    await expect(row).to_contain_text("3")
    stored = await redis.hget(keys.admission("tenants"), tenant)
    assert stored is not None and json.loads(stored) == {"max_concurrency": 4, "weight": 3}

    viewer: Page = await signed_in("victor", "/fleet")
    await expect(viewer.locator(f"#tenants tr.row[data-tenant='{tenant}']")).to_be_visible()
    await expect(viewer.locator("main button")).to_have_count(0)
    status, data = await _fetch(viewer, f"/api/limits/tenants/{tenant}", {"clear": True})
    assert status == 403 and "needs the admin role" in data["error"], data
    await redis.hdel(keys.admission("tenants"), tenant)


async def test_an_operator_rejects_resolves_and_cancels_in_bulk_after_seeing_each_target(
    signed_in: Any, client: FleetClient, fleet: LocalFleet, redis: Redis, keys: Keys
) -> None:
    held = turn("acme", *((f"x{i}", "transfer", {"amount": i, "to": "z"}) for i in range(2)))
    assert (await client.run_turn(held)).status == "interrupted"
    lost = turn("acme", ("n", "note", {"text": "n9", "mode": "apply_then_drop"}))
    await client.submit(lost)
    task = await _task_for(redis, keys, lost.function_calls[0].call_id)
    ledger = Ledger(redis, keys)

    async def bulk(action: str, fill: dict[str, str], selects: dict[str, str], count: str) -> str:
        await page.locator("#bulk-action").select_option(action)
        for name, value in fill.items():
            await page.locator(f"#bulk-{name}").fill(value)
        for name, value in selects.items():
            await page.locator(f"#bulk-{name}").select_option(value)
        await page.get_by_role("button", name="Show what it touches").click()
        await expect(page.locator("#bulk-summary")).to_contain_text(count)
        await page.locator("#bulk-confirm").click()
        await expect(page.locator("#banner")).to_contain_text("done, 0 refused")
        return (await page.locator("#banner").text_content() or "").split(":")[0]

    page: Page = await signed_in("alice", "/bulk")
    await expect(page_ready(page)).to_have_count(1)
    fill = {"tenant": "acme", "tool": "transfer", "run": held.run_id}
    rejected = await bulk("reject", fill, {}, "2 calls (2 calls) would be touched")
    await expect(page.locator("#bulk-targets td.result.ok")).to_have_count(2)
    for call in held.function_calls:

        async def decided(call_id: str = call.call_id) -> bool:
            chain = await ledger.audit("acme", held.run_id, call_id)
            return any(e["event"] == "approval_decision" for e in chain)

        await wait_for(decided)
        chain = await ledger.audit("acme", held.run_id, call.call_id)
        assert [e["bulk"] for e in chain if e["event"] == "bulk_action"] == [rejected]
        assert [e["by"] for e in chain if e["event"] == "approval_decision"] == [ALICE]

    await page.reload()
    fill = {"tenant": "acme", "tool": "note", "output": "noted in bulk"}
    await bulk(
        "resolve", fill, {"task_kind": "unknown_effect", "resolution": "applied"}, "1 task (1 call)"
    )
    result = await result_of(fleet, client, lost.run_id)
    assert (result.status, result.outputs[0].output) == ("completed", "noted in bulk")
    stored = await TaskStore(redis, keys).get(task.task.task_id)
    assert stored is not None and stored.resolution is not None
    assert stored.resolution["decided_by"] == ALICE

    await page.reload()
    await bulk("cancel", {"tenant": "acme", "runs": held.run_id}, {}, "1 run (2 calls)")

    async def cancelled() -> bool:
        return await redis.exists(keys.cancelled("acme", held.run_id)) == 1

    await wait_for(cancelled)

    viewer: Page = await signed_in("victor", "/bulk")
    await expect(viewer.locator("#bulk-viewer")).to_be_visible()
    await expect(viewer.locator("main button, main form")).to_have_count(0)


async def test_the_history_pages_through_1050_turns_and_a_run_opens_down_to_a_traceback(
    signed_in: Any, client: FleetClient
) -> None:
    tenant = f"paged-{uuid.uuid4().hex[:6]}"
    results = [
        TurnResult(tenant_id=tenant, run_id=f"run-{i:04d}", turn_id=0, status="completed")
        for i in range(1_050)
    ]
    await asyncio.gather(*[await client.bus.publish("turn-results", r.run_id, r) for r in results])
    page: Page = await signed_in("alice", "/history")
    await expect(page_ready(page)).to_have_count(1)

    async def recorded() -> bool:
        cursor, seen = None, 0
        while True:
            query = f"tenant={tenant}&limit=500" + (f"&cursor={cursor}" if cursor else "")
            _, data = await _fetch(page, f"/api/history?{query}")
            seen += len(data["entries"])
            cursor = data["cursor"]
            if cursor is None:
                return seen == 1_050

    await wait_for(recorded, within=60)
    await page.locator("#history-tenant").fill(tenant)
    await page.get_by_role("button", name="Search").click()
    runs: list[str] = []
    for number in range(1, 22):
        await expect(page.locator("#history-info")).to_contain_text(f"page {number} ·")
        runs += await page.locator("#history tr.row").evaluate_all(
            "rs => rs.map(r => r.dataset.run)"
        )
        if number < 21:
            await page.get_by_role("button", name="Older →").click()
    assert await page.get_by_role("button", name="Older →").is_disabled()
    assert len(runs) == len(set(runs)) == 1_050  # every turn once: nothing skipped or repeated
    assert runs[0] == "run-1049" and runs[-1] == "run-0000"  # newest first
    await page.get_by_role("button", name="← Newer").click()
    await expect(page.locator("#history-info")).to_contain_text("page 20 ·")

    await page.locator("#history-run").fill("run-0007")
    await page.get_by_role("button", name="Search").click()
    await expect(page.locator("#history tr.row")).to_have_count(1)
    await expect(page.locator("#history tr.row")).to_contain_text("run-0007")

    failing = turn("acme", ("q", "quote", {"fail": True}), ("l", "lookup", {"city": "Rome"}))
    assert (await client.run_turn(failing)).status == "completed"
    await page.locator("#history-tenant").fill("acme")
    await page.locator("#history-run").fill(failing.run_id)
    await page.get_by_role("button", name="Search").click()
    row = page.locator("#history tr.row")
    await expect(row).to_have_count(1, timeout=20_000)
    await row.get_by_role("link", name=failing.run_id).click()
    await expect(page.locator("#run-id")).to_have_text(failing.run_id)
    quote = failing.function_calls[0].call_id
    call_row = page.locator(f"tr[data-call='{quote}']")
    await expect(call_row).to_contain_text("failed")
    await expect(
        page.locator(f"tr[data-call='{failing.function_calls[1].call_id}']")
    ).to_contain_text("Rome")  # what the model saw
    _publish(await shot(page, "run-view"), "console-run.png")
    await call_row.get_by_role("link", name=quote).click()
    await expect(page.locator("#failure-traceback")).to_contain_text("Traceback")


async def test_the_overview_draws_its_charts_and_a_tenant_scoped_operator_is_refused(
    signed_in: Any, client: FleetClient
) -> None:
    for i in range(3):
        await client.run_turn(turn("acme", ("v", "lookup", {"city": f"V{i}"})))
    page: Page = await signed_in("victor", "/overview")
    await expect(page.locator("body[data-charts='7']")).to_have_count(1)
    await expect(page.locator("#charts canvas")).to_have_count(7)
    await expect(page.locator("#chart-status")).to_contain_text("Calls per second, by status")
    await expect(page.locator("#overview-tenants tr[data-tenant='acme']")).to_be_visible(
        timeout=20_000
    )
    await page.get_by_role("button", name="24h").click()
    await expect(page.locator("#overview-status")).to_contain_text("24h in hours")
    _publish(await shot(page, "overview"), "console-overview.png")

    scoped: Page = await signed_in("ana", "/overview")
    await expect(scoped.locator("#banner")).to_contain_text("identity of every tenant")


async def test_an_admin_pins_tools_in_bulk_after_seeing_where_each_goes(
    signed_in: Any, redis: Redis, keys: Keys
) -> None:
    page: Page = await signed_in("adele", "/bulk?action=pin")
    await expect(page_ready(page)).to_have_count(1)
    await expect(page.locator("#bulk-tenant")).to_be_hidden()  # a pin touches every tenant
    await page.locator("#bulk-tool").fill("lookup")
    await page.get_by_role("button", name="Show what it touches").click()
    await expect(page.locator("#bulk-targets")).to_contain_text("lookup → version 1")
    await page.get_by_role("button", name="Pin 1 tool").click()
    await expect(page.locator("#banner")).to_contain_text("1 done, 0 refused")
    try:
        assert await pinned_version(redis, keys, "lookup") == "1"
    finally:
        await unpin_version(redis, keys, "lookup")


async def test_a_run_view_shows_a_running_calls_latest_progress(
    signed_in: Any, client: FleetClient
) -> None:
    run = f"busy-{uuid.uuid4().hex[:6]}"
    page: Page = await signed_in("alice", f"/runs/acme/{run}")
    await expect(page.locator("#run-id")).to_have_text(run)
    for sequence in (1, 2):
        event = ProgressEvent(
            tenant_id="acme", run_id=run, turn_id=0, call_id=f"{run}-c", tool_name="reindex",
            attempt=1, sequence=sequence, done=float(sequence), total=4.0,
            message=f"batch {sequence} of 4", at=time.time(),
        )  # fmt: skip
        await client.bus.publish_and_wait("progress", run, event)
    live = page.locator(f"#run-live tr[data-call='{run}-c']")
    await expect(live).to_contain_text("2 / 4 · batch 2 of 4 (attempt 1)")


async def test_an_operator_of_one_tenant_sees_and_decides_nothing_of_another(
    signed_in: Any, client: FleetClient, redis: Redis, keys: Keys
) -> None:
    page: Page = await signed_in("ana")
    await open_live(page)
    await expect(page.locator("#operator")).to_have_text("oidc:ana@acme.example · operator")
    run = f"shared-{time.monotonic_ns()}"
    theirs = turn("globex", ("a", "lookup", {"city": "Oslo"}), run_id=run)
    ours = turn("acme", ("a", "lookup", {"city": "Porto"}), run_id=run, turn_id=1)
    for event in (theirs, ours):
        await client.run_turn(event)
    await expect(turn_row(page, run, 1)).to_be_visible()  # after the other one, same partition
    await expect(turn_row(page, run, 0)).to_have_count(0)
    await expect(page.locator('#turns tr[data-tenant="globex"]')).to_have_count(0)
    await expect(page.locator('#outcomes tr[data-tenant="globex"]')).to_have_count(0)

    # Asking for the other tenant is refused, and the page says why.
    await page.keyboard.press("/")
    await page.keyboard.type("globex")
    await page.keyboard.press("Enter")
    await expect(page.locator("#banner")).to_contain_text(
        "tenant globex is not in the scope of oidc:ana@acme.example"
    )
    await expect(page.locator("#turns tr.row")).to_have_count(0)

    waiting = turn("globex", ("t", "transfer", {"amount": 11, "to": "z"}))
    assert (await client.run_turn(waiting)).status == "interrupted"
    call_id = waiting.function_calls[0].call_id
    await page.goto(f"/calls/globex/{call_id}?run={waiting.run_id}")
    await expect(page.locator("main .error")).to_contain_text("tenant globex is not in the scope")
    await page.goto("/tasks")
    await expect(page_ready(page)).to_have_count(1)
    await expect(page.locator("#approvals tr.row, #approvals tr.empty")).not_to_have_count(0)
    await expect(page.locator('#approvals tr[data-tenant="globex"]')).to_have_count(0)
    await expect(page.locator('#tasks tr[data-tenant="globex"]')).to_have_count(0)
    body = {"tenant_id": "globex", "run_id": waiting.run_id, "call_id": call_id, "approve": True}
    status, data = await _fetch(page, "/api/approvals/decide", body)
    assert status == 403 and "tenant globex" in data["error"], data
    status, data = await _fetch(page, f"/api/calls/globex/{call_id}?run={waiting.run_id}")
    assert status == 403, data
    assert not await redis.hexists(keys.approvals("globex", waiting.run_id), f"call:{call_id}")


async def test_an_identity_with_no_console_role_is_refused_at_sign_in(
    browser: Browser, console: str
) -> None:
    context = await new_context(browser, console)
    try:
        page = await context.new_page()
        await sign_in(page, "nemo")
        await expect(page.locator("h1")).to_have_text("Not allowed")
        await expect(page.locator("#auth-message")).to_contain_text(
            "oidc:nemo@corp has no console role: the claim toolfleet_roles"
        )
        assert (await page.request.get("/api/config")).status == 401  # no session was made
        await shot(page, "no-role")
    finally:
        await context.close()


async def test_signing_out_ends_the_console_session_and_the_providers(
    browser: Browser, console: str, provider: str
) -> None:
    context = await new_context(browser, console)
    try:
        page = await context.new_page()
        await sign_in(page, "alice")
        await expect(page.locator("#operator")).to_have_text(f"{ALICE} · operator")
        await page.get_by_role("button", name="Sign out").click()
        await expect(page).to_have_url(re.compile(f"^{re.escape(provider)}/session/end"))
        await page.get_by_role("button", name="Yes, sign me out").click()
        await expect(page).to_have_url(f"{console}/auth/signed-out")
        await expect(page.locator("h1")).to_have_text("Signed out")
        assert (await page.request.get("/api/config")).status == 401
        await page.goto("/")  # the provider asks for the login again: its session ended too
        await expect(page.locator("input[name=login]")).to_be_visible()
    finally:
        await context.close()


async def test_a_callback_replayed_in_another_browser_signs_nobody_in(
    browser: Browser, console: str
) -> None:
    first = await new_context(browser, console)
    other = await new_context(browser, console)
    try:
        page = await first.new_page()
        callbacks: list[str] = []
        page.on("request", lambda r: callbacks.append(r.url) if "/auth/callback" in r.url else None)
        await sign_in(page, "alice")
        await expect(page_ready(page)).to_have_count(1)
        [callback] = callbacks
        assert "code=" in callback and "state=" in callback
        # Its state lives in the first browser's session only (and the code is spent).
        intruder = await other.new_page()
        response = await intruder.goto(callback)
        assert response is not None and response.status == 401
        await expect(intruder.locator("h1")).to_have_text("Sign-in failed")
        assert (await intruder.request.get("/api/config")).status == 401
    finally:
        await first.close()
        await other.close()


async def test_toolfleet_console_with_nothing_configured_signs_in_with_the_url_it_prints(
    fleet: LocalFleet, browser: Browser, client: FleetClient
) -> None:
    process = ConsoleProcess(fleet)
    try:
        url = await process.start()
        assert re.fullmatch(r"console: http://127\.0\.0\.1:\d+/\?token=[\w-]{40,}", process.line)
        login_url = process.line.removeprefix("console: ")
        stranger = await new_context(browser, url)
        try:
            page = await stranger.new_page()
            response = await page.goto("/")
            assert response is not None and response.status == 401
            await expect(page.locator("#auth-message")).to_contain_text("login URL")
        finally:
            await stranger.close()
        context = await new_context(browser, url)
        try:
            page = await context.new_page()
            await page.goto(login_url)
            await expect(page).to_have_url(f"{url}/")  # the token is out of the address bar
            await expect(page.locator("#operator")).to_have_text(
                f"local:{getpass.getuser()} · admin"
            )
            await open_live(page)
            await shot(page, "local-login")
        finally:
            await context.close()
    finally:
        process.stop()
