"""Progress through the MCP door: ``notifications/progress`` for a call's progress token, in
order, its ``progress`` strictly increasing, and nothing shown twice after a worker is
SIGKILLed mid-call and the fleet runs the call again.

The fleet is processes (``LocalFleet``: planner, aggregator, reconciler and two workers
serving ``tests.integration.progress_tools``), so a worker can be SIGKILLed; the door is
served by uvicorn in this process over the same Kafka and Redis. The client is the ``mcp``
package's own, with a progress callback (a plain call) or a message handler (a task's
``tasks/result`` stream). The ``lockstep`` tool reports a step, then waits until the test
acknowledged it: the test acknowledges what the MCP client was shown, so each notification
arrived before the tool went on, and none can be coalesced or left behind the result.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp.client.client import Client
from mcp.client.session import IncomingMessage
from mcp.client.streamable_http import streamable_http_client
from pydantic import SecretStr
from redis.asyncio import Redis

from kernel.rules.mcp import META_RELATED_TASK, run_id_for
from kernel.settings import Settings
from kernel.stores.door import Stores
from schemas import ProgressEvent
from tests.conftest import wait_for
from tests.integration.progress_tools import ack_key, holder_key
from tests.integration.test_mcp_door import TENANT_A, free_socket, served, token, tokens_setting
from tests.integration.test_mcp_tasks import Created, call_meta, text_of
from toolfleet.app.mcp import DoorOptions, TaskLimits, create_app
from toolfleet.client import FleetClient
from toolfleet.testing import LocalFleet, connected_client

pytestmark = [pytest.mark.integration, pytest.mark.layout_free]

TOOLS = "tests.integration.progress_tools:tools"
WORKERS = 2
ENV = {"TOOLFLEET_PROGRESS_MIN_INTERVAL_S": "0"}  # lockstep: every report is an event anyway
KEY_META = "io.toolfleet/idempotency-key"
SESSION = uuid.uuid4().hex[:8]

REVISIONS = {"legacy": "2025-11-25", "auto": "2026-07-28"}
"""The revision each client mode speaks with the door."""

STEP = re.compile(r"(?:attempt (\d+): )?step (\d+) of (\d+)")


@pytest.fixture(scope="module")
def fleet(settings: Settings, topics: list[str]) -> Iterator[LocalFleet]:
    # A short lease: a killed worker's call is found lost soon after its group session ends.
    args = ["--lease-s", "2"]
    with LocalFleet(
        settings, tools=TOOLS, workers=WORKERS, worker_args=args, extra_env=ENV
    ) as running:
        yield running


@pytest.fixture(scope="module")
async def client(fleet: LocalFleet, settings: Settings) -> AsyncIterator[FleetClient]:
    async with connected_client(fleet, settings) as fleet_client:
        yield fleet_client


@pytest.fixture(scope="module")
async def door(client: FleetClient, settings: Settings) -> AsyncIterator[str]:
    """The door over the fleet (which serves its tools by now), with test_mcp_door's tokens;
    its MCP endpoint's URL."""
    door_settings = settings.model_copy(update={"mcp_tokens": SecretStr(tokens_setting())})
    options = DoorOptions(task_limits=TaskLimits(recheck_s=0.2))
    async with served(create_app(door_settings, options), free_socket()) as base:
        yield f"{base}/mcp"


def client_of(url: str, handler: Any = None, *, mode: Any = "legacy") -> Client:
    """The ``mcp`` client of the door as agent-a (tenant door-a), on the 2025-11-25
    handshake (``mode="auto"``: the 2026-07-28 revision); ``handler`` takes the server's
    notifications."""
    headers = {"Authorization": f"Bearer {token('agent-a')}"}
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=180))
    return Client(streamable_http_client(url, http_client=http), mode=mode, message_handler=handler)


