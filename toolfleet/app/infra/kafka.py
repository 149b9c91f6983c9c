"""A single-node Apache Kafka (KRaft, combined broker and controller) run from Maven jars."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import dataclasses
import logging
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import psutil

from kernel.errors import InfrastructureError
from kernel.settings import Settings
from toolfleet.app.infra import process
from toolfleet.app.infra.jars import kafka_libs
from toolfleet.app.infra.process import ServiceStatus

log = logging.getLogger(__name__)

READY_TIMEOUT = 90.0
STOP_TIMEOUT = 30.0
_MAIN_CLASS = "kafka.Kafka"


@dataclasses.dataclass(frozen=True)
class SecuredListener:
    """A SASL_SSL listener for the local broker in place of PLAINTEXT (SASL PLAIN, TLS).

    For trying secured connections against a real broker (the tests of secured connections,
    a rehearsal of a deployment's settings). The controller stays on its own plaintext
    listener on loopback.
    """

    keystore: Path
    """The broker's private key (PKCS#8) and certificate chain, in one PEM file."""
    truststore: Path
    """The CA certificates the broker trusts for clients (PEM)."""
    users: dict[str, str]
    """SASL PLAIN users and their passwords."""
    client_auth: bool = True
    """Clients must present a certificate signed by the truststore's CA."""
    broker_user: str = "broker"
    """The user (one of ``users``) the broker authenticates as to itself."""


def kafka_dir(settings: Settings) -> Path:
    """Where this instance keeps its configuration, data, logs and pid file."""
    return settings.state_dir / "kafka"


def kafka_status(settings: Settings) -> ServiceStatus:
    """Whether the broker of ``settings`` is running, from its pid file (no network call)."""
    if settings.kafka_external():
        return ServiceStatus("kafka", "external", settings.kafka_servers())
    return process.local_status(
        "kafka",
        settings.kafka_servers(),
        _pid_file(settings),
        _matcher(settings),
        _log_file(settings),
    )


def start_kafka(
    settings: Settings, *, timeout: float = READY_TIMEOUT, secured: SecuredListener | None = None
) -> ServiceStatus:
    """Start the broker unless ours already runs, and wait until it answers a Kafka client.

    Blocking; from async code call it with ``asyncio.to_thread``. With
    KAFKA_BOOTSTRAP_SERVERS set nothing is started and the given address is reported.
    """
    if settings.kafka_external():
        return kafka_status(settings)
    home = kafka_dir(settings)
    with process.file_lock(home / "lock"):
        current = kafka_status(settings)
        if current.state == "running":
            log.info("kafka already running as pid %s", current.pid)
            _wait_ready(settings, current.pid, timeout)
            return current
        process.ensure_port_free(settings.kafka_port, "Kafka", "TOOLFLEET_KAFKA_PORT")
        process.ensure_port_free(
            settings.kafka_controller_port, "Kafka's controller", "TOOLFLEET_KAFKA_CONTROLLER_PORT"
        )
        java = _java()
        libs = kafka_libs(settings)
        _write_config(settings, secured)
        _format_storage(settings, java, libs)
        started = time.monotonic()
        pid = process.spawn(
            [*_jvm(settings, java, libs), _MAIN_CLASS, str(_properties(settings))],
            cwd=home,
            log_file=_log_file(settings),
            pid_file=_pid_file(settings),
        )
        _wait_ready(settings, pid, timeout)
        elapsed = time.monotonic() - started
        log.info("kafka ready on %s after %.1f s", settings.kafka_servers(), elapsed)
        return dataclasses.replace(kafka_status(settings), started=True)


def stop_kafka(settings: Settings, *, timeout: float = STOP_TIMEOUT) -> int | None:
    """Stop the broker we started (SIGTERM, SIGKILL after ``timeout``); returns its pid.

    Data stays in the state directory, so a later ``start_kafka`` sees the same topics.
    """
    if settings.kafka_external():
        return None
    with process.file_lock(kafka_dir(settings) / "lock"):
        return process.terminate(_pid_file(settings), _matcher(settings), timeout=timeout)


def new_cluster_id() -> str:
    """A Kafka ``Uuid`` string: 16 random bytes, URL-safe base64 without padding."""
    while True:
        text = base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")
        # Kafka's own generator rejects ids that start with '-' (they read as CLI flags).
        if not text.startswith("-"):
            return text


def _pid_file(settings: Settings) -> Path:
    return kafka_dir(settings) / "kafka.pid"


def _log_file(settings: Settings) -> Path:
    return kafka_dir(settings) / "logs" / "stdout.log"


def _properties(settings: Settings) -> Path:
    return kafka_dir(settings) / "server.properties"


def _matcher(settings: Settings) -> process.Matcher:
    properties = str(_properties(settings))

    def is_ours(proc: psutil.Process) -> bool:
        cmdline = proc.cmdline()
        return _MAIN_CLASS in cmdline and properties in cmdline

    return is_ours


def _java() -> str:
    java = shutil.which("java")
    if java is None:
        raise InfrastructureError(
            "Java is not on PATH; Kafka needs Java 17 or newer. "
            "Install it (apt-get install -y openjdk-17-jre-headless) and run `toolfleet infra up`."
        )
    return java


def _jvm(settings: Settings, java: str, libs: Path) -> list[str]:
    return [
        java,
        f"-Xmx{settings.kafka_heap}",
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-XX:+ExitOnOutOfMemoryError",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={kafka_dir(settings) / 'log4j2.properties'}",
        "-cp",
        f"{libs}/*",
    ]


def _listener_properties(broker: str, secured: SecuredListener | None) -> list[str]:
    if secured is None:
        return [
            f"listeners=PLAINTEXT://{broker},CONTROLLER://{{controller}}",
            f"advertised.listeners=PLAINTEXT://{broker}",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name=PLAINTEXT",
        ]
    users = " ".join(f'user_{name}="{password}"' for name, password in secured.users.items())
    own = secured.users[secured.broker_user]
    jaas = (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="{secured.broker_user}" password="{own}" {users};'
    )
    return [
        f"listeners=SASL_SSL://{broker},CONTROLLER://{{controller}}",
        f"advertised.listeners=SASL_SSL://{broker}",
        "listener.security.protocol.map=SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name=SASL_SSL",
        "sasl.enabled.mechanisms=PLAIN",
        "sasl.mechanism.inter.broker.protocol=PLAIN",
        f"listener.name.sasl_ssl.plain.sasl.jaas.config={jaas}",
        "ssl.keystore.type=PEM",
        f"ssl.keystore.location={secured.keystore}",
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={secured.truststore}",
        f"ssl.client.auth={'required' if secured.client_auth else 'none'}",
        "ssl.endpoint.identification.algorithm=https",
    ]


def _write_config(settings: Settings, secured: SecuredListener | None = None) -> None:
    home = kafka_dir(settings)
    for sub in ("data", "logs"):
        (home / sub).mkdir(parents=True, exist_ok=True)
    broker = f"127.0.0.1:{settings.kafka_port}"
    controller = f"127.0.0.1:{settings.kafka_controller_port}"
    listeners = [line.replace("{controller}", controller) for line in
                 _listener_properties(broker, secured)]  # fmt: skip
    # Rewritten on every start so that changed ports take effect; the data stays.
    _properties(settings).write_text(
        "\n".join([
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.voters=1@{controller}",
            *listeners,
            "controller.listener.names=CONTROLLER",
            f"log.dirs={home / 'data'}",
            # One node: every internal topic must make do with a single replica.
            "offsets.topic.replication.factor=1",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "share.coordinator.state.topic.replication.factor=1",
            "share.coordinator.state.topic.min.isr=1",
            # Consumers of tests and the demo should not wait 3 s for a group to settle.
            "group.initial.rebalance.delay.ms=0",
            "",
        ])
    )  # fmt: skip
    logs = home / "logs"
    (home / "log4j2.properties").write_text(
        "\n".join([
            "status = warn",
            "appender.server.type = RollingFile",
            "appender.server.name = server",
            f"appender.server.fileName = {logs / 'server.log'}",
            f"appender.server.filePattern = {logs / 'server.log.%i'}",
            "appender.server.layout.type = PatternLayout",
            "appender.server.layout.pattern = [%d] %p %m (%c)%n",
            "appender.server.policies.type = Policies",
            "appender.server.policies.size.type = SizeBasedTriggeringPolicy",
            "appender.server.policies.size.size = 50MB",
            "appender.server.strategy.type = DefaultRolloverStrategy",
            "appender.server.strategy.max = 3",
            "rootLogger.level = INFO",
            "rootLogger.appenderRef.server.ref = server",
            "",
        ])
    )  # fmt: skip


def _format_storage(settings: Settings, java: str, libs: Path) -> None:
    data = kafka_dir(settings) / "data"
    if (data / "meta.properties").exists():
        return
    cluster_id = new_cluster_id()
    log.info("formatting Kafka storage in %s with cluster id %s", data, cluster_id)
    argv = [
        *_jvm(settings, java, libs), "kafka.tools.StorageTool", "format",
        "-t", cluster_id, "-c", str(_properties(settings)),
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        output = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
        raise InfrastructureError(
            f"formatting Kafka storage in {data} failed (exit {done.returncode}). If the "
            f"directory holds data from another cluster, delete {data} and run "
            f"`toolfleet infra up` again. StorageTool said:\n{output}"
        )


def _wait_ready(settings: Settings, pid: int | None, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last_error = "no answer yet"
    while time.monotonic() < deadline:
        if pid is not None and not process.is_alive(pid):
            raise InfrastructureError(
                f"Kafka (pid {pid}) exited during startup. Read {_log_file(settings)} and "
                f"{kafka_dir(settings) / 'logs' / 'server.log'}, fix the cause, then run "
                f"`toolfleet infra up` again. Last lines:\n{process.log_tail(_log_file(settings))}"
            )
        try:
            # Only a Kafka client proves readiness; the cheap connect before it merely keeps
            # aiokafka from logging a connection error for every poll while the JVM boots.
            with socket.create_connection(("127.0.0.1", settings.kafka_port), timeout=2):
                pass
            _probe(settings)
            return
        except Exception as exc:  # any failure just means "not ready yet"
            last_error = f"{type(exc).__name__}: {exc}"
        time.sleep(0.5)
    raise InfrastructureError(
        f"Kafka did not answer on {settings.kafka_servers()} within {timeout:.0f} s "
        f"({last_error}). Read {kafka_dir(settings) / 'logs' / 'server.log'}; then "
        f"`toolfleet infra down` and `toolfleet infra up` again."
    )


def _probe(settings: Settings) -> None:
    # aiokafka is async-only; a private loop in a worker thread keeps this function usable
    # from synchronous code and from inside an already running event loop alike.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, _describe_cluster(settings)).result()


async def _describe_cluster(settings: Settings) -> None:
    from aiokafka.admin import AIOKafkaAdminClient

    from kernel.adapters.security import kafka_options

    admin = AIOKafkaAdminClient(**kafka_options(settings), request_timeout_ms=5000)
    try:
        await asyncio.wait_for(admin.start(), 10)
        cluster = await asyncio.wait_for(admin.describe_cluster(), 10)
        if not cluster.get("brokers"):
            raise InfrastructureError("the cluster reports no brokers yet")
    finally:
        await admin.close()
