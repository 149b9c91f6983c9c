"""What the console's tests share: the fleet they run, the turns they submit, the console
served for real (uvicorn on a free port, in this process or as ``toolfleet console``), its API
tokens, and a real OpenID Connect provider (panva's oidc-provider on Node)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from aiokafka import AIOKafkaConsumer, TopicPartition
from redis.asyncio import Redis

from kernel.settings import Settings
from kernel.stores.circuit import CircuitBreaker
from schemas import ModelResponseEvent
from tests.conftest import wait_for
from toolfleet.app.console import ConsoleOptions, create_app
from toolfleet.testing import LocalFleet

TOOLS = "tests.integration.console_tools:tools"
FLEET_ENV = {
    "TOOLFLEET_RECOVERY_PROBE_BACKOFF_S": "0.1",
    "TOOLFLEET_RECOVERY_REPORT_AFTER_S": "120",  # turns wait for the operator's answer
    "TOOLFLEET_CIRCUIT_MIN_CALLS": "3",
    "TOOLFLEET_CIRCUIT_ERROR_RATE": "0.5",
    "TOOLFLEET_CIRCUIT_CACHE_S": "0",
}
TRACE_TEMPLATE = "http://traces.example/trace/{trace_id}"
ROOT = Path(__file__).parents[2]
OIDC_DIR = Path(__file__).parent / "oidc"
"""The test OpenID Connect provider: package.json, package-lock.json and provider.mjs."""

TOKENS: dict[str, tuple[str, list[str]]] = {
    "alice": ("operator", ["*"]),
    "bob": ("operator", ["*"]),
    "root": ("admin", ["*"]),
    "vera": ("viewer", ["*"]),
    "acme-ops": ("operator", ["acme"]),
    "acme-admin": ("admin", ["acme"]),
}
"""The console's API tokens in these tests: name -> (role, tenants); each token's value is
``secret-NAME``."""


def tokens_setting(tokens: dict[str, tuple[str, list[str]]] = TOKENS) -> str:
    """TOOLFLEET_CONSOLE_TOKENS for ``tokens``: only the sha256 of each value is kept."""
    return json.dumps(
        [
            {
                "name": name,
                "sha256": hashlib.sha256(f"secret-{name}".encode()).hexdigest(),
                "role": role,
                "tenants": tenants,
            }
            for name, (role, tenants) in tokens.items()
        ]
    )


def bearer(name: str) -> dict[str, str]:
    """The Authorization header of the test token ``name``."""
    return {"Authorization": f"Bearer secret-{name}"}


FAILED_ON_PURPOSE = ("note@1", "memo@1", "quote@2")
"""The console tools whose calls the tests leave unknown (a human task to settle) or make
fail on purpose: each one counts against its version's circuit (``FLEET_ENV``), which the
tests of every console module share through the session's Redis namespace."""


async def fresh_circuits(redis: Redis, settings: Settings) -> None:
    """Close the circuits of ``FAILED_ON_PURPOSE`` and forget their windows: a test that
    leaves a call unknown or failed starts with none open, whichever tests ran before it."""
    breaker = CircuitBreaker(redis, settings)
    for ref in FAILED_ON_PURPOSE:
        await breaker.close(ref)


def console_fleet(settings: Settings) -> LocalFleet:
    """The fleet behind the console's tests: planner, aggregator, reconciler, one worker."""
    return LocalFleet(settings, tools=TOOLS, workers=1, extra_env=FLEET_ENV)


def turn(
    tenant: str,
    *calls: tuple[str, str, dict[str, Any]],
    run_id: str | None = None,
    turn_id: int = 0,
    **kw: Any,
) -> ModelResponseEvent:
    """A model response of ``tenant`` with one function call per (suffix, tool, arguments)."""
    run = run_id or f"run-{uuid.uuid4().hex[:10]}"
    return ModelResponseEvent.model_validate(
        {
            "tenant_id": tenant,
            "run_id": run,
            "turn_id": turn_id,
            "agent": {"name": "assistant"},
            "response_id": f"resp-{uuid.uuid4().hex[:8]}",
            "items": [
                {
                    "type": "function_call",
                    "call_id": f"{run}-{suffix}",
                    "name": name,
                    "arguments": json.dumps(args),
                }
                for suffix, name, args in calls
            ],
            **kw,
        }
    )


class _QuietServer(uvicorn.Server):
    """uvicorn without its signal handlers: the test process keeps its own."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def free_socket() -> socket.socket:
    """A socket bound to a free port of 127.0.0.1 (not listening yet): a console's URL is
    known before it starts, for the redirect URI an identity provider registers."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


def url_of(sock: socket.socket) -> str:
    """The console URL a socket of ``free_socket`` will serve."""
    return f"http://127.0.0.1:{sock.getsockname()[1]}"