class Notified:
    """The progress notifications a client was given, acknowledging each step shown to the
    lockstep tool."""

    def __init__(self, redis: Redis, call_id: str) -> None:
        self.seen: list[tuple[float, float | None, str | None]] = []
        self._redis = redis
        self._call_id = call_id

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        """A progress callback (``ClientSession.call_tool(progress_callback=...)``)."""
        self.seen.append((progress, total, message))
        found = STEP.fullmatch(message or "")
        assert found is not None, message
        attempt = int(found.group(1) or 1)
        await self._redis.set(ack_key(self._call_id, attempt, int(found.group(2))), 1)

    @property
    def progress(self) -> list[float]:
        """The ``progress`` of every notification, in the order given."""
        return [p for p, _, _ in self.seen]

    @property
    def shown(self) -> list[tuple[int, int]]:
        """(attempt, step) of every notification, as its message names them."""
        found = [STEP.fullmatch(m or "") for _, _, m in self.seen]
        return [(int(f.group(1) or 1), int(f.group(2))) for f in found if f is not None]

    async def has(self, progress: float) -> bool:
        """Whether a notification of ``progress`` was given (a wait_for probe)."""
        return progress in self.progress


class Events:
    """The run's progress events as a ``FleetClient.progress`` reader is shown them: what
    the tool reported, beside what the door sent."""

    def __init__(self, client: FleetClient, run_id: str) -> None:
        self.events: list[ProgressEvent] = []
        self._stream = client.progress(run_id, tenant_id=TENANT_A)
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Events:
        await self._stream.open()
        self._task = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *_: object) -> None:
        self._stream.close()
        if self._task is not None:
            await self._task

    async def _read(self) -> None:
        async for event in self._stream:
            self.events.append(event)

    @property
    def positions(self) -> list[tuple[int, int]]:
        """(attempt, sequence) of every event, in order."""
        return [(e.attempt, e.sequence) for e in self.events]

    async def has(self, position: tuple[int, int]) -> bool:
        """Whether the event at ``position`` was read (a wait_for probe)."""
        return position in self.positions


def keyed(key: str) -> Any:
    """A request's ``_meta`` with the door's idempotency key (the run id follows from it)."""
    return {KEY_META: key}


def increasing(values: list[float]) -> bool:
    """Whether ``values`` strictly increase."""
    return all(a < b for a, b in itertools.pairwise(values))


async def kill_the_holder(fleet: LocalFleet, redis: Redis, call_id: str) -> None:
    """SIGKILL the worker running ``call_id``'s first attempt, and start it again."""
    holder = await redis.get(holder_key(call_id))
    assert isinstance(holder, bytes), holder
    victim_pid = int(holder.decode().rsplit("-", 1)[1])
    victim = next(f"worker-{n}" for n in range(WORKERS) if fleet.pid(f"worker-{n}") == victim_pid)
    fleet.kill(victim)
    fleet.start_worker(int(victim.rsplit("-", 1)[1]))


async def let_the_retry_pass_what_was_shown(events: Events, redis: Redis, call_id: str) -> None:
    """The retry's steps 1 and 2 are not above the progress shown (2): no notification is
    sent for them, so the test acknowledges them once a fleet reader saw them reported."""
    for position in ((2, 1), (2, 2)):
        await wait_for(functools.partial(events.has, position), within=120)
        await redis.set(ack_key(call_id, *position), 1)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_plain_call_gets_its_progress_in_order(door: str, redis: Redis, mode: str) -> None:
    key = f"progress-plain-{mode}-{SESSION}"
    call_id = run_id_for(TENANT_A, key)  # the door's call id is its run id
    notified = Notified(redis, call_id)
    async with client_of(door, mode=mode) as mcp:
        assert mcp.session.protocol_version == REVISIONS[mode]
        result = await mcp.call_tool(
            "lockstep", {"steps": 4}, progress_callback=notified, meta=keyed(key)
        )
    assert result.is_error is False and text_of(result) == "4 steps"
    assert notified.seen == [(float(n), 4.0, f"step {n} of 4") for n in range(1, 5)]
    assert call_meta(result)["attempts"] == 1


