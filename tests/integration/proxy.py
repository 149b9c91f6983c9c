"""TCP proxies a test can cut or bend.

``Proxy`` stands in front of one server (Redis) to make it disappear. ``KafkaProxy`` stands in
front of the Kafka broker: it reads every request's header (and, with aiokafka's own protocol
classes, its fields), lets a test delay, drop or cut the broker's answer to the requests it
picks, and keeps what went by for the test to read (``requests``, ``answers``).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import itertools
import pkgutil
import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from io import BytesIO
from typing import Any, Literal

import aiokafka.protocol
from aiokafka.protocol.api import Request, RequestStruct


class Proxy:
    """A TCP proxy to Redis that the test can cut (every connection dropped and refused)."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.cut = False
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut:
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self._writers |= {writer, up_writer}
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(source, sink))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await source.read(65536):
                if self.cut:
                    break
                sink.write(data)
                await sink.drain()
        sink.close()

    def sever(self) -> None:
        """Drop every connection and refuse new ones."""
        self.cut = True
        for writer in self._writers:
            writer.close()
        self._writers.clear()

    def heal(self) -> None:
        """Accept connections again."""
        self.cut = False

    async def stop(self) -> None:
        self.sever()
        if self._server is not None:
            self._server.close()
        for task in list(self._pipes):
            task.cancel()


PRODUCE, METADATA, FIND_COORDINATOR, INIT_PRODUCER_ID = 0, 3, 10, 22
ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN, TXN_OFFSET_COMMIT = 24, 25, 26, 28


@dataclass(frozen=True)
class Late:
    """The request itself reaches the broker ``seconds`` late, as a broker that had it queued
    would handle it: even if its client has given up and closed the connection (its answer
    then goes nowhere). Requests behind it on its connection wait with it."""

    seconds: float


@dataclass(frozen=True)
class Refused:
    """The broker's answer comes, but names error ``code`` (at its top, or for every
    partition) instead of what the broker said: the request was applied all the same."""

    code: int


Fault = Literal["cut", "drop"] | float | Late | Refused
"""What happens to a request or to the broker's answer: ``"cut"``, the answer is lost with its
connection (closed at once, the client sees the connection drop); ``"drop"``, it is lost and
so is every later answer on that connection (the client waits for its request timeout); a
number, it arrives that many seconds late (and the answers behind it with it: one connection's
answers come in order); ``Late``, the request reaches the broker late; ``Refused``, the answer
names an error the broker did not say."""


def _request_structs() -> dict[tuple[int, int], type[RequestStruct]]:
    """Every request aiokafka can send, by (api key, api version)."""
    for module in pkgutil.iter_modules(aiokafka.protocol.__path__):
        importlib.import_module(f"aiokafka.protocol.{module.name}")
    found: dict[tuple[int, int], type[RequestStruct]] = {}
    pending: list[type[Any]] = [Request]
    while pending:
        kind = pending.pop()
        pending += kind.__subclasses__()
        for version in getattr(kind, "_CLASSES", ()):
            found[(version.API_KEY, version.API_VERSION)] = version
    return found


_STRUCTS = _request_structs()


@dataclass(eq=False)
class KafkaRequest:
    """One request a client sent through the proxy."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    connection: int
    fields: dict[str, Any]
    """Its fields, by aiokafka's schema of its version (empty: a version it cannot read)."""
    fault: Fault | None = None
    """What the proxy does to its answer (None: nothing)."""

    @property
    def transactional_id(self) -> str | None:
        """The transactional id it names (None: not a transactional request)."""
        value = self.fields.get("transactional_id")
        return value if isinstance(value, str) else None

    def producer(self) -> tuple[int, int] | None:
        """The (producer id, epoch) it is sent under: its fields', or its record batches'."""
        if "producer_id" in self.fields and "producer_epoch" in self.fields:
            return int(self.fields["producer_id"]), int(self.fields["producer_epoch"])
        batches = self.batches()
        return (batches[0][2], batches[0][3]) if batches else None

    def batches(self) -> list[tuple[str, int, int, int, int]]:
        """The record batches of a produce request: (topic, partition, producer id, epoch,
        base sequence) of the first batch of each partition."""
        found = []
        for topic, partitions in self.fields.get("topics") or () if self.api_key == 0 else ():
            for partition, records in partitions:
                if records and len(records) >= 57:
                    producer_id, epoch, sequence = struct.unpack_from(">qhi", records, 43)
                    found.append((topic, partition, producer_id, epoch, sequence))
        return found


@dataclass(eq=False)
class KafkaAnswer:
    """The broker's answer to one request, whether or not the client got it."""

    request: KafkaRequest
    fields: dict[str, Any]
    delivered: bool


@dataclass
class Once:
    """A rule that gives ``fault`` to the first request ``matches`` picks, and nothing else."""

    matches: Callable[[KafkaRequest], bool]
    fault: Fault
    hit: KafkaRequest | None = None

    def __call__(self, request: KafkaRequest) -> Fault | None:
        """The fault for ``request`` (None: pass it on untouched)."""
        if self.hit is None and self.matches(request):
            self.hit = request
            return self.fault
        return None


@dataclass
class _Connection:
    number: int
    client: asyncio.StreamWriter
    broker: asyncio.StreamWriter
    waiting: deque[KafkaRequest] = field(default_factory=deque)
    """Requests whose answers have not come back, in the order they were sent."""
    stalled: bool = False
    client_gone: bool = False
    """The client closed the connection (the broker's side stays open for late requests)."""


