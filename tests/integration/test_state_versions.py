"""The state version marker on the real Redis (and Kafka): what a service does at start, and
what ``toolfleet migrate`` writes. The decisions themselves: tests/unit/test_state_versions.py;
a whole rolling upgrade: tests/upgrade/."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from kernel.rules.state_versions import STATE_VERSION, Marker
from kernel.settings import Settings
from kernel.stores.keys import Keys
from kernel.stores.ledger import Ledger
from kernel.stores.schema import StateSchema, StateVersionError
from schemas import LONG_RUNNING_SPEC_FIELDS, ToolSpec
from tests.integration.test_long_running import TENANT, Upstream, one_call, registry
from toolfleet.testing import InProcessFleet, LocalFleet

pytestmark = pytest.mark.integration


@pytest.fixture
async def fresh(settings: Settings, redis: Redis, topics: list[str]) -> AsyncIterator[Settings]:
    """A deployment under a namespace of its own, nothing written in it yet (the session's
    clean-up deletes the topics a service started in it creates)."""
    mine = settings.model_copy(
        update={"topic_prefix": f"{settings.topic_prefix}sv{uuid.uuid4().hex[:6]}."}
    )
    yield mine
    keys = Keys.of(mine)
    for key in (keys.schema, keys.tools):  # one by one: different slots on a cluster
        await redis.delete(key)


def _toolfleet(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    fleet = LocalFleet(settings, tools="tests.integration.fleet_tools:tools")
    return subprocess.run(
        [sys.executable, "-m", "toolfleet", *args],
        env=fleet.env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def test_a_service_on_fresh_state_records_this_releases_version(
    fresh: Settings, redis: Redis
) -> None:
    schema = StateSchema(redis, Keys.of(fresh))
    assert await schema.check_start("planner") == STATE_VERSION
    marker = await schema.marker()
    assert marker is not None and (marker.version, marker.by) == (
        STATE_VERSION, "planner on fresh state",
    )  # fmt: skip
    assert await schema.check_start("aggregator") == STATE_VERSION  # found, not rewritten
    assert (await schema.marker()) == marker


async def test_a_service_on_state_that_ran_without_a_marker_reads_it_as_the_baselines(
    fresh: Settings, redis: Redis
) -> None:
    keys = Keys.of(fresh)
    await redis.hset(keys.tools, "add", "{}")  # a baseline worker published its tools
    schema = StateSchema(redis, keys)
    assert await schema.check_start("planner") == 1
    assert await schema.marker() is None  # the version is toolfleet migrate's to record


async def test_a_service_refuses_state_of_a_newer_release_and_exits_with_what_to_do(
    fresh: Settings, redis: Redis
) -> None:
    schema = StateSchema(redis, Keys.of(fresh))
    await schema.write(Marker(STATE_VERSION + 1, by="a newer toolfleet"))
    with pytest.raises(StateVersionError, match="written by a newer toolfleet"):
        await schema.check_start("planner")
    started = _toolfleet(fresh, "planner")  # the real service: it stops before it reads
    assert started.returncode == 78, started.stderr
    assert f"this deployment's state is at version {STATE_VERSION + 1}" in started.stderr


async def test_migrate_records_the_baselines_state_then_finish_raises_it_once(
    fresh: Settings, redis: Redis
) -> None:
    keys = Keys.of(fresh)
    await redis.hset(keys.tools, "add", "{}")
    dry = _toolfleet(fresh, "migrate", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "no version marker (the baseline release's state, version 1)" in dry.stdout
    assert "dry run: nothing written" in dry.stdout
    assert not await redis.exists(keys.schema)

    first = _toolfleet(fresh, "migrate")
    assert "done: state version 1 in force" in first.stdout, first.stdout + first.stderr
    again = _toolfleet(fresh, "migrate")
    assert "done: nothing to write" in again.stdout, again.stdout + again.stderr

    finished = _toolfleet(fresh, "migrate", "--finish")  # no service of this namespace runs
    assert f"done: state version {STATE_VERSION} in force" in finished.stdout, finished.stderr
    marker = await StateSchema(redis, keys).marker()
    assert marker is not None and (marker.version, marker.by) == (
        STATE_VERSION, "toolfleet migrate --finish",
    )  # fmt: skip
    done = _toolfleet(fresh, "migrate", "--finish")
    assert f"version {STATE_VERSION} already in force" in done.stdout, done.stderr
    assert "done: nothing to write" in done.stdout


async def test_migrate_refuses_state_of_a_newer_release(fresh: Settings, redis: Redis) -> None:
    await StateSchema(redis, Keys.of(fresh)).write(Marker(STATE_VERSION + 1))
    refused = _toolfleet(fresh, "migrate")
    assert refused.returncode == 1
    assert "written by a newer toolfleet" in refused.stderr


async def test_a_record_of_a_newer_release_is_refused_as_it_is_read(
    fresh: Settings, redis: Redis
) -> None:
    keys = Keys.of(fresh)
    entry = keys.call("acme", "run-1", "call-1")
    await redis.hset(entry, mapping={"state": "planned", "run_id": "run-1", "v": "99"})
    try:
        with pytest.raises(StateVersionError, match="a ledger entry of state version 99"):
            await Ledger(redis, keys).read("acme", "run-1", ["call-1"])
    finally:
        await redis.delete(entry)


async def test_an_operators_command_refuses_state_of_a_newer_release(
    fresh: Settings, redis: Redis
) -> None:
    await StateSchema(redis, Keys.of(fresh)).write(Marker(STATE_VERSION + 1))
    listed = _toolfleet(fresh, "tasks", "list")
    assert listed.returncode == 1
    assert "written by a newer toolfleet" in listed.stderr


async def test_until_version_3_is_in_force_specs_and_retries_are_as_version_2_reads_them(
    settings: Settings, redis: Redis
) -> None:
    """A rolling upgrade from version 2: the new release's worker publishes its tools without
    the timeouts a version-2 planner would refuse (it applies them itself), a retry does not
    carry the heartbeat details a version-2 worker would refuse (it starts over), and no call
    is deferred."""
    upstream = Upstream()
    fleet = InProcessFleet(settings, registry(upstream))
    await StateSchema(redis, fleet.keys).write(Marker(2, by="an upgrade in progress"))
    async with fleet:
        raw = await redis.hget(fleet.keys.tools, "sync_pages")
        assert raw is not None
        published = json.loads(raw)
        version_2_fields = set(ToolSpec.model_fields) - set(LONG_RUNNING_SPEC_FIELDS)
        assert set(published) <= version_2_fields, set(published) - version_2_fields
        event = one_call("sync_pages", {"pages": 6})
        result = await fleet.client.run_turn(event, within=60)
        assert result.outputs[0].output == "synced pages 0..5 in attempt 2"
        assert upstream.given == [(1, None), (2, None)]
        entry = await redis.hget(fleet.keys.call(TENANT, event.run_id, "c1"), "heartbeat")
        assert entry is not None  # kept in the ledger all the same (readers ignore the field)

        # No call is deferred: a version-2 worker would start a deferred call again.
        handed = await fleet.client.run_turn(one_call("hand_over", {}), within=60)
        (call,) = handed.calls
        assert (call.status, call.effect) == ("failed", "unknown"), call
        assert call.error is not None and call.error.type == "DeferredNotSupported"
