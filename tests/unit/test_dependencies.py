"""What the dependency monitor says, and how often: one line when Kafka or Redis goes away,
one when it is back, whatever the retry loops and the client libraries do in between."""

from __future__ import annotations

import logging
import socket
import ssl
from collections.abc import Iterator

import pytest
from aiokafka.errors import KafkaConnectionError
from redis.exceptions import AuthenticationError, BusyLoadingError, ClusterDownError, MovedError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from kernel.adapters.dependencies import (
    DependencyMonitor,
    LibraryLogFilter,
    cluster_node_message,
    what_was_seen,
    which_dependency,
)
from kernel.adapters.security import redact_url
from kernel.settings import Settings

LOGGER = "kernel.adapters.dependencies"


def _wrapped(cause: BaseException, outer: BaseException) -> BaseException:
    """``outer`` raised while handling ``cause``, as a client library chains them."""
    try:
        try:
            raise cause
        except BaseException as exc:
            raise outer from exc
    except BaseException as raised:
        return raised


@pytest.mark.parametrize(
    ("error", "seen"),
    [
        (ConnectionRefusedError(111, "Connection refused"), "connection refused"),
        (
            _wrapped(
                ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 1)"),
                RedisConnectionError("Error 111 connecting to 127.0.0.1:1."),
            ),
            "connection refused",
        ),
        (
            KafkaConnectionError("Unable to bootstrap from [('127.0.0.1', 1, <AddressFamily>)]"),
            "no broker answered",
        ),
        (socket.gaierror(-2, "Name or service not known"), "host name not found"),
        (ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number"), "TLS error"),
        (MovedError("3999 127.0.0.1:7001"), "a Redis Cluster node answered MOVED"),
        (ClusterDownError("The cluster is down"), "CLUSTERDOWN"),
        (BusyLoadingError("Redis is loading the dataset in memory"), "loading its data"),
        (AuthenticationError("WRONGPASS invalid username-password pair"), "authentication"),
        (RedisTimeoutError("Timeout reading from socket"), "no answer in time"),
        (TimeoutError(), "no answer in time"),
        (ValueError("something else"), "ValueError: something else"),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else None,
)
def test_what_was_seen_says_in_a_few_words_what_a_failure_means(
    error: BaseException, seen: str
) -> None:
    assert seen in what_was_seen(error)


def test_an_error_is_told_apart_by_the_library_it_comes_from() -> None:
    assert which_dependency(KafkaConnectionError("x")) == "kafka"
    assert which_dependency(RedisConnectionError("x")) == "redis"
    assert which_dependency(_wrapped(OSError("x"), RedisTimeoutError("y"))) == "redis"
    assert which_dependency(ConnectionResetError()) is None


@pytest.fixture
def monitor() -> DependencyMonitor:
    watched = DependencyMonitor()
    watched.configure(
        Settings(
            kafka_bootstrap_servers="broker-1:9092",
            redis_url="redis://app:s3cret-pass@cache:6379/0",
        )
    )
    return watched


class Said:
    """The monitor's records so far (caplog's list changes between test phases)."""

    def __init__(self, caplog: pytest.LogCaptureFixture) -> None:
        self.caplog = caplog

    def __getitem__(self, i: int) -> logging.LogRecord:
        return self.records[i]

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[logging.LogRecord]:
        return iter(self.records)

    @property
    def records(self) -> list[logging.LogRecord]:
        return [r for r in self.caplog.records if r.name == LOGGER]


@pytest.fixture
def said(caplog: pytest.LogCaptureFixture) -> Said:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    return Said(caplog)


def test_an_outage_is_said_once_when_it_begins_and_once_when_it_ends(
    monitor: DependencyMonitor, said: Said
) -> None:
    refused = ConnectionRefusedError(111, "Connection refused")
    monitor.up("redis")  # the first check: nothing to say
    for _ in range(50):  # a check every few seconds, a retry loop every 50 ms
        monitor.down("redis", refused)
        monitor.failed(RedisConnectionError("Error 111 connecting to cache:6379."))
    monitor.up("redis")
    monitor.up("redis")
    lines = [r.getMessage() for r in said]
    assert len(lines) == 2, lines
    gone, back = lines
    assert gone.startswith("Redis unreachable at REDIS_URL=redis://app:***@cache:6379/0: ")
    assert "connection refused" in gone and "set REDIS_URL" in gone
    assert "s3cret-pass" not in gone + back
    assert back.startswith("Redis reachable again at REDIS_URL=redis://app:***@cache:6379/0")
    assert said[0].levelno == logging.ERROR and said[1].levelno == logging.WARNING


def test_each_dependency_has_its_own_state_and_names_its_own_setting(
    monitor: DependencyMonitor, said: Said
) -> None:
    monitor.down("kafka", KafkaConnectionError("Unable to bootstrap from [('broker-1', 9092)]"))
    monitor.down("redis", RedisTimeoutError("Timeout connecting to server"))
    lines = [r.getMessage() for r in said]
    assert lines[0].startswith("Kafka unreachable at KAFKA_BOOTSTRAP_SERVERS=broker-1:9092: ")
    assert lines[1].startswith("Redis unreachable at REDIS_URL=")
    assert "no answer in time" in lines[1]
    assert monitor.is_down("kafka") and monitor.is_down("redis")


def test_an_unset_setting_says_the_local_default_is_used(said: Said) -> None:
    monitor = DependencyMonitor()
    monitor.configure(Settings(kafka_bootstrap_servers=None, redis_url=None))
    monitor.down("kafka", ConnectionRefusedError(111, "Connection refused"))
    assert "KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:" in said[0].getMessage()
    assert "(not set: the address `toolfleet infra up` uses)" in said[0].getMessage()


def test_what_the_kafka_client_logged_explains_a_bare_bootstrap_failure(
    monitor: DependencyMonitor, said: Said
) -> None:
    monitor.heard("kafka", 'Unable connect to "broker-1:9092": [Errno 111] Connect call failed')
    monitor.down("kafka", KafkaConnectionError("Unable to bootstrap from [('broker-1', 9092)]"))
    assert "connection refused" in said[0].getMessage()


def test_a_new_reason_during_an_outage_is_said_at_most_once_a_minute(
    monitor: DependencyMonitor, said: Said
) -> None:
    monitor.down("redis", ConnectionRefusedError(111, "Connection refused"))
    monitor.down("redis", RedisTimeoutError("Timeout"))  # changed, but within the minute
    assert len(said) == 1


def _record(name: str, message: str, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise RuntimeError("bug inside the library")
        except RuntimeError as raised:
            exc_info = (type(raised), raised, raised.__traceback__)
    return logging.LogRecord(name, logging.ERROR, __file__, 1, message, None, exc_info)


def test_with_a_watcher_the_clients_own_lines_become_details_of_a_check() -> None:
    monitor = DependencyMonitor()
    monitor.watching = True
    filtered = LibraryLogFilter(monitor)
    lines = [
        _record("aiokafka", "Unable connect to node with id 1: [Errno 111] Connection refused"),
        _record("aiokafka.consumer.fetcher", "Failed fetch messages from 1: NodeNotReadyError"),
        _record("redis.asyncio.connection", "Connection reset"),
    ]
    assert not any(filtered.filter(line) for line in lines * 100)
    # An unexpected error inside the library, with its traceback, is still written.
    assert filtered.filter(_record("aiokafka.consumer.group_coordinator", "Unexpected", exc=True))
    assert filtered.filter(_record("toolfleet.own", "our own lines pass"))


def test_without_a_watcher_a_clients_line_is_written_once_in_a_while() -> None:
    filtered = LibraryLogFilter(DependencyMonitor())
    line = _record("aiokafka", "Unable connect to node with id 1")
    assert [filtered.filter(line) for _ in range(5)] == [True, False, False, False, False]
    assert filtered.filter(_record("aiokafka", "Another template"))


def test_at_debug_level_every_client_line_is_written() -> None:
    monitor = DependencyMonitor()
    monitor.watching = True
    filtered = LibraryLogFilter(monitor, debug=True)
    assert all(filtered.filter(_record("aiokafka", "Unable connect")) for _ in range(5))


def test_a_cluster_node_given_as_one_server_is_named_with_the_url_form_to_use() -> None:
    message = cluster_node_message("redis://app:pw@10.0.0.5:7000/0", "cluster_enabled:1")
    assert message.startswith("REDIS_URL=redis://app:***@10.0.0.5:7000/0 names a node of a")
    assert "Use REDIS_URL=redis+cluster://app:***@10.0.0.5:7000 " in message
    assert "pw@" not in message


def test_a_url_shows_its_user_but_never_its_password() -> None:
    assert redact_url("rediss://svc:hunter2@cache:6380/1") == "rediss://svc:***@cache:6380/1"
    assert redact_url("redis://cache:6379/0") == "redis://cache:6379/0"
