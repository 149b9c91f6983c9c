"""The stores' Lua scripts, each run on two backends: a private redis-server (a unix socket in a
temporary folder, no persistence) and the deterministic simulator's state server
(toolfleet.testing.sim), one of each per session, emptied before each test.

The simulator's state server runs the stores' real scripts on an in-process engine; running every
test here on both proves it runs them as redis-server does."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis

from kernel.stores.scripts import names, script
from toolfleet.app.infra.redis import redis_server
from toolfleet.testing.sim._state import StateServer

READY_WITHIN_S = 10.0


@pytest.fixture(scope="session")
def lua_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A redis-server of the session's own, on a unix socket (no port to collide on); the
    path of its socket."""
    home = tmp_path_factory.mktemp("lua-redis")
    sock = home / "redis.sock"
    argv = [
        redis_server(),
        "--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700",
        "--save", "", "--appendonly", "no", "--dir", str(home), "--daemonize", "no",
    ]  # fmt: skip
    with (home / "redis.log").open("wb") as log:
        server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=home)
    try:
        _wait_ready(sock, server, home / "redis.log")
        yield sock
    finally:
        server.terminate()
        server.wait(timeout=10)


def _wait_ready(sock: Path, server: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + READY_WITHIN_S
    client = redis.Redis(unix_socket_path=str(sock), socket_timeout=1)
    try:
        while True:
            if server.poll() is not None:
                raise AssertionError(f"redis-server exited: {log.read_text()[-2000:]}")
            try:
                if client.ping():
                    return
            except redis.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"redis-server never answered on {sock}")
            time.sleep(0.01)  # wait-ok: polling interval of a deadline-bounded wait
    finally:
        client.close()


class Lua:
    """Runs the stores' scripts by their SHA-1 (EVALSHA), as the stores do."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client

    def __call__(self, name: str, keys: Sequence[str], args: Sequence[Any] = ()) -> Any:
        """Run the script ``name`` (``ledger/begin``) with ``keys`` and ``args``."""
        return self.redis.evalsha(script(name).sha, len(keys), *keys, *args)


BACKENDS = ["redis-server", "sim-state"]
"""Where the scripts run: the private redis-server, and the simulator's state server."""


@pytest.fixture(scope="session", params=BACKENDS, ids=BACKENDS)
def lua_client(request: pytest.FixtureRequest) -> Iterator[redis.Redis]:
    """A client of the backend the test id names, with every script loaded."""
    client: redis.Redis
    if request.param == "redis-server":
        # Looked up here, not declared, so that the sim-state runs start no redis-server.
        sock: Path = request.getfixturevalue("lua_server")
        client = redis.Redis(unix_socket_path=str(sock))
    else:
        client = fakeredis.FakeRedis(server=StateServer(lambda _: False).engine)
    for name in names():
        assert client.script_load(script(name).source) == script(name).sha
    yield client
    client.close()


@pytest.fixture
def r(lua_client: redis.Redis) -> redis.Redis:
    """The backend, emptied (its scripts stay loaded)."""
    lua_client.flushall()
    return lua_client


@pytest.fixture
def lua(r: redis.Redis) -> Lua:
    """Runs a script on the emptied backend."""
    return Lua(r)
