"""A local Redis Cluster: N masters (and R replicas of each) from the same redis-server binary.

Every node runs as the single server does (append-only file fsynced on every write, no RDB
snapshots), with ``cluster-enabled yes``, on loopback ports from ``redis_cluster_port`` up.
The first start forms the cluster (slots split evenly over the masters, replicas attached);
later starts find each node's ``nodes.conf`` and the cluster re-forms by itself.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import redis

from kernel.errors import InfrastructureError
from kernel.settings import Settings
from toolfleet.app.infra import process
from toolfleet.app.infra.process import ServiceStatus
from toolfleet.app.infra.redis import redis_server, server_argv

log = logging.getLogger(__name__)

SLOTS = 16_384
READY_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0


def cluster_dir(settings: Settings) -> Path:
    """Where the cluster's nodes keep their files, one folder per port."""
    return settings.state_dir / "redis-cluster"


def cluster_ports(settings: Settings) -> list[int]:
    """Every node's port: the masters first, then their replicas."""
    nodes = settings.redis_cluster_masters * (1 + settings.redis_cluster_replicas)
    return [settings.redis_cluster_port + i for i in range(nodes)]


def cluster_url(settings: Settings) -> str:
    """The REDIS_URL of the local cluster, naming every node (any one that answers serves as
    the seed, so a client can start while one of them is down)."""
    nodes = ",".join(f"127.0.0.1:{port}" for port in cluster_ports(settings))
    return f"redis+cluster://{nodes}"


def cluster_status(settings: Settings) -> ServiceStatus:
    """Running when every node of the cluster runs (from pid files; no network call)."""
    if settings.redis_cluster_masters == 0:
        return ServiceStatus("redis-cluster", "stopped", cluster_url(settings))
    states = [_node_status(settings, port) for port in cluster_ports(settings)]
    running = all(s.state == "running" for s in states)
    return ServiceStatus(
        "redis-cluster",
        "running" if running else "stopped",
        cluster_url(settings),
        pid=states[0].pid,
        log_file=states[0].log_file,
    )


def start_cluster(settings: Settings, *, timeout: float = READY_TIMEOUT) -> ServiceStatus:
    """Start every node that is not running and form the cluster if it is not formed yet;
    return once every node reports ``cluster_state:ok``."""
    if settings.redis_cluster_masters < 1:
        raise InfrastructureError(
            "TOOLFLEET_REDIS_CLUSTER_MASTERS is 0: set it to the number of masters (3, say)"
        )
    home = cluster_dir(settings)
    home.mkdir(parents=True, exist_ok=True)
    spawned: dict[int, int] = {}
    with process.file_lock(home / "lock"):
        server = redis_server()
        for port in cluster_ports(settings):
            if _node_status(settings, port).state == "running":
                continue
            process.ensure_port_free(port, "Redis Cluster", "TOOLFLEET_REDIS_CLUSTER_PORT")
            node = _node_dir(settings, port)
            node.mkdir(parents=True, exist_ok=True)
            argv = [
                *server_argv(server, port, node),
                "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", "3000",
            ]  # fmt: skip
            log_file = node / "redis.log"
            spawned[port] = process.spawn(argv, cwd=node, log_file=log_file, pid_file=node / "pid")
        deadline = time.monotonic() + timeout
        clients = {port: _client(port) for port in cluster_ports(settings)}
        try:
            for port, client in clients.items():
                alive = partial(_alive, spawned.get(port), _node_dir(settings, port) / "redis.log")
                _wait(deadline, f"node {port} to answer PING", partial(_pings, client, alive))
            _form(settings, clients, deadline)
        finally:
            for client in clients.values():
                client.close()
    return dataclasses.replace(cluster_status(settings), started=bool(spawned))


def stop_cluster(settings: Settings, *, timeout: float = STOP_TIMEOUT) -> list[int]:
    """Stop every node we started (SIGTERM: each fsyncs its file first); their pids.

    Every node folder is looked at, so a cluster started with other sizes stops too.
    """
    stopped: list[int] = []
    home = cluster_dir(settings)
    if not home.is_dir():
        return stopped
    with process.file_lock(home / "lock"):
        for node in sorted(p for p in home.iterdir() if p.is_dir()):
            pid = process.terminate(node / "pid", _matcher(node), timeout=timeout)
            if pid is not None:
                stopped.append(pid)
    return stopped