class KafkaProxy:
    """A TCP proxy in front of one Kafka broker that reads the protocol both ways.

    Clients bootstrap through it, and it rewrites the broker's address in Metadata and
    FindCoordinator answers to its own, so every later connection of those clients comes
    through it too. ``rule`` (settable at any time) picks the fault of each request.
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.rule: Callable[[KafkaRequest], Fault | None] | None = None
        self.requests: list[KafkaRequest] = []
        self.answers: list[KafkaAnswer] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._connections: dict[int, _Connection] = {}
        self._numbers = itertools.count(1)

    async def start(self) -> int:
        """Listen on a free port of loopback; returns it."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    @property
    def address(self) -> str:
        """host:port for a client's bootstrap servers."""
        return f"127.0.0.1:{self.port}"

    async def stop(self) -> None:
        """Close every connection and stop listening."""
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections.values()):
            connection.client.close()
            connection.broker.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks))

    def epochs(self, transactional_id: str) -> list[tuple[int, int]]:
        """The (producer id, epoch) of every InitProducerId the broker granted
        ``transactional_id`` through this proxy, in order."""
        return [
            (a.fields["producer_id"], a.fields["producer_epoch"])
            for a in self.answers
            if a.request.api_key == INIT_PRODUCER_ID
            and a.request.transactional_id == transactional_id
            and a.fields.get("error_code") == 0
        ]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        connection = _Connection(next(self._numbers), writer, up_writer)
        self._connections[connection.number] = connection
        for pipe in (self._requests(reader, connection), self._answers(up_reader, connection)):
            task = asyncio.create_task(pipe)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _requests(self, reader: asyncio.StreamReader, connection: _Connection) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                size = await reader.readexactly(4)
                frame = await reader.readexactly(struct.unpack(">i", size)[0])
                request = self._read_request(frame, connection.number)
                request.fault = self.rule(request) if self.rule is not None else None
                self.requests.append(request)
                if isinstance(request.fault, Late):
                    await asyncio.sleep(request.fault.seconds)  # wait-ok: the injected delay
                if not (request.api_key == PRODUCE and request.fields.get("required_acks") == 0):
                    connection.waiting.append(request)
                connection.broker.write(size + frame)
                await connection.broker.drain()
        connection.client_gone = True
        connection.client.close()
        if not connection.waiting:
            self._close(connection)

    async def _answers(self, reader: asyncio.StreamReader, connection: _Connection) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                size = await reader.readexactly(4)
                frame = await reader.readexactly(struct.unpack(">i", size)[0])
                request = connection.waiting.popleft()
                (correlation_id,) = struct.unpack_from(">i", frame)
                assert correlation_id == request.correlation_id, "answers come back in order"
                frame, fields = self._read_answer(frame, request)
                fault = request.fault
                if isinstance(fault, Refused):
                    frame = self._refuse(frame, request, fault.code)
                delivered = not (
                    connection.stalled or connection.client_gone or fault in ("cut", "drop")
                )
                self.answers.append(KafkaAnswer(request, fields, delivered))
                if fault == "cut" or (connection.client_gone and not connection.waiting):
                    break
                if fault == "drop":
                    connection.stalled = True
                if not delivered:
                    continue
                if isinstance(fault, int | float):
                    await asyncio.sleep(fault)  # wait-ok: the delay this fault injects
                connection.client.write(struct.pack(">i", len(frame)) + frame)
                await connection.client.drain()
        self._close(connection)

    def _close(self, connection: _Connection) -> None:
        connection.client.close()
        connection.broker.close()
        self._connections.pop(connection.number, None)

    @staticmethod
    def _read_request(frame: bytes, connection: int) -> KafkaRequest:
        api_key, api_version, correlation_id, length = struct.unpack_from(">hhih", frame)
        client_id = None if length < 0 else frame[10 : 10 + length].decode()
        kind = _STRUCTS.get((api_key, api_version))
        fields: dict[str, Any] = {}
        if kind is not None and not kind.FLEXIBLE_VERSION:
            decoded = kind.decode(BytesIO(frame[10 + max(length, 0) :]))
            fields = {name: getattr(decoded, name) for name in kind.SCHEMA.names}
        return KafkaRequest(api_key, api_version, correlation_id, client_id, connection, fields)

    @staticmethod
    def _refuse(frame: bytes, request: KafkaRequest, code: int) -> bytes:
        """``frame`` (an answer to ``request``) naming error ``code`` instead."""
        answer = _STRUCTS[(request.api_key, request.api_version)].RESPONSE_TYPE.decode(
            BytesIO(frame[4:])
        )
        if "error_code" in answer.SCHEMA.names:
            answer.error_code = code
        for name in ("topics", "errors"):
            if name in answer.SCHEMA.names:
                entries = getattr(answer, name)
                setattr(
                    answer,
                    name,
                    [(t, [(p[0], code, *p[2:]) for p in partitions]) for t, partitions in entries],
                )
        encoded: bytes = answer.encode()
        return frame[:4] + encoded

    def _read_answer(self, frame: bytes, request: KafkaRequest) -> tuple[bytes, dict[str, Any]]:
        """The answer's fields; Metadata and FindCoordinator answers name this proxy as the
        broker (the frame returned is what the client gets)."""
        kind = _STRUCTS.get((request.api_key, request.api_version))
        if kind is None or kind.FLEXIBLE_VERSION:
            return frame, {}
        answer = kind.RESPONSE_TYPE.decode(BytesIO(frame[4:]))
        if request.api_key == METADATA:
            brokers = answer.brokers
            assert len(brokers) == 1, "the proxy stands in front of a single broker"
            answer.brokers = [(brokers[0][0], "127.0.0.1", self.port, *brokers[0][3:])]
            frame = frame[:4] + answer.encode()
        elif request.api_key == FIND_COORDINATOR and answer.error_code == 0:
            answer.host, answer.port = "127.0.0.1", self.port
            frame = frame[:4] + answer.encode()
        return frame, {name: getattr(answer, name) for name in answer.SCHEMA.names}
