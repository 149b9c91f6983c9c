"""The Redis edge: one auto-pipelining asyncio client per process, on a server or a cluster."""

from __future__ import annotations

import asyncio
import functools
import itertools
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, Literal, TypeVar
from urllib.parse import unquote, urlsplit

import hiredis
from redis._parsers.hiredis import NOT_ENOUGH_DATA, _AsyncHiredisParser
from redis.asyncio import BlockingConnectionPool, ConnectionPool, Redis
from redis.asyncio.client import Pipeline
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.client import EMPTY_RESPONSE, NEVER_DECODE
from redis.commands.core import AsyncScript
from redis.crc import key_slot
from redis.exceptions import (
    AskError,
    ClusterDownError,
    DataError,
    MasterDownError,
    NoScriptError,
    RedisError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from kernel.adapters.security import redact_url, redis_tls_options
from kernel.errors import (
    ConfigurationError,
    InfrastructureError,
    StateMayBeLostError,
    UnreplicatedWriteError,
)
from kernel.settings import Settings

K = TypeVar("K")
V = TypeVar("V")
Item = TypeVar("Item")
Reply = TypeVar("Reply")

HashFields = dict[bytes | bytearray | memoryview | str | int | float, str]
"""A mapping redis-py's ``hset`` accepts as it is typed (its key type is invariant)."""


# Commands that hold or change a connection's state: they never share a pipeline.
_OWN_CONNECTION = frozenset(
    {b"WATCH", b"UNWATCH", b"MULTI", b"EXEC", b"DISCARD", b"SELECT", b"SUBSCRIBE",
     b"PSUBSCRIBE", b"BLPOP", b"BRPOP", b"BLMOVE", b"BZPOPMIN", b"BZPOPMAX", b"XREAD",
     b"XREADGROUP", b"WAIT", b"CLIENT", b"MONITOR"}
)  # fmt: skip


_FLUSHES_IN_FLIGHT = 2
"""Bursts awaiting their replies at once, each on its own connection. With one, a call's
ledger step waited for the burst in flight and then for its own: I/O-bound tools held their
worker slot ~15 ms longer (the ledger gate runs inside the slot). With two, that wait
about halves; at full CPU load (bench (a)) one and two measured the same within noise."""

DURABLE = "toolfleet_durable"
"""Command option: the write must reach ``replica_acks`` replicas before it counts (WAIT)."""

BARRIER_KEY = "toolfleet:barrier"
"""The key ``wait_for_replicas`` writes before its WAIT (its value means nothing)."""

_BARRIER_TTL_MS = 60_000

_ROLE_TTL_S = 5.0
"""How long a client trusts what ROLE said about its primary's replicas."""

_NOT_FOR_CALLBACKS = frozenset({"keys", DURABLE, EMPTY_RESPONSE, NEVER_DECODE})
"""Options of redis-py's commands meant for its client, not for its reply callbacks."""

_Queued = tuple[tuple[Any, ...], Mapping[str, Any], "asyncio.Future[Any]"]


class AutoPipelinedRedis(Redis):
    """A client that sends the commands issued in one event-loop turn as one pipeline.

    A command sent with ``durable=True`` (``_BurstScript``) also waits for replicas: its burst
    ends with ``WAIT``, on the same connection, and the command fails with
    ``UnreplicatedWriteError`` when too few replicas acknowledged in time.

    A service handles many calls at once, and each call's Redis steps are small scripts:
    sent one by one, every step pays a pool checkout, a write and a read of its own. Queued
    and flushed on the next loop iteration instead (as ioredis' auto-pipelining does), a
    burst of N steps costs one round trip. Each caller still awaits its own reply and sees
    its own error; commands of one caller keep their order because it awaits each reply,
    and a non-transactional ``pipeline()`` joins the burst as a block, in its order. Two
    bursts may be in flight on different connections, so commands that different callers
    issue without awaiting each other have no order between them.
    """

    def __init__(
        self, *args: Any, replica_acks: int = 0, replica_timeout_ms: int = 1000, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.replica_acks = replica_acks
        """Replicas a durable command waits for (WAIT), at most as many as the primary has."""
        self.replica_timeout_ms = replica_timeout_ms
        self._replicas = 0
        self._role_read_at = float("-inf")
        self.connections_lost = 0
        """Bursts lost with their connection so far: after one, a failover may have taken
        back writes that were acknowledged (``OutputGate``)."""
        self._queued: list[_Queued] = []
        self._flushes: set[asyncio.Task[None]] = set()
        self._flush_scheduled = False
        self._scripts: dict[str, Any] = {}
        self._idle_connections: list[Any] = []
        """Burst connections kept out of the pool between bursts (one per flush in flight): a
        checkout and a release per burst cost more than the burst's own packing."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        """Give the burst connections back, then close as redis-py does."""
        while self._idle_connections:
            await self.connection_pool.release(self._idle_connections.pop())
        await super().aclose(close_connection_pool)

    def register_script(self, script: Any) -> AsyncScript:  # type: ignore[override]
        """As redis-py's, and remember the source: a flush reloads it after a Redis restart."""
        registered = _BurstScript(self, script)
        self._scripts[registered.sha] = registered.script
        return registered

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        """A transaction as usual; a plain pipeline that joins this loop turn's burst."""
        if transaction:
            return super().pipeline(transaction=True, shard_hint=shard_hint)
        return _BurstPipeline(self, self.enqueue)

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        """Queue the command for this loop turn's pipeline and wait for its reply."""
        name = args[0].encode() if isinstance(args[0], str) else args[0]
        if name.split(b" ")[0].upper() in _OWN_CONNECTION:
            return await super().execute_command(*args, **options)  # type: ignore[no-untyped-call]
        return await self.enqueue(args, options)

    def enqueue(self, args: tuple[Any, ...], options: Mapping[str, Any]) -> asyncio.Future[Any]:
        """Queue one command; the future gets its reply or its error."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._queued.append((args, options, future))
        self._schedule_flush()
        return future

    def _schedule_flush(self) -> None:
        # At most _FLUSHES_IN_FLIGHT round trips at once: what arrives meanwhile waits for
        # the next one, so under load the bursts grow instead of the number of round trips.
        if self._queued and not self._flush_scheduled and len(self._flushes) < _FLUSHES_IN_FLIGHT:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_queued)

    def _flush_queued(self) -> None:
        self._flush_scheduled = False
        batch, self._queued = self._queued, []
        task = asyncio.create_task(self._send(batch))
        self._flushes.add(task)
        task.add_done_callback(self._flushed)

    def _flushed(self, task: asyncio.Task[None]) -> None:
        self._flushes.discard(task)
        self._schedule_flush()

    async def _send(self, batch: list[_Queued]) -> None:
        try:
            replies = await self._exchange(batch)
            await self._reload_scripts(batch, replies)
        except BaseException as exc:  # the connection failed: every caller sees it
            self._role_read_at = float("-inf")  # a failover may follow: ask ROLE again
            self.connections_lost += 1
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (_, _, future), reply in zip(batch, replies, strict=True):
            if future.done():  # its caller was cancelled
                continue
            if isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    async def _reload_scripts(self, batch: list[_Queued], replies: list[Any]) -> None:
        """After a Redis restart emptied its script cache: load the scripts, run those again."""
        again = [
            i
            for i, ((args, _, _), reply) in enumerate(zip(batch, replies, strict=True))
            if isinstance(reply, NoScriptError) and args[1] in self._scripts
        ]
        if not again:
            return
        shas = {batch[i][0][1] for i in again}
        pipe = super().pipeline(transaction=False)
        for sha in shas:
            pipe.script_load(self._scripts[sha])
        await pipe.execute()
        for i, reply in zip(again, await self._exchange([batch[i] for i in again]), strict=True):
            replies[i] = reply

    async def _exchange(self, batch: list[_Queued]) -> list[Any]:
        """One round trip; a burst holding a durable command ends with WAIT, and when too few
        replicas acknowledge, every durable command of the burst fails (the write reached the
        primary alone: a failover could lose it)."""
        wanted = 0
        if self.replica_acks and any(options.get(DURABLE) for _, options, _ in batch):
            wanted = min(self.replica_acks, await self._replica_count())
        if not wanted:
            return await self._round_trip(batch)
        no_caller = asyncio.get_running_loop().create_future()
        wait: _Queued = (("WAIT", wanted, self.replica_timeout_ms), {}, no_caller)
        *replies, acknowledged = await self._round_trip([*batch, wait])
        if isinstance(acknowledged, int) and acknowledged >= wanted:
            return replies
        failure = UnreplicatedWriteError(
            f"{acknowledged!r} of {wanted} replicas acknowledged within "
            f"{self.replica_timeout_ms} ms: a failover could lose the write"
        )
        return [
            failure if options.get(DURABLE) and not isinstance(reply, Exception) else reply
            for (_, options, _), reply in zip(batch, replies, strict=True)
        ]

    async def wait_for_replicas(self, marker: str = BARRIER_KEY) -> None:
        """Return once ``replica_acks`` replicas (at most as many as the primary has; none:
        at once) hold every write the primary applied so far, from any connection; raise
        ``UnreplicatedWriteError`` when too few acknowledged in time. ``marker`` is a key
        this primary owns (on a cluster, one of its slots)."""
        if not self.replica_acks:
            return
        wanted = min(self.replica_acks, await self._replica_count())
        if not wanted:
            return
        # WAIT waits for the replication offset right after the last write of the connection
        # it runs on, and that connection may have written nothing lately: a write of its own
        # first gives it the offset of everything applied so far.
        pipe = self.pipeline(transaction=False)
        pipe.execute_command("SET", marker, b"", "PX", _BARRIER_TTL_MS)
        pipe.execute_command("WAIT", wanted, self.replica_timeout_ms)
        _, acknowledged = await pipe.execute()
        if not isinstance(acknowledged, int) or acknowledged < wanted:
            raise UnreplicatedWriteError(
                f"{acknowledged!r} of {wanted} replicas acknowledged within "
                f"{self.replica_timeout_ms} ms: a failover could lose the writes; nothing "
                "that depends on them was sent"
            )

    async def _replica_count(self) -> int:
        """How many replicas the primary has now (ROLE, read again every few seconds, so a
        replica that attaches or leaves is noticed)."""
        now = time.monotonic()
        if now - self._role_read_at > _ROLE_TTL_S:
            role = await super().execute_command("ROLE")  # type: ignore[no-untyped-call]
            self._replicas = len(role[2]) if _text(role[0]) == "master" else 0
            self._role_read_at = now
        return self._replicas

    async def _round_trip(self, batch: list[_Queued]) -> list[Any]:
        """Send a burst and read its replies: hiredis packs and parses, in one write and as
        few reads as the replies need (redis-py's pipeline spends ~20 µs of Python per
        command on packing, per-reply timeouts and dispatch)."""
        packed: list[bytes] = []
        replies: list[Any] = [None] * len(batch)
        sent: list[int] = []
        for i, (args, _, _) in enumerate(batch):
            try:
                packed.append(hiredis.pack_command(_split_name(args)))
                sent.append(i)
            except (TypeError, ValueError) as exc:  # a bad argument fails its own caller
                replies[i] = DataError(f"cannot send {args[0]!r}: {exc}")
        if not sent:
            return replies
        if self._idle_connections:
            conn = self._idle_connections.pop()
        else:
            conn = await self.connection_pool.get_connection()  # type: ignore[no-untyped-call]
            if not isinstance(conn._parser, _AsyncHiredisParser):
                await self.connection_pool.release(conn)
                raise RedisError("toolfleet needs the hiredis parser: pip install redis[hiredis]")
        try:
            parser: Any = conn._parser
            reader: Any = parser._reader
            # The connection's socket_timeout bounds the whole burst (redis-py applies it per
            # read; reading the parser directly, this client applies it here).
            async with asyncio.timeout(conn.socket_timeout):
                conn._writer.write(b"".join(packed))
                await conn._writer.drain()
                for i in sent:
                    reply = reader.gets()
                    while reply is NOT_ENOUGH_DATA:
                        await parser.read_from_socket()
                        reply = reader.gets()
                    replies[i] = self._reply(batch[i][0][0], batch[i][1], reply)
        except TimeoutError as exc:
            await conn.disconnect()
            await self.connection_pool.release(conn)
            raise RedisTimeoutError(
                f"Redis at {conn.host}:{conn.port} did not answer within {conn.socket_timeout} s"
            ) from exc
        except BaseException:
            # Replies still unread would be taken for the next burst's: drop the connection.
            await conn.disconnect()
            await self.connection_pool.release(conn)
            raise
        self._idle_connections.append(conn)
        return replies

    def _reply(self, command: Any, options: Mapping[str, Any], reply: Any) -> Any:
        """The reply as redis-py's own command methods return it (its response callbacks)."""
        if isinstance(reply, Exception):
            return options.get(EMPTY_RESPONSE, reply)
        callback = self.response_callbacks.get(command)
        if callback is None:
            return reply
        extra = {k: v for k, v in options.items() if k not in _NOT_FOR_CALLBACKS}
        return callback(reply, **extra)


def _split_name(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``("SCRIPT FLUSH", ...)`` as the server wants it: one word per argument (as redis-py
    packs command names)."""
    name = args[0]
    if isinstance(name, str | bytes) and len(words := name.split()) > 1:
        return (*words, *args[1:])
    return args


class _BurstScript(AsyncScript):
    """A script of an auto-pipelining client: plain EVALSHA, since a burst reloads lost
    scripts (on a cluster, each primary's burst reloads its own)."""

    async def __call__(
        self,
        keys: Sequence[Any] | None = None,
        args: Iterable[Any] | None = None,
        client: Any = None,
        *,
        durable: bool = False,
    ) -> Any:
        """Run the script (on ``client``, a pipeline of the same client, when given); a
        ``durable`` run returns once the client's ``replica_acks`` replicas have it."""
        keys = keys or ()
        target = self.registered_client if client is None else client
        options = {DURABLE: True} if durable else {}
        return await target.execute_command(
            "EVALSHA", self.sha, len(keys), *keys, *(args or ()), **options
        )


class _BurstPipeline(Pipeline):
    """``pipeline(transaction=False)`` of an auto-pipelining client: each command is handed
    to ``send`` (a burst's queue, or the primary of its slot) and the replies come in order."""

    def __init__(
        self,
        client: Redis,
        send: Callable[[tuple[Any, ...], Mapping[str, Any]], Awaitable[Any]],
    ) -> None:
        super().__init__(client.connection_pool, client.response_callbacks, False, None)
        self._send = send

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        """Send every command, wait for all replies (errors in place unless raising)."""
        stack, self.command_stack = self.command_stack, []
        self.scripts = set()  # the burst reloads scripts itself (see _send)
        sent = [self._send(args, options) for args, options in stack]
        replies = list(await asyncio.gather(*sent, return_exceptions=True))
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, BaseException):
                    raise reply
        return replies


@dataclass(frozen=True)
class RedisTarget:
    """What ``REDIS_URL`` names: one server, a cluster by some of its nodes, or the primary
    that Sentinels watch under a service name."""

    kind: Literal["single", "cluster", "sentinel"]
    url: str
    """The URL itself (for a single server, what redis-py is given)."""
    nodes: tuple[Node, ...] = ()
    """The cluster's seed nodes, or the Sentinels."""
    service: str = ""
    """The Sentinel service name of the primary."""
    db: int = 0
    username: str | None = None
    password: str | None = None


def parse_redis_url(url: str) -> RedisTarget:
    """Tell the forms of ``REDIS_URL`` apart (see ``connect_redis``); a malformed one is a
    ConfigurationError that shows the accepted forms."""
    parsed = urlsplit(url)
    scheme = parsed.scheme
    if scheme in ("redis", "rediss", "unix"):
        return RedisTarget("single", url)
    if scheme not in ("redis+cluster", "redis+sentinel"):
        raise ConfigurationError(
            f"REDIS_URL {redact_url(url)!r}: unknown scheme {scheme!r}. {_URL_FORMS}"
        )
    try:
        hosts = parsed.netloc.rsplit("@", 1)[-1]
        nodes = tuple(
            (host.rsplit(":", 1)[0], int(host.rsplit(":", 1)[1])) for host in hosts.split(",")
        )
    except (IndexError, ValueError):
        raise ConfigurationError(
            f"REDIS_URL {redact_url(url)!r}: every node needs host:port. {_URL_FORMS}"
        ) from None
    path = [part for part in parsed.path.split("/") if part]
    username = unquote(parsed.username) if parsed.username else None
    password = unquote(parsed.password) if parsed.password else None
    if scheme == "redis+cluster":
        if path not in ([], ["0"]):
            raise ConfigurationError(
                f"REDIS_URL {redact_url(url)!r}: a cluster has database 0 only. {_URL_FORMS}"
            )
        return RedisTarget("cluster", url, nodes, username=username, password=password)
    if not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ConfigurationError(
            f"REDIS_URL {redact_url(url)!r}: name the Sentinel service. {_URL_FORMS}"
        )
    db = int(path[1]) if len(path) == 2 else 0
    return RedisTarget(
        "sentinel", url, nodes, service=path[0], db=db, username=username, password=password
    )


_URL_FORMS = (
    "Use redis://[user:password@]host:port/db (or rediss://, unix://) for one server, "
    "redis+cluster://[user:password@]host:port[,host:port...] for a Redis Cluster, or "
    "redis+sentinel://[user:password@]host:port[,host:port...]/service[/db] for the primary "
    "that Sentinels watch."
)


def connect_redis(settings: Settings) -> Redis:
    """A Redis client for ``REDIS_URL``; replies stay bytes (Lua scripts return bytes).

    - ``redis://``, ``rediss://``, ``unix://``: one server, through an auto-pipelining
      client (``AutoPipelinedRedis``) whose pool blocks when every connection is busy
      (flushes wait their turn instead of failing with "too many connections").
    - ``redis+cluster://host:port[,host:port...]``: a Redis Cluster named by some of its
      nodes; one auto-pipelining client per primary, each command routed by its hash slot
      (``ClusterRedis``).
    - ``redis+sentinel://host:port[,host:port...]/service[/db]``: the primary that those
      Sentinels watch under ``service``; after a failover, connections follow the new one.

    Writes that gate user code wait for ``redis_wait_replicas`` replicas where the primary
    has them (``register_durable_script``).
    """
    target = parse_redis_url(settings.redis_address())
    durability = {
        "replica_acks": settings.redis_wait_replicas,
        "replica_timeout_ms": settings.redis_wait_timeout_ms,
    }
    if target.kind == "cluster":
        return ClusterRedis(
            target.nodes,
            max_connections=settings.redis_max_connections,
            username=target.username,
            password=target.password,
            **durability,
        )
    pool: ConnectionPool
    if target.kind == "sentinel":
        sentinels = Sentinel(  # type: ignore[no-untyped-call,unused-ignore]
            list(target.nodes), socket_connect_timeout=5, socket_timeout=5
        )
        pool = SentinelConnectionPool(  # type: ignore[no-untyped-call]
            target.service,
            sentinels,
            max_connections=settings.redis_max_connections,
            db=target.db,
            username=target.username,
            password=target.password,
        )
    else:
        # rediss://: TLS, with the CA and client certificate of the settings (an ACL user and
        # password come in the URL itself).
        tls = redis_tls_options(settings) if target.url.startswith("rediss://") else {}
        pool = BlockingConnectionPool.from_url(
            target.url, max_connections=settings.redis_max_connections, timeout=60, **tls
        )
    return AutoPipelinedRedis(connection_pool=pool, decode_responses=False, **durability)


def slot_bound(redis: Redis) -> bool:
    """Whether every command's keys must share one hash slot (a Redis Cluster): a batch of
    keys from several slot groups then needs a command per group; one server takes them all
    in one."""
    return isinstance(redis, ClusterRedis)


class SlotGroupBatches(Generic[Item, Reply]):
    """Requests handed in during one event-loop turn, written together by one script.

    Many calls reach the same ledger step at once (a worker starting a polled batch of
    commands, say): one script for all of them costs Redis one script's overhead instead of
    one per call. ``write(items)`` runs the script for one batch and returns one reply per
    item, in order; there is one batch per slot group on a Redis Cluster (a script's keys share
    one hash slot) and one for everything on a single server. A failed write fails every
    caller of its batch, and each retries its own request.
    """

    def __init__(
        self,
        write: Callable[[list[Item]], Awaitable[Sequence[Reply]]],
        *,
        per_slot_group: bool,
    ) -> None:
        self._per_slot_group = per_slot_group
        """As ``slot_bound`` says of the client that ``write`` uses."""
        self._write = write
        self._pending: dict[int, list[tuple[Item, asyncio.Future[Reply]]]] = {}
        self._writes: set[asyncio.Task[None]] = set()

    def submit(self, slot_group: int, item: Item) -> asyncio.Future[Reply]:
        """Queue ``item`` (whose keys are in ``slot_group``) for this loop turn's batch."""
        loop = asyncio.get_running_loop()
        reply: asyncio.Future[Reply] = loop.create_future()
        if not self._pending:
            loop.call_soon(self._write_pending)
        batch = self._pending.setdefault(slot_group if self._per_slot_group else 0, [])
        batch.append((item, reply))
        return reply

    def _write_pending(self) -> None:
        pending, self._pending = self._pending, {}
        for batch in pending.values():
            task = asyncio.create_task(self._write_batch(batch))
            self._writes.add(task)
            task.add_done_callback(self._writes.discard)

    async def _write_batch(self, batch: list[tuple[Item, asyncio.Future[Reply]]]) -> None:
        try:
            replies = await self._write([item for item, _ in batch])
        except BaseException as exc:
            for _, reply in batch:
                if not reply.done():
                    reply.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (_, reply), value in zip(batch, replies, strict=True):
            if not reply.done():
                reply.set_result(value)


def register_durable_script(redis: Redis, source: str) -> Callable[..., Awaitable[Any]]:
    """``redis.register_script(source)``, whose runs return only once the client's
    ``replica_acks`` replicas have their writes (WAIT; ``UnreplicatedWriteError`` otherwise).
    A plain redis-py client runs it as usual, waiting for no replica."""
    script = redis.register_script(source)
    if isinstance(script, _BurstScript):
        return partial(script, durable=True)
    return script


async def add_to_set(redis: Redis, key: str, member: str | int, ttl_s: int) -> None:
    """Add ``member`` to the set ``key`` and keep the set ``ttl_s`` from now (0: forever; a
    run's list of its turns, say, lasting as long as what it lists), in one round trip."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.sadd(key, member)
        if ttl_s > 0:
            pipe.expire(key, ttl_s)
        else:
            pipe.persist(key)
        await pipe.execute()


def text(value: bytes | str) -> str:
    """A Redis reply as text (the client keeps replies as bytes)."""
    return value.decode() if isinstance(value, bytes) else value


class BoundedCache(OrderedDict[K, V]):
    """A dict that forgets its oldest entries beyond ``max_entries`` (a process-local cache)."""

    def __init__(self, max_entries: int) -> None:
        super().__init__()
        self.max_entries = max_entries

    def __setitem__(self, key: K, value: V) -> None:
        super().__setitem__(key, value)
        while len(self) > self.max_entries:
            self.popitem(last=False)


# --- Redis Cluster -------------------------------------------------------------------------
# One auto-pipelining connection per primary, each command routed by its slot. Measured
# (bench/results/redis-clients.md): commands sent one by one, as redis-py's RedisCluster does,
# cost Redis 4-6x the CPU per operation of a pipelined burst; an AutoPipelinedRedis per
# primary, with commands routed by their key's hash slot, keeps the single-server cost per
# operation and adds the primaries' capacity. Every script's keys share one slot
# (kernel.stores.keys), so a command goes to exactly one primary; a MOVED reply (a slot
# migrated, a failover) refreshes the slot map and the command is sent again. Commands without
# a key (PING, SCRIPT LOAD, SCAN) go to any primary, or to each as they need.

SLOTS = 16_384
_KEYLESS = frozenset({b"PING", b"INFO", b"SCRIPT", b"CLUSTER", b"SCAN", b"TIME", b"DBSIZE"})
_MOVES = 5
_NODE_READ_TIMEOUT_S = 10.0
"""Times one command follows MOVED before it fails (a cluster still reshuffling its slots)."""

Node = tuple[str, int]


class ClusterRedis(Redis):
    """A Redis Cluster behind redis-py's command API, auto-pipelined per primary."""

    def __init__(
        self,
        seeds: Sequence[Node],
        *,
        max_connections: int,
        replica_acks: int = 0,
        replica_timeout_ms: int = 1000,
        username: str | None = None,
        password: str | None = None,
    ) -> None:
        super().__init__()
        self._seeds = list(seeds)
        self._seen: list[Node] = []
        self._loaded_at = float("-inf")
        """Every node the last CLUSTER SLOTS listed, replicas too: where a refresh asks."""
        self._username, self._password = username, password
        self._max_connections = max_connections
        self._replica_acks = replica_acks
        self._replica_timeout_ms = replica_timeout_ms
        self._nodes: dict[Node, AutoPipelinedRedis] = {}
        self._owner: list[Node] = []
        self._scripts: list[str] = []
        self._refresh: asyncio.Lock | None = None

    def register_script(self, script: Any) -> AsyncScript:  # type: ignore[override]
        """A script whose calls go to the primary of their keys' slot."""
        source = script.decode() if isinstance(script, bytes) else str(script)
        self._scripts.append(source)
        for node in self._nodes.values():
            node.register_script(source)
        return _BurstScript(self, source)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        """A pipeline whose commands each go to their slot's primary. A MULTI transaction
        spans one primary: use ``transaction`` with the keys it watches."""
        if transaction:
            raise InfrastructureError(
                "a MULTI pipeline on Redis Cluster must name its slot: use "
                "transaction(func, *watched_keys), with every key in one hash slot"
            )
        return _BurstPipeline(self, self._routed)

    async def transaction(
        self, func: Callable[[Pipeline], Any], *watches: Any, **kwargs: Any
    ) -> Any:
        """WATCH/MULTI/EXEC on the primary of ``watches``, which must share a hash slot (as
        must every key ``func`` writes); retried on a conflict, as redis-py's."""
        slots = {key_slot(k.encode() if isinstance(k, str) else bytes(k)) for k in watches}
        if len(slots) != 1:
            raise InfrastructureError(
                "a transaction on Redis Cluster watches keys of one hash slot; give them a "
                "common hash tag"
            )
        if not self._owner:
            await self._load_slots(time.monotonic())
        node = self._nodes[self._owner[slots.pop()]]
        return await node.transaction(func, *watches, **kwargs)

    def _routed(self, args: tuple[Any, ...], options: Mapping[str, Any]) -> Awaitable[Any]:
        return self.execute_command(*args, **options)

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        """Close every primary's connections."""
        for node in self._nodes.values():
            await node.aclose()
        self._nodes.clear()

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        """Send one command to the primary that owns its key (or to any, without a key)."""
        name = args[0].encode() if isinstance(args[0], str) else args[0]
        verb = name.split(b" ")[0].upper()
        if not self._owner:
            await self._load_slots(time.monotonic())
        if verb in _KEYLESS:
            node = self._nodes[self._owner[0]]  # a current primary
            return await node.execute_command(*args, **options)
        key = _first_key(verb, args)
        for _ in range(_MOVES):
            owner = self._nodes[self._owner[key_slot(key)]]
            sent_at = time.monotonic()
            try:
                return await owner.execute_command(*args, **options)
            except (AskError, TryAgainError, ClusterDownError, MasterDownError):
                # MOVED (an AskError) or ASK: the slot lives elsewhere now; TRYAGAIN,
                # CLUSTERDOWN, MASTERDOWN: a failover or a migration is under way.
                await self._load_slots(sent_at)
            except (RedisConnectionError, RedisTimeoutError):
                # The primary is away (a failover may be under way), or loading its data after
                # a restart (BusyLoadingError is a ConnectionError): the next attempt asks the
                # cluster who owns the slot now; the caller retries as after any outage.
                await self._load_slots(sent_at)
                raise
        raise InfrastructureError(
            f"Redis Cluster kept moving the slot of {key!r}; check CLUSTER INFO on its nodes"
        )

    @property
    def connections_lost(self) -> int:
        """Bursts lost with their connection so far, on every primary."""
        return sum(node.connections_lost for node in self._nodes.values())

    async def wait_for_replicas(self) -> None:
        """``AutoPipelinedRedis.wait_for_replicas`` on every primary (at once)."""
        if not self._replica_acks:
            return
        if not self._owner:
            await self._load_slots(time.monotonic())
        first_slot: dict[Node, int] = {}
        for slot, node in enumerate(self._owner):
            first_slot.setdefault(node, slot)
        await asyncio.gather(
            *(
                self._nodes[node].wait_for_replicas(f"{BARRIER_KEY}:{{{_tag_of_slot(slot)}}}")
                for node, slot in first_slot.items()
            )
        )

    async def scan_iter(  # type: ignore[override]
        self, match: Any = None, count: int | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        """Every primary's keys that match, one primary after the other."""
        if not self._owner:
            await self._load_slots(time.monotonic())
        for primary in dict.fromkeys(self._owner):
            node = self._nodes[primary]
            async for key in node.scan_iter(match=match, count=count, **kwargs):
                yield key

    async def _load_slots(self, stale_since: float) -> None:
        """Ask the cluster who owns each slot, unless a refresh finished after
        ``stale_since`` (when the caller sent what failed): many callers failing at once
        share one refresh instead of queueing one each."""
        if self._refresh is None:
            self._refresh = asyncio.Lock()
        async with self._refresh:
            if self._owner and self._loaded_at > stale_since:
                return
            last: Exception | None = None
            # The nodes last seen serving first (a seed may be the node that just failed),
            # then every replica they listed, then the seeds of the URL.
            for seed in dict.fromkeys([*self._nodes, *self._seen, *self._seeds]):
                probe = Redis(
                    host=seed[0],
                    port=seed[1],
                    socket_connect_timeout=5,
                    # A node that accepts connections but does not answer (stopped, swapping)
                    # must not hold up the refresh: the next node is asked.
                    socket_timeout=5,
                    username=self._username,
                    password=self._password,
                )
                try:
                    ranges = await probe.execute_command("CLUSTER", "SLOTS")  # type: ignore[no-untyped-call]
                except Exception as exc:  # an unreachable seed: try the next one
                    last = exc
                    continue
                finally:
                    await probe.aclose()
                owner: list[Node] = [("", 0)] * SLOTS
                seen: list[Node] = []
                for low, high, primary, *replicas in ranges:
                    node = (_text(primary[0]), int(primary[1]))
                    owner[int(low) : int(high) + 1] = [node] * (int(high) - int(low) + 1)
                    self._connect(node)
                    seen += [node, *((_text(r[0]), int(r[1])) for r in replicas)]
                self._seen = seen
                self._owner = owner
                self._loaded_at = time.monotonic()
                return
            raise InfrastructureError(
                f"no node of the Redis Cluster at {self._seeds} answered CLUSTER SLOTS ({last!r})"
            )

    def _connect(self, node: Node) -> None:
        if node in self._nodes:
            return
        pool = BlockingConnectionPool(
            host=node[0],
            port=node[1],
            max_connections=self._max_connections,
            timeout=60,
            # A primary that stops answering (hung, or a replica now, stopped) fails the
            # command after this instead of holding it forever; the caller retries after a
            # refresh of the slot map. Longer than any WAIT a durable write may add.
            socket_timeout=_NODE_READ_TIMEOUT_S,
            username=self._username,
            password=self._password,
        )
        client = AutoPipelinedRedis(
            connection_pool=pool,
            decode_responses=False,
            replica_acks=self._replica_acks,
            replica_timeout_ms=self._replica_timeout_ms,
        )
        for source in self._scripts:
            client.register_script(source)
        self._nodes[node] = client


def _first_key(verb: bytes, args: tuple[Any, ...]) -> bytes:
    if verb in (b"EVALSHA", b"EVAL"):
        if int(args[2]) < 1:
            raise InfrastructureError("a script without keys cannot be routed in a cluster")
        key = args[3]
    else:
        key = args[1]
    return key.encode() if isinstance(key, str) else bytes(key)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@functools.cache
def _tag_of_slot(slot: int) -> str:
    """A hash tag whose keys live in ``slot`` (found once, by trying short ones)."""
    for n in itertools.count():
        if key_slot(str(n).encode()) == slot:
            return str(n)
    raise AssertionError("unreachable: every slot has a tag")  # pragma: no cover


class OutputGate:
    """What a service's Kafka output waits for: that Redis cannot take back the writes it
    depends on.

    Redis replicates asynchronously: a failover promotes a replica, and writes it had not
    received are gone although they were acknowledged. A record or an offset sent to Kafka
    after such writes would outlive them (a command whose plan is gone, an offset past an
    outcome nobody recorded). So before a service sends one, ``open`` waits for the replicas
    to hold every write so far (WAIT), and refuses when a connection to Redis was lost since
    the work began: the failover may have happened then, and the work must be done again.
    """

    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    def epoch(self) -> int:
        """How many connections the client has lost so far (work that began at one epoch and
        ends at another may have lost writes)."""
        return int(getattr(self.redis, "connections_lost", 0))

    async def open(self, since: int | None = None) -> None:
        """Return once the replicas hold every write so far; ``StateMayBeLostError`` when a
        connection was lost after epoch ``since`` (or the wait itself lost one),
        ``UnreplicatedWriteError`` when too few replicas acknowledged."""
        if since is not None and self.epoch() != since:
            raise StateMayBeLostError(
                "a connection to Redis was lost while this work was in hand: a failover may "
                "have taken its writes back; it is done again"
            )
        wait = getattr(self.redis, "wait_for_replicas", None)
        if wait is not None:
            await wait()