def _form(settings: Settings, clients: dict[int, redis.Redis], deadline: float) -> None:
    ports = list(clients)
    masters = ports[: settings.redis_cluster_masters]
    first = clients[masters[0]]
    if not _ok(first, len(ports)):
        for i, port in enumerate(masters):
            low = i * SLOTS // len(masters)
            high = (i + 1) * SLOTS // len(masters) - 1
            if not _owns_slots(clients[port]):
                _cluster(clients[port], "ADDSLOTSRANGE", low, high)
        for port in ports[1:]:
            _cluster(first, "MEET", "127.0.0.1", port)
        _wait(deadline, "every node to meet", lambda: _known(first) == len(ports))
        ids = {port: _cluster(clients[port], "MYID") for port in ports}
        for i, port in enumerate(ports[len(masters) :]):
            master = masters[i % len(masters)]
            replica = clients[port]
            _wait(
                deadline,
                f"node {port} to learn of its master",
                partial(_knows, replica, _text(ids[master])),
            )
            _cluster(replica, "REPLICATE", _text(ids[master]))
    shape = (len(masters), len(ports) - len(masters))
    for port, client in clients.items():
        _wait(deadline, f"node {port} to report cluster_state:ok", partial(_ok, client, 0))
        # Roles travel by gossip: a replica is one on every node before the cluster is ready.
        _wait(deadline, f"node {port} to see every role", partial(_roles_are, client, shape))
    for port, client in clients.items():
        # A replica counts (WAIT, a failover) once its link to its master is up and synced.
        # Every node is asked: after a failover, a first-start replica may be a master now.
        _wait(deadline, f"node {port} to sync with its master", partial(_synced, client))


def _node_status(settings: Settings, port: int) -> ServiceStatus:
    node = _node_dir(settings, port)
    return process.local_status(
        f"redis-{port}", f"redis://127.0.0.1:{port}", node / "pid", _matcher(node),
        node / "redis.log",
    )  # fmt: skip


def _node_dir(settings: Settings, port: int) -> Path:
    return cluster_dir(settings) / str(port)


def _matcher(node: Path) -> process.Matcher:
    home = str(node)

    def is_ours(proc: psutil.Process) -> bool:
        return proc.name() == "redis-server" and proc.cwd() == home

    return is_ours


def _client(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5, socket_connect_timeout=2)


def _alive(pid: int | None, log_file: Path) -> None:
    """Raise at once, with its log, when a node we just started has exited."""
    if pid is not None and not process.is_alive(pid):
        raise InfrastructureError(
            f"a Redis Cluster node (pid {pid}) exited during startup (is its port, or its "
            f"cluster bus port 10000 above it, in use?). Last lines of {log_file}:\n"
            f"{process.log_tail(log_file)}"
        )


def _pings(client: redis.Redis, alive: Callable[[], None]) -> bool:
    alive()
    try:
        return bool(client.ping())
    except redis.RedisError:  # LOADING while the append-only file is replayed
        return False


def _info(client: redis.Redis) -> dict[str, str]:
    raw = _text(_cluster(client, "INFO"))
    return dict(line.split(":", 1) for line in raw.splitlines() if ":" in line)


def _ok(client: redis.Redis, nodes: int) -> bool:
    info = _info(client)
    return info.get("cluster_state") == "ok" and int(info.get("cluster_known_nodes", 0)) >= nodes


def _known(client: redis.Redis) -> int:
    return int(_info(client).get("cluster_known_nodes", 0))


def _owns_slots(client: redis.Redis) -> bool:
    """Whether this node holds slots already (a formation that stopped half-way)."""
    for line in _text(_cluster(client, "NODES")).splitlines():
        fields = line.split()
        if len(fields) > 2 and "myself" in fields[2]:
            return len(fields) > 8
    return False


def _roles_are(client: redis.Redis, shape: tuple[int, int]) -> bool:
    """Whether this node sees (masters, replicas) as ``shape`` says."""
    roles = [line.split()[2] for line in _text(_cluster(client, "NODES")).splitlines()]
    return (sum("master" in r for r in roles), sum("slave" in r for r in roles)) == shape


def _synced(client: redis.Redis) -> bool:
    """A master, or a replica whose link to its master is up."""
    replication = client.info("replication")
    return replication.get("role") == "master" or replication.get("master_link_status") == "up"


def _knows(client: redis.Redis, node_id: str) -> bool:
    return node_id in _text(_cluster(client, "NODES"))


def _cluster(client: redis.Redis, *args: object) -> Any:
    """One CLUSTER subcommand (redis-py types execute_command loosely)."""
    return client.execute_command("CLUSTER", *args)  # type: ignore[no-untyped-call]


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _wait(deadline: float, what: str, check: Callable[[], bool]) -> None:
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise InfrastructureError(
        f"the local Redis Cluster: timed out waiting for {what}. Read the nodes' redis.log "
        "files under TOOLFLEET_STATE_DIR/redis-cluster, then `toolfleet infra down` and up."
    )
