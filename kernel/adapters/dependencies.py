"""Whether Kafka and Redis answer, said once: one line when one goes away, one when it is back.

A service checks its dependencies at start (``check_dependencies``) and every few seconds
while it runs (``Probes``, from the health watcher). Every result goes to the process's
``DEPENDENCIES`` monitor, which logs only the transitions:

- gone: ``Redis unreachable at REDIS_URL=redis://127.0.0.1:1/0: connection refused ...`` (the
  setting, its value with any password hidden, what was seen, what to check);
- back: ``Redis reachable again at REDIS_URL=...`` with how long it was away.

Everything in between stays quiet: the loops that retry (``kernel.adapters.backoff``) report
their failures with ``DEPENDENCIES.failed(exc)``, which asks for a check at once instead of
logging; the Kafka and Redis clients' own loggers (aiokafka's, redis-py's) are folded in by
``LibraryLogFilter``: while a watcher runs their records become the detail of the next check
(run at once), not lines of their own. With ``TOOLFLEET_LOG_LEVEL=DEBUG`` every record is
written as it comes.

Some answers are not outages, and waiting does not fix them: credentials or a certificate
refused, or ``REDIS_URL`` naming one node of a Redis Cluster with ``redis://`` (the node answers
PING, then MOVED for most keys). At start they are ``StartRefused``: one line saying what to
change, and the service exits; found while running, they are the gone line.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

from aiokafka.admin import AIOKafkaAdminClient
from redis.asyncio import Redis

from kernel.adapters.redis import connect_redis, parse_redis_url
from kernel.adapters.security import (
    explain_connection_error,
    kafka_options,
    redact_url,
    refused,
)
from kernel.errors import ConfigurationError, InfrastructureError
from kernel.settings import Settings

log = logging.getLogger(__name__)

Dependency = Literal["kafka", "redis"]
DEPENDENCIES_CHECKED: tuple[Dependency, ...] = ("kafka", "redis")

_NAMES: dict[Dependency, str] = {"kafka": "Kafka", "redis": "Redis"}
_SETTINGS: dict[Dependency, str] = {"kafka": "KAFKA_BOOTSTRAP_SERVERS", "redis": "REDIS_URL"}

START_CHECK_TIMEOUT_S = 10.0
"""How long one start-up check of one dependency may take (a host that drops packets)."""

REASON_CHANGE_EVERY_S = 60.0
"""While a dependency stays away, a new reason (refused, then timing out) is said at most this
often."""

LIBRARY_REPEAT_S = 300.0
"""Without a watcher (a console, a script), a client library's same line is written once per
this many seconds."""


class StartRefused(ConfigurationError):
    """Kafka or Redis answered, but not in a way waiting can fix (credentials, a certificate,
    a cluster node named as one server): fix the setting the message names and restart."""

    def __init__(self, message: str, dependency: Dependency) -> None:
        super().__init__(message)
        self.dependency: Dependency = dependency


class DependencyUnavailable(InfrastructureError):
    """Kafka or Redis did not answer a check; the monitor has said which and why."""


# --- what was seen ------------------------------------------------------------------------
def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


_REFUSED_TEXTS = ("Connection refused", "Connect call failed", "ECONNREFUSED")
_DNS_TEXTS = (
    "Name or service not known",
    "Temporary failure in name resolution",
    "nodename nor servname",
    "No address associated with hostname",
    "getaddrinfo failed",
)


def what_was_seen(exc: BaseException | str) -> str:
    """What a failed connection or command says about the dependency, in a few words:
    connection refused, host name not found, no answer in time, a TLS error, a cluster
    node, ... (the exception's own text when it is none of those)."""
    if isinstance(exc, str):
        return _seen_in_text(exc) or exc[:300]
    for current in _chain(exc):
        found = _seen_in(current)
        if found is not None:
            return found
    return f"{type(exc).__name__}: {str(exc)[:300]}".rstrip(": ")


def _seen_in(exc: BaseException) -> str | None:
    name = type(exc).__name__
    text = str(exc)
    if isinstance(exc, ConfigurationError | StartRefused):
        return text
    if isinstance(exc, ConnectionRefusedError) or getattr(exc, "errno", None) in (
        errno.ECONNREFUSED,
    ):
        return "connection refused (nothing listens at that address)"
    if isinstance(exc, socket.gaierror):
        return f"host name not found ({exc.strerror or text})"
    if isinstance(exc, ssl.SSLError):
        return f"TLS error: {getattr(exc, 'reason', None) or text}"
    if name in ("MovedError", "AskError") or text.startswith("MOVED"):
        return f"a Redis Cluster node answered MOVED ({text})"
    if name == "ClusterDownError" or "CLUSTERDOWN" in text:
        return f"a Redis Cluster node answered CLUSTERDOWN ({text})"
    if name == "BusyLoadingError" or text.startswith("LOADING"):
        return "Redis is loading its data set (after a restart); it answers once loaded"
    if name == "ReadOnlyError" or text.startswith("READONLY"):
        return "a read-only replica answered, not the primary"
    if name in ("AuthenticationError", "SaslAuthenticationFailed") or "WRONGPASS" in text:
        return f"authentication failed ({text})"
    from_text = _seen_in_text(text)
    if from_text is not None:
        return from_text
    if isinstance(exc, TimeoutError) or name in (
        "TimeoutError",
        "KafkaTimeoutError",
        "RequestTimedOutError",
    ):
        return "no answer in time (a timeout: a host that drops packets, or an overloaded server)"
    if name == "MasterNotFoundError":
        return f"no Sentinel named a primary ({text})"
    if name in ("KafkaConnectionError", "NoBrokersAvailable") and "bootstrap" in text:
        return f"no broker answered ({text})"
    return None


def _seen_in_text(text: str) -> str | None:
    if any(t in text for t in _REFUSED_TEXTS) or "[Errno 111]" in text:
        return "connection refused (nothing listens at that address)"
    if any(t in text for t in _DNS_TEXTS) or "[Errno -2]" in text or "[Errno -3]" in text:
        return "host name not found (DNS)"
    return None


def which_dependency(exc: BaseException) -> Dependency | None:
    """Which dependency an exception comes from (None: cannot tell, a bare socket error)."""
    for current in _chain(exc):
        module = type(current).__module__
        if module.startswith("aiokafka") or module.startswith("kafka."):
            return "kafka"
        if module.startswith("redis"):
            return "redis"
    return None


# --- the monitor ----------------------------------------------------------------------------
_LoopEvent = tuple[asyncio.Event, asyncio.AbstractEventLoop]


def _of_this_loop(current: _LoopEvent | None) -> _LoopEvent:
    """``current``, or a new event when there is none or it belongs to another event loop
    (a process may run several loops one after the other: tests, CLI commands)."""
    loop = asyncio.get_running_loop()
    if current is None or current[1] is not loop:
        return asyncio.Event(), loop
    return current


@dataclass
class _State:
    up: bool | None = None
    """None until the first check."""
    since: float = field(default_factory=time.monotonic)
    said: str = ""
    """The reason last logged while away."""
    said_at: float = float("-inf")
    heard: str = ""
    """What the client library said last (its records are folded in, not written)."""
    heard_at: float = float("-inf")


class DependencyMonitor:
    """The state of Kafka and Redis as this process sees them; logs only the transitions.

    One per process (``DEPENDENCIES``). ``configure`` names the settings; checks report with
    ``checked``; retry loops report with ``failed``, which only asks for a check now.
    """

    def __init__(self) -> None:
        self.settings: Settings | None = None
        self.watching = False
        """A health watcher runs checks in this process: library records can be folded."""
        self._states: dict[Dependency, _State] = {d: _State() for d in DEPENDENCIES_CHECKED}
        self._nudged: _LoopEvent | None = None
        self._back: _LoopEvent | None = None

    def forget_loops(self) -> None:
        """Forget the events made on earlier event loops (a process that runs many loops one
        after the other, as the simulator does, would otherwise keep the first alive)."""
        self._nudged = self._back = None

    def configure(self, settings: Settings) -> None:
        """Name the settings of this process's dependencies; forget earlier states."""
        self.settings = settings
        self._states = {d: _State() for d in DEPENDENCIES_CHECKED}

    # --- what is configured --------------------------------------------------------------
    def setting(self, dependency: Dependency) -> str:
        """``NAME=value`` of the setting that points at ``dependency`` (a password hidden;
        an unset variable says which default is used)."""
        name = _SETTINGS[dependency]
        settings = self.settings
        if settings is None:
            return name
        if dependency == "kafka":
            value = settings.kafka_servers()
            configured = settings.kafka_bootstrap_servers is not None
        else:
            value = redact_url(settings.redis_address())
            configured = settings.redis_url is not None
        suffix = "" if configured else " (not set: the address `toolfleet infra up` uses)"
        return f"{name}={value}{suffix}"

    # --- reports -------------------------------------------------------------------------
    def checked(self, dependency: Dependency, error: BaseException | None) -> None:
        """A check's result: None when the dependency answered."""
        if error is None:
            self.up(dependency)
        else:
            self.down(dependency, error)

    def down(self, dependency: Dependency, error: BaseException | str) -> None:
        """``dependency`` did not answer: say so if it was up (or unknown), or if the reason
        changed (at most once a minute)."""
        state = self._states[dependency]
        seen = what_was_seen(error)
        heard = self._recent_library_text(state)
        if heard and seen.startswith(("no broker answered", "KafkaConnectionError")):
            seen = what_was_seen(heard)
        now = time.monotonic()
        if state.up is False:
            if seen == state.said or now - state.said_at < REASON_CHANGE_EVERY_S:
                return
            state.said, state.said_at = seen, now
            log.error(
                "%s still unreachable at %s: now %s",
                _NAMES[dependency],
                self.setting(dependency),
                seen,
                extra=self._extra(dependency, seen),
            )
            return
        state.up, state.since, state.said, state.said_at = False, now, seen, now
        log.error(
            "%s unreachable at %s: %s. Retrying with backoff; a line follows when it answers. "
            "Check that %s runs there and this host can reach it, or set %s.",
            _NAMES[dependency],
            self.setting(dependency),
            seen,
            _NAMES[dependency],
            _SETTINGS[dependency],
            extra=self._extra(dependency, seen),
        )

    def up(self, dependency: Dependency) -> None:
        """``dependency`` answered: say so if it was away."""
        state = self._states[dependency]
        was = state.up
        now = time.monotonic()
        if was is True:
            return
        state.up, state.said = True, ""
        if was is False:
            away = now - state.since
            state.since = now
            log.warning(
                "%s reachable again at %s, after %.1f s away",
                _NAMES[dependency],
                self.setting(dependency),
                away,
                extra={"dependency": dependency, "away_s": round(away, 3)},
            )
            if self._back is not None:
                self._back[0].set()
                self._back = None
        else:
            state.since = now

    def refused(self, dependency: Dependency, message: str) -> StartRefused:
        """A StartRefused for ``message``, said once (the gone line, unless it said it)."""
        state = self._states[dependency]
        if not (state.up is False and state.said == message):
            log.error(message, extra=self._extra(dependency, message))
            state.up, state.said, state.said_at = False, message, time.monotonic()
        return StartRefused(message, dependency)

    def failed(self, error: BaseException) -> None:
        """A retry loop met ``error`` (Kafka or Redis away, it thinks): check at once, and
        keep quiet: the check's result is what gets said."""
        dependency = which_dependency(error)
        if dependency is not None:
            state = self._states[dependency]
            state.heard, state.heard_at = what_was_seen(error), time.monotonic()
        self.nudge()

    def heard(self, dependency: Dependency, text: str) -> None:
        """A client library's own record about ``dependency``: detail for the next check."""
        state = self._states[dependency]
        state.heard, state.heard_at = text, time.monotonic()
        self.nudge()

    def is_down(self, dependency: Dependency) -> bool:
        """Whether the last check of ``dependency`` failed."""
        return self._states[dependency].up is False

    # --- waiting -------------------------------------------------------------------------
    def nudge(self) -> None:
        """Ask the watcher for a check now rather than at its next interval."""
        if self._nudged is not None:
            self._nudged[0].set()

    def nudged(self) -> asyncio.Event:
        """The event the watcher waits on between checks (set by ``nudge``)."""
        self._nudged = _of_this_loop(self._nudged)
        return self._nudged[0]

    async def back(self) -> None:
        """Return when a dependency that was away answers again (from now on)."""
        self._back = _of_this_loop(self._back)
        await self._back[0].wait()

    # --- helpers -------------------------------------------------------------------------
    def _recent_library_text(self, state: _State) -> str:
        return state.heard if time.monotonic() - state.heard_at < 30 else ""

    def _extra(self, dependency: Dependency, seen: str) -> dict[str, str]:
        return {
            "dependency": dependency,
            "setting": _SETTINGS[dependency],
            "value": self.setting(dependency).partition("=")[2],
            "seen": seen,
        }


DEPENDENCIES = DependencyMonitor()
"""This process's view of Kafka and Redis (one service per process)."""


# --- the client libraries' own records ------------------------------------------------------
_LIBRARIES: tuple[tuple[str, Dependency], ...] = (("aiokafka", "kafka"), ("redis", "redis"))


def _library_of(logger: str) -> Dependency | None:
    for prefix, dependency in _LIBRARIES:
        if logger == prefix or logger.startswith(prefix + "."):
            return dependency
    return None


class LibraryLogFilter(logging.Filter):
    """Folds aiokafka's and redis-py's records into the dependency monitor.

    Those clients log every reconnect attempt (476 lines in 5 s with a broker gone). While a
    watcher checks the dependencies, a library record is not written: it becomes the detail
    of a check that runs at once, and the monitor says "gone" and "back" once each. A record
    with a traceback (an unexpected error inside the library) is still written, once per
    message per ``LIBRARY_REPEAT_S``. Without a watcher (a console, a script) the same line
    is written once per ``LIBRARY_REPEAT_S``. At DEBUG level everything is written.
    """

    def __init__(self, monitor: DependencyMonitor, *, debug: bool = False) -> None:
        super().__init__()
        self.monitor = monitor
        self.debug = debug
        self._written: dict[tuple[str, str], float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether to write ``record`` (any record not from aiokafka or redis-py passes)."""
        dependency = _library_of(record.name)
        if dependency is None or self.debug:
            return True
        if self.monitor.watching and not record.exc_info:
            self.monitor.heard(dependency, record.getMessage())
            return False
        return self._first_in_a_while(record)

    def _first_in_a_while(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        now = time.monotonic()
        if now - self._written.get(key, float("-inf")) < LIBRARY_REPEAT_S:
            return False
        if len(self._written) > 1_000:  # many distinct templates: forget the oldest
            self._written = dict(sorted(self._written.items(), key=lambda kv: kv[1])[500:])
        self._written[key] = now
        return True


# --- the checks -----------------------------------------------------------------------------
async def _kafka_refusal(settings: Settings, timeout_s: float) -> BaseException | None:
    """Connect to the first bootstrap server directly: the real reason a client could not
    (aiokafka logs a refused login or an unreachable host, then raises "Unable to
    bootstrap"). None when it connects."""
    from aiokafka.conn import create_conn

    options = kafka_options(settings)
    servers = str(options.pop("bootstrap_servers")).split(",")
    host, _, port = servers[0].strip().rpartition(":")
    try:
        conn = await asyncio.wait_for(create_conn(host, int(port), **options), timeout_s)
    except Exception as exc:
        return exc
    conn.close()
    return None


async def check_kafka(settings: Settings, timeout_s: float = START_CHECK_TIMEOUT_S) -> None:
    """Raise unless a broker answers a metadata request; a refused login or certificate is
    ``StartRefused``."""
    admin = AIOKafkaAdminClient(**kafka_options(settings), request_timeout_ms=int(timeout_s * 1000))
    try:
        async with asyncio.timeout(timeout_s):
            await admin.start()
            await admin.describe_topics([])
    except Exception as exc:
        reason = await _kafka_refusal(settings, timeout_s / 2)
        if reason is None:
            raise
        if refused(reason):
            raise StartRefused(str(explain_connection_error(reason, settings)), "kafka") from exc
        raise reason from exc
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


def cluster_url_for(redis_url: str) -> str:
    """The ``redis+cluster://`` form of a ``redis://`` URL naming one node (credentials kept,
    the password hidden)."""
    parts = urlsplit(redis_url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or 6379
    credentials = ""
    if parts.username or parts.password:
        credentials = f"{parts.username or ''}:***@" if parts.password else f"{parts.username}@"
    return f"redis+cluster://{credentials}{host}:{port}"


def cluster_node_message(redis_url: str, evidence: str) -> str:
    """What to say when ``REDIS_URL`` names one node of a Redis Cluster as a single server."""
    return (
        f"REDIS_URL={redact_url(redis_url)} names a node of a Redis Cluster ({evidence}); "
        "the redis:// form is for one server, and a cluster node answers MOVED for the keys "
        f"other nodes own. Use REDIS_URL={cluster_url_for(redis_url)} (list a few nodes, "
        "comma-separated, so that any one of them can seed the client)."
    )


async def check_redis(
    settings: Settings, client: Redis | None = None, timeout_s: float = START_CHECK_TIMEOUT_S
) -> None:
    """Raise unless Redis answers; a refused login or certificate, or a cluster node named
    with ``redis://``, is ``StartRefused``. ``client``: check through it (kept open)."""
    target = parse_redis_url(settings.redis_address())
    own = client is None
    redis = connect_redis(settings) if client is None else client
    try:
        async with asyncio.timeout(timeout_s):
            if target.kind != "single":
                await redis.ping()
                return
            info = await redis.info("cluster")
            if int(info.get("cluster_enabled", 0) or 0) == 1:
                message = cluster_node_message(settings.redis_address(), "cluster_enabled:1")
                raise StartRefused(message, "redis")
    except StartRefused:
        raise
    except Exception as exc:
        if refused(exc):
            raise StartRefused(str(explain_connection_error(exc, settings)), "redis") from exc
        if what_was_seen(exc).startswith(("a Redis Cluster node", "MovedError")):
            message = cluster_node_message(settings.redis_address(), what_was_seen(exc))
            raise StartRefused(message, "redis") from exc
        raise
    finally:
        if own:
            await redis.aclose()


async def check_dependencies(settings: Settings, monitor: DependencyMonitor) -> None:
    """Check Kafka and Redis together, reporting each result to ``monitor``.

    Raises ``StartRefused`` (said once) when one refused this process, and
    ``DependencyUnavailable`` when one did not answer (the monitor said which).
    """
    checks: dict[Dependency, Callable[[], Awaitable[None]]] = {
        "kafka": lambda: check_kafka(settings),
        "redis": lambda: check_redis(settings),
    }
    results = await asyncio.gather(*(c() for c in checks.values()), return_exceptions=True)
    away = []
    for dependency, result in zip(checks, results, strict=True):
        if isinstance(result, StartRefused):
            raise monitor.refused(dependency, str(result))
        if isinstance(result, ConfigurationError):
            text = str(result)
            named = (
                text
                if text.startswith(_SETTINGS[dependency])
                else f"{_SETTINGS[dependency]}: {text}"
            )
            raise monitor.refused(dependency, named)
        if isinstance(result, BaseException):
            if not isinstance(result, Exception):
                raise result
            monitor.down(dependency, result)
            away.append(dependency)
        else:
            monitor.up(dependency)
    if away:
        raise DependencyUnavailable(f"unreachable: {', '.join(_NAMES[d] for d in away)}")


class Probes:
    """The checks of the health watcher (``/readyz``): Kafka answers a metadata request (for
    no topic), Redis a PING (an ``INFO cluster`` for one server, so a cluster node is told
    apart). Each keeps one connection of its own, so a check costs one round trip."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._admin: AIOKafkaAdminClient | None = None
        self._redis: Redis | None = None

    async def kafka(self) -> None:
        """Raise unless the broker answers (with the reason a direct connection sees)."""
        try:
            if self._admin is None:
                admin = AIOKafkaAdminClient(**kafka_options(self.settings), request_timeout_ms=1500)
                try:
                    await admin.start()
                except BaseException:
                    with contextlib.suppress(Exception):
                        await admin.close()
                    raise
                self._admin = admin
            # A metadata request naming no topic (aiokafka's public describe_topics sends
            # exactly that for an empty list): the broker answers with itself and its peers
            # only. Listing every topic would have each service decode the whole cluster's
            # metadata every few seconds, and naming one topic could auto-create it.
            await self._admin.describe_topics([])
        except Exception as exc:
            if self._admin is not None:
                admin, self._admin = self._admin, None
                with contextlib.suppress(Exception):
                    await admin.close()
            reason = await _kafka_refusal(self.settings, 1.0)
            if reason is not None and reason is not exc:
                raise reason from exc
            raise

    async def redis(self) -> None:
        """Raise unless Redis answers (a cluster node behind ``redis://`` is a failure)."""
        if self._redis is None:
            self._redis = connect_redis(self.settings)
        await check_redis(self.settings, self._redis, timeout_s=5.0)

    async def close(self) -> None:
        """Close the probes' connections."""
        if self._admin is not None:
            with contextlib.suppress(Exception):
                await self._admin.close()
        if self._redis is not None:
            with contextlib.suppress(Exception):
                await self._redis.aclose()


__all__ = [
    "DEPENDENCIES",
    "DependencyMonitor",
    "DependencyUnavailable",
    "LibraryLogFilter",
    "Probes",
    "StartRefused",
    "check_dependencies",
    "check_kafka",
    "check_redis",
    "cluster_node_message",
    "what_was_seen",
    "which_dependency",
]
