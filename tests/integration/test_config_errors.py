"""Configuration errors that explain: the real services, started as `toolfleet <service>`
processes with a Kafka or Redis they cannot use, say so in one line that names the setting,
then wait quietly; a dependency killed under a running fleet is one line when it goes and one
when it is back, and the fleet then works.

Seen before (the issue's reproductions on the last release): a planner with REDIS_URL on a
port where nothing listens wrote 174 tracebacks (670 KB) in 10 s; a cluster node given as
redis:// logged a MovedError traceback about 20 times a second; with the broker killed under
a running planner, the Kafka client logged 476 lines in 5 s.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot
from redis.exceptions import MovedError

from kernel.settings import Settings
from tests.conftest import port_is_free, wait_for
from tests.integration.test_pipeline import turn
from toolfleet.app.infra.kafka import kafka_status, start_kafka, stop_kafka
from toolfleet.app.infra.redis import redis_server, server_argv
from toolfleet.app.infra.redis_cluster import start_cluster, stop_cluster
from toolfleet.testing import LocalFleet, connected_client, result_of

TOOLS = "tests.integration.fleet_tools:tools"
SERVICES = ("planner", "aggregator", "reconciler", "worker-0")

WINDOW_S = 10.0
"""How long a waiting service is watched for what it writes."""
MOST_LINES = 4
"""What a service may write in all while it waits for a dependency: its metrics line, the one
clear line, and room for one more (a reason that changed, say). The last release wrote 148
JSON lines with 272 tracebacks in the same 10 s."""


def _free_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _records(log: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.splitlines() if line.startswith("{")]


def _count(log: str, prefix: str) -> int:
    return sum(1 for r in _records(log) if str(r.get("msg", "")).startswith(prefix))


async def _all_say(fleet: LocalFleet, prefix: str, names: tuple[str, ...], within: float) -> None:
    async def said() -> bool:
        return all(_count(fleet.logs(n), prefix) for n in names)

    await wait_for(said, within=within, interval=0.2)


async def _watch(fleet: LocalFleet, seconds: float) -> None:
    """The measured window: every service must stay up (waiting, not crash-looping)."""
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        fleet.check()
        await asyncio.sleep(0.2)  # wait-ok: the window over which log volume is measured


def _stops_cleanly(fleet: LocalFleet, names: tuple[str, ...]) -> None:
    for name in names:
        assert fleet.terminate(name, timeout=30) == 0, fleet.logs(name)[-2000:]


# --- a dependency that is not there --------------------------------------------------------
@pytest.mark.integration
@pytest.mark.layout_free
@pytest.mark.parametrize("dependency", ["redis", "kafka"])
async def test_every_service_names_an_unreachable_dependency_once_and_waits_quietly(
    settings: Settings, dependency: str
) -> None:
    port = _free_port()
    if dependency == "redis":
        update: dict[str, object] = {"redis_url": f"redis://127.0.0.1:{port}/0"}
        line = f"Redis unreachable at REDIS_URL=redis://127.0.0.1:{port}/0: connection refused"
    else:
        update = {"kafka_bootstrap_servers": f"127.0.0.1:{port}"}
        line = f"Kafka unreachable at KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:{port}: connection refused"
    bad = settings.model_copy(update={**update, "topic_prefix": f"{settings.topic_prefix}bad."})
    with LocalFleet(bad, tools=TOOLS, workers=1) as fleet:
        await _all_say(fleet, line, SERVICES, within=60)
        await _watch(fleet, WINDOW_S)
        for name in SERVICES:
            log = fleet.logs(name)
            assert _count(log, line) == 1, log
            assert "Traceback" not in log, log
            assert len(log.splitlines()) <= MOST_LINES, log
        _stops_cleanly(fleet, SERVICES)  # SIGTERM ends the wait at once


# --- a Redis Cluster node given as one server ----------------------------------------------
@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A private 3-master Redis Cluster; the port of its first master."""
    base = next(
        b for b in range(24_300, 25_600, 10)
        if all(port_is_free(p) and port_is_free(p + 10_000) for p in range(b, b + 3))
    )  # fmt: skip
    own = Settings(
        state_dir=tmp_path_factory.mktemp("cluster"),
        redis_cluster_masters=3,
        redis_cluster_port=base,
    )
    start_cluster(own)
    try:
        yield base
    finally:
        stop_cluster(own)


@pytest.mark.integration
@pytest.mark.own_cluster
async def test_a_cluster_node_given_as_redis_url_is_named_with_the_url_to_use(
    settings: Settings, cluster: int
) -> None:
    node = redis.Redis(port=cluster)
    try:
        # A real cluster node: it answers PING, and MOVED for a key another master owns.
        elsewhere = next(k for k in (f"k{i}" for i in range(100)) if key_slot(k.encode()) > 11_000)
        with pytest.raises(MovedError):
            node.get(elsewhere)
    finally:
        node.close()
    url = f"redis://127.0.0.1:{cluster}/0"
    bad = settings.model_copy(
        update={"redis_url": url, "topic_prefix": f"{settings.topic_prefix}node."}
    )
    with LocalFleet(bad, tools=TOOLS, workers=1) as fleet:

        async def all_exited() -> bool:
            return not any(fleet.alive(name) for name in SERVICES)

        await wait_for(all_exited, within=60, interval=0.2)
        for name in SERVICES:
            log = fleet.logs(name)
            assert fleet.terminate(name) == 78, log  # EX_CONFIG: waiting cannot fix it
            (said,) = [r for r in _records(log) if r["level"] == "error"]
            assert str(said["msg"]).startswith(f"REDIS_URL={url} names a node of a Redis Cluster")
            assert f"Use REDIS_URL=redis+cluster://127.0.0.1:{cluster} " in str(said["msg"])
            assert "Traceback" not in log and "MovedError" not in log, log
            assert len(log.splitlines()) <= 3, log