async def test_a_worker_killed_mid_call_shows_no_progress_twice_and_none_goes_back(
    door: str, fleet: LocalFleet, client: FleetClient, redis: Redis
) -> None:
    key = f"progress-killed-{SESSION}"
    run_id = run_id_for(TENANT_A, key)
    call_id = run_id
    notified = Notified(redis, call_id)
    async with Events(client, run_id) as events, client_of(door) as mcp:
        calling = asyncio.create_task(
            mcp.call_tool(
                "lockstep",
                {"steps": 4, "stall_after": 2},
                progress_callback=notified,
                meta=keyed(key),
            )
        )
        # Attempt 1 holds the call after its second step: kill the worker running it.
        await wait_for(lambda: notified.has(2.0), within=120)
        await kill_the_holder(fleet, redis, call_id)
        await let_the_retry_pass_what_was_shown(events, redis, call_id)
        result = await calling
        await wait_for(lambda: events.has((2, 4)))

    # The call was lost with its worker; idempotent without a probe, the fleet ran it again
    # (attempt 2) and it ended with one result.
    assert result.is_error is False and text_of(result) == "4 steps"
    meta = call_meta(result)
    assert (meta["status"], meta["effect"], meta["attempts"]) == ("succeeded", "applied", 2)
    # Everything the tool reported, attempt 2 starting over ...
    assert events.positions == [(1, 1), (1, 2), (2, 1), (2, 2), (2, 3), (2, 4)]
    # ... reached the client with no step twice and progress never going back: the retry
    # was quiet until it passed what was shown, and says which attempt it is.
    assert notified.seen == [
        (1.0, 4.0, "step 1 of 4"),
        (2.0, 4.0, "step 2 of 4"),
        (3.0, 4.0, "attempt 2: step 3 of 4"),
        (4.0, 4.0, "attempt 2: step 4 of 4"),
    ]
    assert len(set(notified.shown)) == len(notified.shown)
    assert increasing(notified.progress)


class Related:
    """The ``notifications/progress`` a client's message handler was given."""

    def __init__(self, redis: Redis, call_id: str) -> None:
        self.params: list[types.ProgressNotificationParams] = []
        self.acks = Notified(redis, call_id)

    async def __call__(self, message: IncomingMessage) -> None:
        """A message handler: keeps progress notifications, acknowledges their steps."""
        if isinstance(message, types.ProgressNotification):
            self.params.append(message.params)
            p = message.params
            await self.acks(p.progress, p.total, p.message)


def task_call(key: str, progress_token: str) -> types.CallToolRequest:
    """A task-augmented ``tools/call`` of lockstep whose first attempt stalls after step 2,
    with a progress token and an idempotency key (so the test knows its task id)."""
    params = types.CallToolRequestParams.model_validate(
        {
            "name": "lockstep",
            "arguments": {"steps": 4, "stall_after": 2},
            "task": {},
            "_meta": {"progressToken": progress_token, KEY_META: key},
        }
    )
    return types.CallToolRequest(params=params)


def task_result(run_id: str) -> types.GetTaskPayloadRequest:
    """``tasks/result`` of ``run_id``'s task."""
    return types.GetTaskPayloadRequest(params=types.GetTaskPayloadRequestParams(task_id=run_id))


class Follows:
    """How many times the door began following a run's progress (its debug log line): a
    ``tasks/result`` stream gets only what is reported after that."""

    def __init__(self, caplog: pytest.LogCaptureFixture, run_id: str) -> None:
        caplog.set_level(logging.DEBUG, logger="toolfleet.app.mcp._progress")
        self._caplog = caplog
        self._run_id = run_id

    def count(self) -> int:
        """Relays opened for the run so far."""
        return sum(
            1
            for r in self._caplog.records
            if r.getMessage() == "MCP door follows a call's progress"
            and getattr(r, "run_id", None) == self._run_id
        )

    async def reach(self, n: int) -> None:
        """Wait until ``n`` relays were opened for the run."""

        async def reached() -> bool:
            return self.count() >= n

        await wait_for(reached, within=60)