@asynccontextmanager
async def served_console(
    settings: Settings, options: ConsoleOptions | None = None, *, sock: socket.socket | None = None
) -> AsyncIterator[str]:
    """A console served by uvicorn in this event loop on a free port (or ``sock``); its base
    URL, once its feed reads the topics."""
    sock = sock or free_socket()
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        create_app(settings, options),
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=1,
    )
    server = _QuietServer(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    url = f"http://127.0.0.1:{port}"
    try:
        await console_live(url)
        yield url
    finally:
        server.should_exit = True
        await serving


async def console_live(url: str, within: float = 30.0) -> None:
    """Wait until the console at ``url`` answers and its feed is live (it sees every record
    published from now on)."""

    async def live() -> bool:
        try:
            async with httpx.AsyncClient(base_url=url, timeout=2) as http:
                return (await http.get("/healthz")).status_code == 200
        except httpx.TransportError:
            return False

    await wait_for(live, within=within, interval=0.1)


def _terminate(popen: subprocess.Popen[str] | None) -> None:
    """SIGTERM a child process and wait for it (SIGKILL after 15 s)."""
    if popen is not None and popen.poll() is None:
        popen.terminate()
        try:
            popen.wait(15)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()


class ConsoleProcess:
    """``toolfleet console`` as a child process of the fleet's settings (and no sign-in
    settings but those of ``env``)."""

    def __init__(self, fleet: LocalFleet, *args: str, env: dict[str, str] | None = None) -> None:
        self.argv = [sys.executable, "-m", "toolfleet", "console", "--port", "0", *args]
        inherited = {k: v for k, v in fleet.env().items() if not k.startswith("TOOLFLEET_CONSOLE_")}
        self.env = {**inherited, **(env or {})}
        self.log = (fleet.log_dir / "console.log").open("ab")
        self.popen: subprocess.Popen[str] | None = None
        self.url = ""
        self.line = ""
        """The line it printed when it started (``console: URL``)."""

    def _spawn(self) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv, env=self.env, stdout=subprocess.PIPE, stderr=self.log, text=True
        )

    async def start(self, within: float = 30.0) -> str:
        """Start it, and return its URL once its feed is live."""
        self.popen = self._spawn()
        assert self.popen.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(self.popen.stdout.readline), within)
        assert line.startswith("console: "), f"console did not start: {line!r}"
        self.line = line.strip()
        self.url = self.line.removeprefix("console: ").split("?")[0].rstrip("/")
        await console_live(self.url, within)
        return self.url

    def stop(self) -> None:
        """SIGTERM it and wait."""
        _terminate(self.popen)
        self.log.close()


async def records(settings: Settings, topic: str) -> list[bytes]:
    """Every record's value on a logical topic, from the beginning to its end now."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_servers(),
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    await consumer.start()
    try:
        name = settings.topic(topic)
        partitions = [TopicPartition(name, p) for p in range(settings.partitions_of(topic))]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        found: list[bytes] = []
        while [tp for tp in partitions if await consumer.position(tp) < ends[tp]]:
            batches = await consumer.getmany(timeout_ms=500)
            found += [r.value for batch in batches.values() for r in batch if r.value]
        return found
    finally:
        await consumer.stop()


class OidcProvider:
    """A real OpenID Connect provider: panva's oidc-provider (OpenID Certified) run by Node
    from ``tests/integration/oidc`` (installed with ``npm ci`` from its lock file), with its
    development login form (any password; the login name is the account), one client per
    entry of ``clients`` and the ``accounts`` given (their claims)."""

    def __init__(
        self,
        clients: list[dict[str, Any]],
        accounts: dict[str, dict[str, Any]],
        log_dir: Path,
        **more: Any,
    ) -> None:
        """``more``: the rest of provider.mjs's configuration (``resourceServers``,
        ``tokenClaims``: JWT access tokens for resource servers)."""
        self.config = log_dir / f"oidc-{uuid.uuid4().hex[:8]}.json"
        self.config.write_text(json.dumps({"clients": clients, "accounts": accounts, **more}))
        self.log = (log_dir / "oidc-provider.log").open("ab")
        self.popen: subprocess.Popen[str] | None = None
        self.issuer = ""

    async def start(self, within: float = 60.0) -> str:
        """Install it when needed, start it, and return its issuer URL once it listens."""
        node = shutil.which("node")
        assert node, "node is missing: install Node.js 20 or later (make setup checks it)"
        install = await asyncio.to_thread(
            subprocess.run,
            ["sh", str(ROOT / "scripts" / "install-oidc-provider.sh")],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert install.returncode == 0, f"npm ci failed: {install.stderr}"
        self.popen = self._spawn(node)
        assert self.popen.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(self.popen.stdout.readline), within)
        assert line.startswith("oidc-provider: "), f"oidc-provider did not start: {line!r}"
        self.issuer = line.removeprefix("oidc-provider: ").strip()
        return self.issuer

    def _spawn(self, node: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [node, str(OIDC_DIR / "provider.mjs"), str(self.config)],
            cwd=OIDC_DIR,
            env={**os.environ, "NODE_ENV": "test"},
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )

    def stop(self) -> None:
        """SIGTERM it and wait."""
        _terminate(self.popen)
        self.log.close()
