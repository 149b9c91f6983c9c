"""The ledger on a real 3-master Redis Cluster, through toolfleet's cluster client.

A private cluster (its own state dir and ports) serves this module, whichever Redis the rest
of the suite runs on (`make test` runs the integration suite on the shared local cluster too).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis

from kernel.adapters.redis import ClusterRedis, connect_redis
from kernel.settings import Settings
from kernel.stores.keys import Keys
from kernel.stores.ledger import Ledger, NewCall
from kernel.stores.registry import ToolDirectory, live_versions, publish_tools
from schemas import CallOutcome, ToolSpec
from tests.conftest import port_is_free
from toolfleet.app.infra.redis_cluster import start_cluster, stop_cluster

pytestmark = [pytest.mark.integration, pytest.mark.own_cluster]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    base = next(
        b for b in range(22_700, 24_000, 10)
        if all(port_is_free(p) and port_is_free(p + 10_000) for p in range(b, b + 3))
    )  # fmt: skip
    state: Path = tmp_path_factory.mktemp("cluster")
    settings = Settings(state_dir=state, redis_cluster_masters=3, redis_cluster_port=base)
    start_cluster(settings)
    try:
        yield settings.model_copy(
            update={"redis_url": f"redis+cluster://127.0.0.1:{base}/0", "topic_prefix": "c."}
        )
    finally:
        stop_cluster(settings)


@pytest.fixture
async def client(cluster: Settings) -> AsyncIterator[ClusterRedis]:
    connected = connect_redis(cluster)
    assert isinstance(connected, ClusterRedis)
    yield connected
    await connected.aclose()


def _outcome(run: str, call_id: str, token: int) -> CallOutcome:
    return CallOutcome(
        tenant_id="busy", run_id=run, turn_id=0, call_id=call_id, tool_name="tool", index=0,
        attempt=1, fencing_token=token, status="succeeded", effect="applied", output="done",
    )  # fmt: skip


async def test_200_runs_of_one_tenant_leave_ledger_keys_on_every_shard(
    client: ClusterRedis, cluster: Settings
) -> None:
    ledger = Ledger(client, Keys.of(cluster))
    for i in range(200):
        run = f"run-{uuid.uuid4().hex[:8]}-{i}"
        call = NewCall("call_0", "fp", f"idem-{i}", run, 0, "tool", "default")
        assert await ledger.create("busy", run, [call], dispatch=["call_0"]) == [(1, 1)]
    for port in range(cluster.redis_cluster_port, cluster.redis_cluster_port + 3):
        node = redis.Redis(port=port)
        try:
            assert int(node.dbsize()) > 0, f"no keys on the primary at port {port}"
        finally:
            node.close()


async def test_a_call_goes_through_the_ledger_on_the_cluster(
    client: ClusterRedis, cluster: Settings
) -> None:
    ledger = Ledger(client, Keys.of(cluster))
    run = f"run-{uuid.uuid4().hex}"
    await ledger.create("busy", run, [NewCall("c1", "fp", "k", run, 0, "tool", None)])
    _attempt, token = await ledger.dispatch("busy", run, "c1") or (0, 0)
    verdict, _ = await ledger.begin("busy", run, "c1", token=token, worker_id="w", lease_s=0.0)
    assert verdict == "run"
    expired = await ledger.expired_leases(now=1e12)  # every group's index, across primaries
    assert ("busy", run, "c1") in expired
    assert await ledger.finish(_outcome(run, "c1", token)) == "ok"
    entry = (await ledger.read("busy", run, ["c1"]))["c1"]
    assert entry.state == "finished"
    assert entry.outcome == _outcome(run, "c1", token)
    events = [e["event"] for e in await ledger.audit("busy", run, "c1")]
    assert events == ["planned", "dispatched", "started", "finished"]


async def test_tools_are_published_and_read_back_on_the_cluster(
    client: ClusterRedis, cluster: Settings
) -> None:
    keys = Keys.of(cluster)
    first = ToolSpec(name="add", pool="default", parameters={}, version="1")
    second = first.model_copy(update={"version": "2"})
    await publish_tools(client, keys, [second])
    await publish_tools(client, keys, [first])  # an older version published last
    live = await live_versions(client, keys, "add")
    assert sorted(live) == ["1", "2"]
    catalog = await ToolDirectory(client, keys).specs(needed=["add"])
    assert catalog["add"].version == "2"  # the newest live version stays the main entry
