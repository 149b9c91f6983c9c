"""A local redis-server with an append-only file, so its data survives restarts."""

from __future__ import annotations

import dataclasses
import logging
import shutil
import time
from pathlib import Path

import psutil
import redis

from kernel.errors import InfrastructureError
from kernel.settings import Settings
from toolfleet.app.infra import process
from toolfleet.app.infra.process import ServiceStatus

log = logging.getLogger(__name__)

READY_TIMEOUT = 30.0
STOP_TIMEOUT = 30.0


def redis_dir(settings: Settings) -> Path:
    """Where this instance keeps its append-only file, log and pid file."""
    return settings.state_dir / "redis"


def redis_status(settings: Settings) -> ServiceStatus:
    """Whether the redis-server of ``settings`` is running, from its pid file (no network call)."""
    if settings.redis_external():
        return ServiceStatus("redis", "external", settings.redis_address())
    return process.local_status(
        "redis",
        settings.redis_address(),
        _pid_file(settings),
        _matcher(settings),
        _log_file(settings),
    )


def start_redis(settings: Settings, *, timeout: float = READY_TIMEOUT) -> ServiceStatus:
    """Start redis-server unless ours already runs, and wait until it answers PING.

    Blocking; from async code call it with ``asyncio.to_thread``. With REDIS_URL set
    nothing is started and the given URL is reported.
    """
    if settings.redis_external():
        return redis_status(settings)
    home = redis_dir(settings)
    home.mkdir(parents=True, exist_ok=True)
    with process.file_lock(home / "lock"):
        current = redis_status(settings)
        if current.state == "running":
            log.info("redis already running as pid %s", current.pid)
            _wait_ready(settings, current.pid, timeout)
            return current
        server = redis_server()
        process.ensure_port_free(settings.redis_port, "Redis", "TOOLFLEET_REDIS_PORT")
        argv = server_argv(server, settings.redis_port, home)
        pid = process.spawn(
            argv, cwd=home, log_file=_log_file(settings), pid_file=_pid_file(settings)
        )
        _wait_ready(settings, pid, timeout)
        return dataclasses.replace(redis_status(settings), started=True)


def server_argv(server: str, port: int, home: Path) -> list[str]:
    """How toolfleet runs a redis-server on loopback: durable, as production should be."""
    return [
        server,
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--appendonly", "yes",
        # 'always': the ledger's `started` must survive a Redis crash, or a call could
        # run twice. Redis fsyncs once per event-loop pass, so concurrent writers share it.
        "--appendfsync", "always",
        # No RDB snapshots on top: the AOF is the persistence, and a snapshot forks and
        # writes the whole dataset every minute a busy ledger changes 10,000 keys.
        "--save", "",
        # A ledger entry holds its outcome (~0.5 KB): with Redis's 64-byte default every
        # entry became a hash table of 2.1 KB; as a listpack it takes 1.1 KB.
        "--hash-max-listpack-value", "1024",
        "--dir", str(home),
        "--daemonize", "no",
    ]  # fmt: skip


def redis_server() -> str:
    """The redis-server binary, or an error that says how to install it."""
    server = shutil.which("redis-server")
    if server is None:
        raise InfrastructureError(
            "redis-server is not on PATH. Install it with scripts/install-redis.sh "
            "(or `apt-get install -y redis-server`), or point REDIS_URL at a running Redis, "
            "then run `toolfleet infra up` again."
        )
    return server


def stop_redis(settings: Settings, *, timeout: float = STOP_TIMEOUT) -> int | None:
    """Stop the redis-server we started; returns its pid.

    SIGTERM makes Redis fsync the append-only file before exiting, so nothing acknowledged
    is lost.
    """
    if settings.redis_external():
        return None
    with process.file_lock(redis_dir(settings) / "lock"):
        return process.terminate(_pid_file(settings), _matcher(settings), timeout=timeout)


def _pid_file(settings: Settings) -> Path:
    return redis_dir(settings) / "redis.pid"


def _log_file(settings: Settings) -> Path:
    return redis_dir(settings) / "redis.log"


def _matcher(settings: Settings) -> process.Matcher:
    home = str(redis_dir(settings))

    def is_ours(proc: psutil.Process) -> bool:
        # redis-server overwrites its argv with "redis-server 127.0.0.1:port", so the
        # command line cannot say which state dir it serves; its working directory (--dir)
        # can.
        return proc.name() == "redis-server" and proc.cwd() == home

    return is_ours


def _wait_ready(settings: Settings, pid: int | None, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last_error = "no answer yet"
    client = redis.Redis(
        host="127.0.0.1", port=settings.redis_port, socket_timeout=2, socket_connect_timeout=2
    )
    try:
        while time.monotonic() < deadline:
            if pid is not None and not process.is_alive(pid):
                raise InfrastructureError(
                    f"redis-server (pid {pid}) exited during startup. Read {_log_file(settings)}, "
                    f"fix the cause, then run `toolfleet infra up` again. Last lines:\n"
                    f"{process.log_tail(_log_file(settings))}"
                )
            try:
                # Answers LOADING (an error) until the append-only file is replayed.
                if client.ping():
                    return
            except redis.RedisError as exc:
                last_error = f"{type(exc).__name__}: {exc}"
            time.sleep(0.1)
    finally:
        client.close()
    raise InfrastructureError(
        f"redis-server did not answer PING on 127.0.0.1:{settings.redis_port} within "
        f"{timeout:.0f} s ({last_error}). Read {_log_file(settings)}; then "
        f"`toolfleet infra down` and `toolfleet infra up` again."
    )