async def test_a_task_gets_its_progress_on_tasks_result_under_its_token_across_streams(
    door: str,
    fleet: LocalFleet,
    client: FleetClient,
    redis: Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A task-augmented call with a progress token: each ``tasks/result`` stream gets the
    progress reported while it waits, under that token and naming the task; a later stream
    (a client that came back) starts above what an earlier one was sent, so a retry after a
    SIGKILLed worker never makes the token's progress go back."""
    progress_token = f"task-progress-{SESSION}"
    key = f"progress-task-{SESSION}"
    run_id = run_id_for(TENANT_A, key)
    follows = Follows(caplog, run_id)
    store = Stores(redis, fleet.settings).mcp_tasks()
    first = Related(redis, run_id)
    async with Events(client, run_id) as events:
        async with client_of(door, first) as mcp:
            created = await mcp.session.send_request(task_call(key, progress_token), Created)
            assert created.task.task_id == run_id
            waiting = asyncio.create_task(
                mcp.session.send_request(task_result(run_id), types.CallToolResult)
            )
            await follows.reach(1)
            # Step 1 may have been reported before this stream followed: acknowledged here.
            # Step 2 comes after, on the stream; then attempt 1 holds the call.
            await wait_for(lambda: events.has((1, 1)), within=120)
            await redis.set(ack_key(run_id, 1, 1), 1)
            await wait_for(lambda: first.acks.has(2.0), within=120)
            waiting.cancel()  # the client goes away, its stream with it
            with pytest.raises(BaseException):  # noqa: B017 - whatever the cancelled call raises
                await waiting

        async def noted() -> bool:
            record = await store.get(TENANT_A, run_id)
            return record is not None and record.progress_sent == 2.0

        await wait_for(noted)  # the progress sent under the token is kept with the task
        second = Related(redis, run_id)
        async with client_of(door, second) as mcp:
            waiting = asyncio.create_task(
                mcp.session.send_request(task_result(run_id), types.CallToolResult)
            )
            await follows.reach(2)
            await kill_the_holder(fleet, redis, run_id)
            await let_the_retry_pass_what_was_shown(events, redis, run_id)
            result = await waiting
        await wait_for(lambda: events.has((2, 4)))

    assert result.is_error is False and text_of(result) == "4 steps"
    meta = call_meta(result)
    assert (meta["status"], meta["effect"], meta["attempts"]) == ("succeeded", "applied", 2)
    assert (result.meta or {})[META_RELATED_TASK] == {"taskId": run_id}
    assert events.positions == [(1, 1), (1, 2), (2, 1), (2, 2), (2, 3), (2, 4)]
    # The first stream: step 2 (step 1 too if it was reported after the stream followed).
    assert first.acks.seen[-1:] == [(2.0, 4.0, "step 2 of 4")]
    assert first.acks.seen[:-1] in ([], [(1.0, 4.0, "step 1 of 4")])
    # The second: the retry, quiet until it passed 2, which it names.
    assert second.acks.seen == [
        (3.0, 4.0, "attempt 2: step 3 of 4"),
        (4.0, 4.0, "attempt 2: step 4 of 4"),
    ]
    sent = first.params + second.params
    assert {p.progress_token for p in sent} == {progress_token}
    assert all((p.meta or {}).get(META_RELATED_TASK) == {"taskId": run_id} for p in sent)
    progress = first.acks.progress + second.acks.progress
    assert increasing(progress)
    shown = first.acks.shown + second.acks.shown
    assert len(set(shown)) == len(shown)
    record = await store.get(TENANT_A, run_id)
    assert record is not None and record.progress_token == progress_token
    assert record.progress_sent == 4.0
