"""The fleet's tool directory as a client reads it: the compacted ``tools`` topic the workers
announce their tools on, on the real broker (a client reads no Redis)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from agents import Agent, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from redis.asyncio import Redis

from kernel.adapters.bus import KafkaBus
from kernel.adapters.topics import ensure_topics
from kernel.settings import Settings
from kernel.stores.registry import announce_tools, publish_tools
from schemas import ToolSpec
from tests.conftest import wait_for
from toolfleet.agents import FleetApprovalRequired, FleetRunner
from toolfleet.client import FleetClient
from toolfleet.testing import InProcessFleet

pytestmark = [pytest.mark.integration, pytest.mark.layout_free]


def _spec(name: str, version: str, **fields: object) -> ToolSpec:
    return ToolSpec.model_validate(
        {"name": name, "version": version, "pool": "default", "parameters": {}, **fields}
    )


@pytest.fixture
async def own(settings: Settings) -> AsyncIterator[Settings]:
    """Settings of a deployment of the test's own (its own topics), deleted afterwards."""
    mine = settings.model_copy(update={"topic_prefix": f"dir-{uuid.uuid4().hex[:8]}."})
    yield mine
    admin = AIOKafkaAdminClient(bootstrap_servers=mine.kafka_servers())
    await admin.start()
    try:
        made = [t for t in await admin.list_topics() if t.startswith(mine.topic_prefix)]
        if made:
            await admin.delete_topics(made)
    finally:
        await admin.close()


async def _compacted(settings: Settings, topic: str) -> bool:
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_servers())
    await admin.start()
    try:
        (described,) = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic, {"cleanup.policy": None})]
        )
    finally:
        await admin.close()
    (resource,) = described.resources
    return any(c[0] == "cleanup.policy" and c[1] == "compact" for c in resource[4])


async def test_a_client_knows_the_newest_announced_version_of_each_tool_and_later_ones(
    own: Settings,
) -> None:
    await ensure_topics(own)
    assert await _compacted(own, own.topic("tools"))
    bus = KafkaBus(own, service="worker-test")
    await bus.start()
    try:
        await announce_tools(
            bus,
            [
                _spec("book", "1"),
                _spec("book", "2", needs_approval="always"),
                _spec("weather", "1", namespace="info", effect_class="read_only"),
            ],
        )
        async with FleetClient(own) as client:
            # The first read waits until what the topic held is read: nothing is missing.
            specs = await client.tool_specs()
            assert set(specs) == {"book", "info.weather"}
            assert (specs["book"].version, specs["book"].needs_approval) == ("2", "always")
            assert specs["info.weather"].effect_class == "read_only"
            # A version announced later (a worker of a new release starting) reaches the
            # client without another read of its own.
            await announce_tools(bus, [_spec("book", "10")])

            async def newest_is_10() -> bool:
                return (await client.tool_specs())["book"].version == "10"

            assert await wait_for(newest_is_10)
    finally:
        await bus.stop()


async def test_before_the_topic_exists_every_tool_is_unknown_and_the_client_creates_nothing(
    own: Settings,
) -> None:
    await ensure_topics(own)
    admin = AIOKafkaAdminClient(bootstrap_servers=own.kafka_servers())
    await admin.start()
    try:
        await admin.delete_topics([own.topic("tools")])
        await wait_for(lambda: _absent(admin, own.topic("tools")))
        async with FleetClient(own) as client:
            assert await client.tool_specs(within=5) == {}
            # Naming the topic could have the broker create it, uncompacted: it was not.
            assert await _absent(admin, own.topic("tools"))
            # The services create it when they start; the client then reads it.
            await ensure_topics(own)
            bus = KafkaBus(own, service="worker-test")
            await bus.start()
            try:
                await announce_tools(bus, [_spec("book", "1", needs_approval="always")])
            finally:
                await bus.stop()

            async def known() -> bool:
                return "book" in await client.tool_specs()

            assert await wait_for(known, within=30)
        assert await _compacted(own, own.topic("tools"))
    finally:
        await admin.close()


async def _absent(admin: AIOKafkaAdminClient, topic: str) -> bool:
    return topic not in await admin.list_topics()


@pytest.mark.agent_runtime
async def test_a_gated_tool_the_client_has_not_read_is_held_and_the_run_fails_closed(
    settings: Settings, redis: Redis
) -> None:
    """A tool the registry gates but no worker announced (a worker of an earlier release
    serves it): FleetRunner does not know its gate, sends the call, and the planner holds it;
    the run fails with FleetApprovalRequired and the tool never runs. A tool a test fleet
    serves later reaches the client's directory."""
    name = f"transfer_{uuid.uuid4().hex[:8]}"
    ran: list[str] = []

    @function_tool(name_override=name)
    def transfer() -> str:
        """Moves money."""
        ran.append("transfer")
        return "sent"

    async with InProcessFleet(settings) as fleet:
        gated = _spec(name, "1", needs_approval="always", parameters={"type": "object"})
        await publish_tools(redis, fleet.keys, [gated.model_copy(update={"pool": fleet.pool})])
        assert name not in await fleet.client.tool_specs()
        model = ScriptedModel([[function_call(name, {}, call_id="c1")], [assistant_message("ok")]])
        runner = FleetRunner(fleet.client, tenant_id="acme", turn_timeout=30)
        with pytest.raises(FleetApprovalRequired):
            await runner.run(Agent(name="payer", model=model, tools=[transfer]), "pay")
        assert ran == []

        @function_tool(name_override=f"{name}_later", needs_approval=True)
        def later() -> str:
            """Served once the fleet runs."""
            return "later"

        await fleet.serve(later)

        async def announced_gated() -> bool:
            spec = (await fleet.client.tool_specs()).get(f"{name}_later")
            return spec is not None and spec.needs_approval == "always"

        assert await wait_for(announced_gated, within=30)
