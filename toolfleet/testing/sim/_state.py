"""The simulator's state server: the stores' real Lua scripts on an in-process Redis engine.

``StateServer`` is a fakeredis server (the same commands and the same Lua 5.1 the stores' scripts
run on redis-server; tests/unit/lua runs every script on both) on the simulator's loop and
clock, with what the simulator needs of a Redis in trouble:

- a reply lost after the command was applied (the client sees the connection drop);
- a primary and an asynchronous replica: the replica catches up whenever a durable write (a
  script the stores register durable: WAIT makes a replicated Redis hold its answer until a
  replica has it) returns; a failover promotes the replica, and the writes it had not
  received are lost (a world that draws no failover keeps no replica: ``replicating``);
- a client severed with its process: a crashed service writes nothing more.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable
from typing import Any

import fakeredis
from fakeredis._clients._async import FakeAsyncRedisConnection
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from kernel.stores.scripts import DURABLE


class Link:
    """One service's connection to the state server: what the simulator does to it."""

    def __init__(self, server: StateServer, name: str, *, observer: bool = False) -> None:
        self.server = server
        self.name = name
        self.observer = observer
        """The simulator's own look at the state: no failover breaks its connections."""
        self.severed = False
        """The service crashed: nothing it sends reaches the server any more."""
        self.lost = 0
        """Connections this service lost (a lost reply, a failover): its client's
        ``connections_lost``."""


class StateServer:
    """A fakeredis server with a replica, lost replies and severed clients."""

    def __init__(self, lose_reply: Callable[[str], bool]) -> None:
        self.engine = fakeredis.FakeServer(version=(7,))
        self.lose_reply = lose_reply
        """Asked after each reply, with the service's name: True loses it (the command was
        applied)."""
        self.replica: dict[int, tuple[dict[bytes, Any], list[Any], float]] = {}
        self.replicating = True
        """Whether the replica follows the primary (False: no failover will come, and the
        copy of the data each durable write makes would be wasted)."""
        self.primary = 0
        """Which primary serves (each failover promotes a new one): a connection made to an
        earlier one is broken."""
        _with_sha1hex(self.engine)
        _compile_once(self.engine)
        self.replicate()

    def client(self, name: str, *, observer: bool = False) -> tuple[Redis, Link]:
        """A Redis client for service ``name`` (or the simulator itself: an ``observer``)
        and the link the simulator controls."""
        link = Link(self, name, observer=observer)
        # No socket timeout: redis-py would wrap every send in wait_for, a task per command.
        # No retry: a lost reply reaches the caller, as with the fleet's own clients (built
        # from a URL, whose connections retry nothing); redis-py's default would send the
        # command again by itself.
        redis = _SimRedis(
            server=self.engine,
            connection_class=_SimConnection,
            socket_timeout=None,
            retry=Retry(NoBackoff(), 0),
        )
        pool = redis.connection_pool
        make = pool.make_connection

        def made() -> _SimConnection:
            # One connection class for all (fakeredis keeps a record per class for good): the
            # link goes on each connection the pool makes.
            connection: _SimConnection = make()  # type: ignore[no-untyped-call]
            connection.link = link
            return connection

        pool.make_connection = made  # type: ignore[method-assign]
        redis.link = link
        return redis, link

    def replicate(self) -> None:
        """The replica catches up with the primary."""
        self.replica = {
            index: (copy.deepcopy(db._dict), list(db._expiry_heap), db.time)
            for index, db in self.engine.dbs.items()
        }

    def fail_over(self) -> None:
        """Promote the replica: the primary's writes it had not received are gone."""
        if not self.replicating:
            raise RuntimeError("a failover without a replica: set replicating before the run")
        for index, db in self.engine.dbs.items():
            data, heap, at = self.replica.get(index, ({}, [], db.time))
            db._dict, db._expiry_heap, db.time = copy.deepcopy(data), list(heap), at
        self.primary += 1  # every connection to the old primary breaks

    def _applied(self, packed: bytes) -> None:
        if self.replicating and any(sha.encode() in packed for sha in DURABLE):
            self.replicate()


class _SimRedis(fakeredis.FakeAsyncRedis):
    """A fakeredis client with what the fleet's ``OutputGate`` asks of its Redis client."""

    link: Link

    @property
    def connections_lost(self) -> int:
        """Connections lost so far (``AutoPipelinedRedis.connections_lost``)."""
        return self.link.lost

    async def wait_for_replicas(self) -> None:
        """WAIT: the replica catches up (a harsher model than WAIT's, which waits only for
        what was written before it: here, what everyone wrote)."""
        await self.ping()
        if self.link.server.replicating:
            self.link.server.replicate()


class _SimConnection(FakeAsyncRedisConnection):
    """A fakeredis connection that a ``Link`` controls."""

    link: Link
    primary: int | None = None

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if self.link.severed:
            raise RedisConnectionError(f"simulated: {self.link.name} crashed")
        server = self.link.server
        if self.primary is None or self.link.observer:
            self.primary = server.primary
        elif self.primary != server.primary:
            self.link.lost += 1
            self.primary = None  # the pool reconnects it, to the new primary
            await self.disconnect()
            raise RedisConnectionError("simulated: the primary failed over")
        await super().send_packed_command(command, check_health)
        packed = command if isinstance(command, bytes) else b"".join(command)
        self.link.server._applied(packed)

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        response = await super().read_response(*args, **kwargs)
        server = self.link.server
        if server.lose_reply(self.link.name):
            self.link.lost += 1
            await self.disconnect()
            raise RedisConnectionError("simulated: the reply was lost (the command applied)")
        return response


def _with_sha1hex(engine: fakeredis.FakeServer) -> None:
    """Give the engine's Lua ``redis.sha1hex`` (redis-server has it; fakeredis not yet)."""
    primer = fakeredis.FakeRedis(server=engine)
    primer.eval("return 1", 0)  # makes the server's Lua runtime
    runtime: Any = engine._lua_runtime  # type: ignore[attr-defined]

    def sha1hex(value: bytes) -> bytes:
        data = value if isinstance(value, bytes) else str(value).encode()
        return hashlib.sha1(data, usedforsecurity=False).hexdigest().encode()

    runtime.globals().redis.sha1hex = sha1hex
    primer.close()


class _CompiledOnce:
    """The engine's Lua runtime, compiling each script's source once (as redis-server keeps
    a script it has loaded): fakeredis compiles a script's source on every call, and the
    admission script alone is 20 kB. Running a chunk compiled earlier is what ``execute``
    does after compiling it."""

    def __init__(self, runtime: Any) -> None:
        self._runtime = runtime
        self._chunks: dict[Any, Any] = {}

    def execute(self, code: Any) -> Any:
        """Run ``code`` (compiled the first time it is seen)."""
        chunk = self._chunks.get(code)
        if chunk is None:
            chunk = self._chunks[code] = self._runtime.compile(code)
        return chunk()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)


def _compile_once(engine: fakeredis.FakeServer) -> None:
    """Put ``_CompiledOnce`` between fakeredis and the engine's Lua runtime."""
    server: Any = engine
    server._lua_runtime = _CompiledOnce(server._lua_runtime)
