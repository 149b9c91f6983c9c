"""Sentinel-managed Redis: the ledger through ``redis+sentinel://``, across a failover.

A private primary, its replica and one Sentinel (quorum 1) run from the same redis-server
binary, on their own loopback ports, durable as toolfleet runs every Redis.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
import redis

from kernel.adapters.redis import AutoPipelinedRedis, OutputGate, connect_redis
from kernel.errors import UnreplicatedWriteError
from kernel.settings import Settings
from kernel.stores.keys import Keys
from kernel.stores.ledger import Ledger, NewCall
from schemas import CallOutcome
from tests.conftest import port_is_free, wait_for
from toolfleet.app.infra.redis import redis_server, server_argv

pytestmark = [pytest.mark.integration, pytest.mark.own_cluster]

SERVICE = "tfprimary"


def _ready(port: int) -> bool:
    node = redis.Redis(port=port, socket_connect_timeout=1)
    try:
        return bool(node.ping())
    except redis.RedisError:
        return False
    finally:
        node.close()


def _synced(port: int) -> bool:
    node = redis.Redis(port=port, socket_connect_timeout=1)
    try:
        return node.info("replication").get("master_link_status") == "up"
    finally:
        node.close()


def _sentinel_knows_replica(port: int) -> bool:
    node = redis.Redis(port=port, decode_responses=True)
    try:
        replicas = node.sentinel_slaves(SERVICE)
    finally:
        node.close()
    return any(r.get("is_slave") and not r.get("is_sdown") for r in replicas)


@pytest.fixture(scope="module")
def sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int, int]]:
    """(primary, replica, sentinel) ports of a running Sentinel-managed pair."""
    base = next(b for b in range(25_500, 26_000, 10) if all(port_is_free(b + i) for i in range(3)))
    primary, replica, watcher = base, base + 1, base + 2
    home: Path = tmp_path_factory.mktemp("sentinel")
    server = redis_server()
    procs = []
    for port, extra in ((primary, []), (replica, ["--replicaof", "127.0.0.1", str(primary)])):
        folder = home / str(port)
        folder.mkdir()
        log = (folder / "redis.log").open("ab")
        argv = [*server_argv(server, port, folder), *extra]
        procs.append(subprocess.Popen(argv, cwd=folder, stdout=log, stderr=log))
    config = home / "sentinel.conf"
    config.write_text(
        f"port {watcher}\nbind 127.0.0.1\ndir {home}\n"
        f"sentinel monitor {SERVICE} 127.0.0.1 {primary} 1\n"
        f"sentinel down-after-milliseconds {SERVICE} 1000\n"
        f"sentinel failover-timeout {SERVICE} 10000\n"
    )
    log = (home / "sentinel.log").open("ab")
    procs.append(subprocess.Popen([server, str(config), "--sentinel"], stdout=log, stderr=log))
    try:
        for port in (primary, replica, watcher):
            _wait_sync(partial(_ready, port))
        _wait_sync(lambda: _synced(replica))
        # Sentinel learns of replicas from the primary's INFO (every 10 s): only a replica it
        # knows can be promoted.
        _wait_sync(lambda: _sentinel_knows_replica(watcher))
        yield primary, replica, watcher
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
            proc.wait(timeout=30)


def _wait_sync(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)  # wait-ok: polling interval of a deadline-bounded wait
    raise AssertionError("the Sentinel fixture did not come up within 60 s")


@pytest.fixture
async def ledger(sentinel: tuple[int, int, int]) -> AsyncIterator[Ledger]:
    settings = Settings(
        redis_url=f"redis+sentinel://127.0.0.1:{sentinel[2]}/{SERVICE}",
        topic_prefix=f"sentinel-{uuid.uuid4().hex[:6]}.",
    )
    client = connect_redis(settings)
    yield Ledger(client, Keys.of(settings))
    await client.aclose()


def _outcome(run: str, token: int) -> CallOutcome:
    return CallOutcome(
        tenant_id="acme", run_id=run, turn_id=0, call_id="c1", tool_name="tool", index=0,
        attempt=1, fencing_token=token, status="succeeded", effect="applied", output="done",
    )  # fmt: skip


async def test_the_output_gate_waits_for_the_replica_and_refuses_without_it(
    sentinel: tuple[int, int, int],
) -> None:
    """Before a service sends a record or an offset, its gate returns only once the replica
    holds every write so far (from any connection); a replica that does not answer in time
    makes it refuse (UnreplicatedWriteError), so nothing that depends on the writes leaves."""
    primary, replica_port, _ = sentinel
    client = AutoPipelinedRedis(port=primary, replica_acks=1, replica_timeout_ms=300)
    writer = redis.Redis(port=primary)
    replica = redis.Redis(port=replica_port)
    gate = OutputGate(client)
    try:
        writer.set("gate:written-elsewhere", "1")  # another connection's write
        await gate.open()
        assert replica.get("gate:written-elsewhere") == b"1"
        pid = int(replica.info("server")["process_id"])
        os.kill(pid, signal.SIGSTOP)
        try:
            writer.set("gate:unreplicated", "1")
            with pytest.raises(UnreplicatedWriteError):
                await gate.open()
        finally:
            os.kill(pid, signal.SIGCONT)
        _wait_sync(lambda: _synced(replica_port))
    finally:
        await client.aclose()
        writer.close()
        replica.close()


async def test_a_started_call_survives_a_sentinel_failover(
    ledger: Ledger, sentinel: tuple[int, int, int]
) -> None:
    primary, replica, _watcher = sentinel
    run = f"run-{uuid.uuid4().hex}"
    await ledger.create("acme", run, [NewCall("c1", "fp", "k", run, 0, "tool", None)])
    _attempt, token = await ledger.dispatch("acme", run, "c1") or (0, 0)
    verdict, _ = await ledger.begin("acme", run, "c1", token=token, worker_id="w", lease_s=60)
    assert verdict == "run"  # the replica acknowledged `started` (WAIT)
    node = redis.Redis(port=primary)
    pid = int(node.info("server")["process_id"])
    node.close()
    os.kill(pid, signal.SIGKILL)

    async def promoted() -> bool:
        try:
            entry = (await ledger.read("acme", run, ["c1"]))["c1"]
        except (redis.RedisError, OSError):
            return False  # Sentinel has not promoted the replica yet
        return entry.state == "started"

    await wait_for(promoted, within=60)
    role = redis.Redis(port=replica)
    assert role.info("replication")["role"] == "master"
    role.close()
    # The call is still started: a redelivery is refused, never run a second time.
    again, _ = await ledger.begin("acme", run, "c1", token=token, worker_id="w2", lease_s=60)
    assert again == "busy"
    assert await ledger.finish(_outcome(run, token)) == "ok"