# --- a dependency killed under a running fleet -----------------------------------------------
class _PrivateRedis:
    """A redis-server of the test's own (durable, as toolfleet runs it), killed and started."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.port = _free_port()
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = (self.home / "redis.log").open("ab")
        argv = server_argv(redis_server(), self.port, self.home)
        self.popen = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        client = redis.Redis(port=self.port, socket_connect_timeout=1)
        try:
            while True:
                try:
                    if client.ping():
                        return
                except redis.ConnectionError:
                    assert time.monotonic() < deadline, "the private redis-server never answered"
                    time.sleep(0.05)  # wait-ok: polling interval of a deadline-bounded wait
        finally:
            client.close()

    def kill(self) -> None:
        assert self.popen is not None
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait()


@pytest.mark.integration
@pytest.mark.own_cluster
@pytest.mark.timeout(400)
async def test_redis_killed_under_a_running_fleet_is_one_line_gone_one_back_then_it_works(
    settings: Settings, topics: list[str], tmp_path: Path
) -> None:
    private = _PrivateRedis(tmp_path)
    private.start()
    own = settings.model_copy(
        update={
            "redis_url": f"redis://127.0.0.1:{private.port}/0",
            "topic_prefix": f"{settings.topic_prefix}rkill.",
        }
    )
    try:
        with LocalFleet(own, tools=TOOLS, workers=1) as fleet:
            async with connected_client(fleet, own) as client:
                before = await client.run_turn(turn(("a", "add", {"a": 1, "b": 2})), within=60)
                assert [o.output for o in before.outputs] == ["3"]
            written = {name: len(fleet.logs(name)) for name in SERVICES}
            private.kill()
            gone = f"Redis unreachable at REDIS_URL=redis://127.0.0.1:{private.port}/0"
            await _all_say(fleet, gone, SERVICES, within=30)
            await _watch(fleet, WINDOW_S)
            quiet = {name: len(fleet.logs(name)[written[name] :].splitlines()) for name in written}
            private.start()  # the same port and files: its data is back with it
            back = f"Redis reachable again at REDIS_URL=redis://127.0.0.1:{private.port}/0"
            await _all_say(fleet, back, SERVICES, within=60)
            async with connected_client(fleet, own) as client:
                after = turn(("b", "add", {"a": 2, "b": 3}))
                await client.submit(after)
                result = await result_of(fleet, client, after.run_id, within=90)
                assert [o.output for o in result.outputs] == ["5"]
            for name in SERVICES:
                since = fleet.logs(name)[written[name] :]
                assert quiet[name] <= 2, since  # the gone line (and nothing per attempt)
                assert (_count(since, gone), _count(since, back)) == (1, 1), since
                assert "Traceback" not in since, since
    finally:
        if private.popen is not None and private.popen.poll() is None:
            private.popen.terminate()
            private.popen.wait(timeout=30)


@pytest.mark.integration
@pytest.mark.own_cluster
@pytest.mark.timeout(500)
async def test_the_broker_killed_under_a_running_fleet_is_one_line_gone_one_back_then_it_works(
    settings: Settings, topics: list[str], tmp_path: Path
) -> None:
    broker = Settings(
        state_dir=tmp_path / "kafka",
        kafka_port=_free_port(),
        kafka_controller_port=_free_port(),
        kafka_heap="384m",
    )
    start_kafka(broker)
    servers = broker.kafka_servers()
    own = settings.model_copy(
        update={
            "kafka_bootstrap_servers": servers,
            "topic_prefix": f"{settings.topic_prefix}kkill.",
            "partitions": 2,
        }
    )
    try:
        with LocalFleet(own, tools=TOOLS, workers=1) as fleet:
            async with connected_client(fleet, own) as client:
                before = await client.run_turn(turn(("a", "add", {"a": 1, "b": 2})), within=60)
                assert [o.output for o in before.outputs] == ["3"]
            written = {name: len(fleet.logs(name)) for name in SERVICES}
            pid = kafka_status(broker).pid
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            gone = f"Kafka unreachable at KAFKA_BOOTSTRAP_SERVERS={servers}"
            await _all_say(fleet, gone, SERVICES, within=30)
            await _watch(fleet, WINDOW_S)
            quiet = {name: len(fleet.logs(name)[written[name] :].splitlines()) for name in written}
            start_kafka(broker)  # the same ports and data: the topics and groups are back
            back = f"Kafka reachable again at KAFKA_BOOTSTRAP_SERVERS={servers}"
            await _all_say(fleet, back, SERVICES, within=90)
            async with connected_client(fleet, own, within=180) as client:
                after = turn(("b", "add", {"a": 2, "b": 3}))
                await client.submit(after)
                result = await result_of(fleet, client, after.run_id, within=120)
                assert [o.output for o in result.outputs] == ["5"]
            for name in SERVICES:
                since = fleet.logs(name)[written[name] :]
                assert quiet[name] <= 2, since  # the gone line, none of aiokafka's
                assert (_count(since, gone), _count(since, back)) == (1, 1), since
                assert "Traceback" not in since, since
    finally:
        stop_kafka(broker)
