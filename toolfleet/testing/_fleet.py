"""Testing helpers shipped with toolfleet: run a whole fleet as local processes.

``LocalFleet`` starts the planner, the aggregator and N worker processes with the given
settings, exactly as ``toolfleet planner|aggregator|worker`` would in production, and can
SIGKILL and restart a worker to test what happens when one dies mid-call.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from kernel.adapters.topics import command_topic
from kernel.settings import Settings
from schemas import AgentRef, ModelResponseEvent, TurnResult
from toolfleet.client import FleetClient, TurnTimeoutError


@dataclass
class ChildProcess:
    """One child process of a LocalFleet: its name, command line, log and handle."""

    name: str
    argv: list[str]
    log: IO[bytes]
    popen: subprocess.Popen[bytes] | None = None


@dataclass
class LocalFleet:
    """Planner, aggregator and workers as child processes sharing ``settings``."""

    settings: Settings
    tools: str
    """``module:attribute`` of the ToolRegistry every worker serves."""
    workers: int = 2
    pool: str = "default"
    worker_args: list[str] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)
    log_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="toolfleet-")))
    _procs: dict[str, ChildProcess] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        """The environment every child gets: the settings, as TOOLFLEET_* variables."""
        env = dict(os.environ)
        env.update(
            KAFKA_BOOTSTRAP_SERVERS=self.settings.kafka_servers(),
            REDIS_URL=self.settings.redis_address(),
            TOOLFLEET_TOPIC_PREFIX=self.settings.topic_prefix,
            TOOLFLEET_PARTITIONS=str(self.settings.partitions),
            TOOLFLEET_TOPIC_PARTITIONS=json.dumps(self.settings.topic_partitions),
            TOOLFLEET_IDENTITY_SCOPE=self.settings.identity_scope,
            TOOLFLEET_REDIS_WAIT_REPLICAS=str(self.settings.redis_wait_replicas),
            TOOLFLEET_REDIS_WAIT_TIMEOUT_MS=str(self.settings.redis_wait_timeout_ms),
            TOOLFLEET_METRICS_PORT="0",
            TOOLFLEET_DECISION_AUTH=self.settings.decision_auth,
            TOOLFLEET_DECISION_KEYS=json.dumps(self.settings.decision_keys),
            PYTHONUNBUFFERED="1",
        )
        env.update(_security_env(self.settings))
        env.update(self.extra_env)
        return env

    def __enter__(self) -> Self:
        self.start("planner", ["planner"])
        self.start("aggregator", ["aggregator"])
        self.start("reconciler", ["reconciler"])
        for n in range(self.workers):
            self.start_worker(n)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start_worker(self, n: int) -> None:
        """Start (or restart) worker number ``n``."""
        self.start(
            f"worker-{n}", ["worker", "--tools", self.tools, "--pool", self.pool, *self.worker_args]
        )

    def start(self, name: str, args: list[str]) -> None:
        """Start one ``toolfleet`` subcommand as a child process named ``name``."""
        log = (self.log_dir / f"{name}.log").open("ab")
        argv = [sys.executable, "-m", "toolfleet", *args]
        proc = ChildProcess(name, argv, log)
        proc.popen = subprocess.Popen(argv, env=self.env(), stdout=log, stderr=log)
        self._procs[name] = proc

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``toolfleet ARGS`` against this fleet (an operator's command), output captured;
        with ``check`` a non-zero exit raises CalledProcessError."""
        return subprocess.run(
            [sys.executable, "-m", "toolfleet", *args],
            env=self.env(),
            capture_output=True,
            text=True,
            check=check,
            timeout=60,
        )

    def pid(self, name: str) -> int:
        """The pid of a running child."""
        popen = self._procs[name].popen
        assert popen is not None
        return popen.pid

    def kill(self, name: str) -> None:
        """SIGKILL a child: no clean-up, exactly like a crashed machine."""
        popen = self._procs[name].popen
        assert popen is not None
        popen.send_signal(signal.SIGKILL)
        popen.wait()

    def terminate(self, name: str, timeout: float = 60.0) -> int:
        """SIGTERM a child, as Kubernetes stops a pod; wait for it; its exit code."""
        popen = self._procs[name].popen
        assert popen is not None
        popen.send_signal(signal.SIGTERM)
        return popen.wait(timeout=timeout)

    def alive(self, name: str) -> bool:
        """Whether the child is still running."""
        popen = self._procs[name].popen
        return popen is not None and popen.poll() is None

    async def ready(self, within: float = 120.0) -> None:
        """Wait until the workers' latest assignments cover every command partition once.

        A turn can complete before the last worker joins; tests about load spreading or
        limits need the whole pool in the group first. Workers log each assignment.
        """
        everything = list(range(self.settings.partitions_of(command_topic(self.pool))))
        async with asyncio.timeout(within):
            while True:
                self.check()
                latest = [self._assignment(f"worker-{n}") for n in range(self.workers)]
                if all(a is not None for a in latest):
                    owned = sorted(p for a in latest for p in a or [])
                    if owned == everything:
                        return
                await asyncio.sleep(0.1)  # polling interval of a deadline-bounded wait

    def _assignment(self, name: str) -> list[int] | None:
        found = None
        for line in self.logs(name).splitlines():
            if line.startswith("{") and '"partitions assigned"' in line:
                found = json.loads(line)["partitions"]
        return found

    def check(self) -> None:
        """Raise with the log's tail if any child has exited."""
        for name, proc in self._procs.items():
            if proc.popen is not None and proc.popen.poll() is not None:
                tail = "\n".join(self.logs(name).splitlines()[-15:])
                raise RuntimeError(f"{name} exited with {proc.popen.returncode}:\n{tail}")

    def metrics_port(self, name: str) -> int | None:
        """The port a child serves /metrics, /livez and /readyz on, from its log (the last
        one logged: a restarted child appends to its log); None until it has logged one."""
        ports = [
            int(json.loads(line)["port"])
            for line in self.logs(name).splitlines()
            if line.startswith("{") and '"serving metrics"' in line
        ]
        return ports[-1] if ports else None

    def logs(self, name: str) -> str:
        """What the child wrote so far."""
        return (self.log_dir / f"{name}.log").read_text(errors="replace")

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM every child, wait, SIGKILL the stragglers."""
        for proc in self._procs.values():
            if proc.popen and proc.popen.poll() is None:
                proc.popen.send_signal(signal.SIGTERM)
        for proc in self._procs.values():
            if proc.popen is None:
                continue
            try:
                proc.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait()
            proc.log.close()
        self._procs.clear()


@asynccontextmanager
async def connected_client(
    fleet: LocalFleet, settings: Settings, *, within: float = 120.0
) -> AsyncIterator[FleetClient]:
    """A FleetClient once the whole fleet serves: workers own their partitions (so their
    tools are published) and a first, empty turn has gone all the way through."""
    await fleet.ready(within)
    async with FleetClient(settings) as client:
        warm = ModelResponseEvent(
            tenant_id="warm-up",
            run_id=f"warm-{uuid.uuid4().hex[:8]}",
            turn_id=0,
            agent=AgentRef(name="warm-up"),
            response_id="warm-up",
        )
        await client.submit(warm)
        await result_of(fleet, client, warm.run_id, within=within)
        yield client


async def result_of(
    fleet: LocalFleet, client: FleetClient, run_id: str, turn_id: int = 0, *, within: float = 60
) -> TurnResult:
    """A turn's result; fails at once, with the log, if a service process died meanwhile."""
    deadline = time.monotonic() + within
    while True:
        fleet.check()
        try:
            return await client.result(run_id, turn_id, within=min(1.0, within))
        except TurnTimeoutError:
            if time.monotonic() > deadline:
                raise


_SECURITY_FIELDS = (
    "kafka_security_protocol",
    "kafka_sasl_mechanism",
    "kafka_sasl_username",
    "kafka_sasl_password",
    "kafka_sasl_oauth_token_provider",
    "kafka_ssl_cafile",
    "kafka_ssl_certfile",
    "kafka_ssl_keyfile",
    "kafka_ssl_key_password",
    "kafka_ssl_check_hostname",
    "redis_tls_ca_certs",
    "redis_tls_certfile",
    "redis_tls_keyfile",
)


def _security_env(settings: Settings) -> dict[str, str]:
    """The secured-connection settings as TOOLFLEET_* variables (those that are set)."""
    env: dict[str, str] = {}
    for name in _SECURITY_FIELDS:
        value = getattr(settings, name)
        if value is None:
            continue
        if hasattr(value, "get_secret_value"):
            value = value.get_secret_value()
        env[f"TOOLFLEET_{name.upper()}"] = (
            str(value).lower() if isinstance(value, bool) else str(value)
        )
    return env
