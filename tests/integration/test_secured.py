"""Secured connections for real: Kafka over SASL_SSL, Redis over TLS with an ACL user.

The module starts its own broker (the project's Kafka, from the same jars, with a SASL_SSL
listener: SASL PLAIN over TLS, client certificates required, hostname verification on) and its
own redis-server (TLS only, client certificates, the default user off and an ACL user for the
fleet), with a CA and certificates the test makes (``trustme``). A fleet of every service runs
one turn end to end over them; wrong credentials make a service fail fast, saying which
connection refused it and why.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest
import trustme
from cryptography.hazmat.primitives import serialization
from redis.asyncio import Redis

from kernel.settings import Settings
from schemas import ModelResponseEvent
from tests.integration.crash_tools import effects_key
from toolfleet.app.infra.kafka import SecuredListener, start_kafka, stop_kafka
from toolfleet.client import FleetClient
from toolfleet.testing import LocalFleet, connected_client

pytestmark = [pytest.mark.integration, pytest.mark.own_cluster]

TOOLS = "tests.integration.crash_tools:tools"
KAFKA_USER, KAFKA_PASSWORD = "toolfleet", "kafka-s3cret"
REDIS_USER, REDIS_PASSWORD = "fleet", "redis-s3cret"
BAD_PASSWORD = "not-the-password-42"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _pkcs8(cert: trustme.LeafCert) -> bytes:
    """The leaf's private key as PKCS#8 PEM (what a Kafka PEM keystore reads)."""
    key = serialization.load_pem_private_key(cert.private_key_pem.bytes(), password=None)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


@dataclass(frozen=True)
class Secured:
    """The secured services and the settings that reach them."""

    settings: Settings
    plain_redis_url: str
    """The suite's ordinary Redis, where the test tools count their side effects."""


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory, settings: Settings) -> Iterator[Secured]:
    home = tmp_path_factory.mktemp("secured")
    ca = trustme.CA()
    ca_file = home / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    server = ca.issue_cert("127.0.0.1", "localhost")
    keystore = home / "broker.pem"
    keystore.write_bytes(_pkcs8(server) + b"".join(c.bytes() for c in server.cert_chain_pems))
    server_cert, server_key = home / "server-cert.pem", home / "server-key.pem"
    server_cert.write_bytes(b"".join(c.bytes() for c in server.cert_chain_pems))
    server_key.write_bytes(_pkcs8(server))
    client = ca.issue_cert("toolfleet-client")
    client_cert, client_key = home / "client-cert.pem", home / "client-key.pem"
    client_cert.write_bytes(b"".join(c.bytes() for c in client.cert_chain_pems))
    client_key.write_bytes(_pkcs8(client))

    redis_port = _free_port()
    redis_dir = home / "redis"
    redis_dir.mkdir()
    redis_server = subprocess.Popen(
        [
            shutil.which("redis-server") or "redis-server",
            "--port", "0", "--tls-port", str(redis_port), "--bind", "127.0.0.1",
            "--tls-cert-file", str(server_cert), "--tls-key-file", str(server_key),
            "--tls-ca-cert-file", str(ca_file), "--tls-auth-clients", "yes",
            "--dir", str(redis_dir), "--appendonly", "yes", "--appendfsync", "always",
            "--user", "default", "off",
            "--user", REDIS_USER, "on", f">{REDIS_PASSWORD}", "~*", "&*", "+@all",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    secured_settings = settings.model_copy(
        update={
            "state_dir": home / "state",
            "kafka_bootstrap_servers": None,
            "kafka_port": _free_port(),
            "kafka_controller_port": _free_port(),
            "kafka_security_protocol": "SASL_SSL",
            "kafka_sasl_mechanism": "PLAIN",
            "kafka_sasl_username": KAFKA_USER,
            "kafka_sasl_password": KAFKA_PASSWORD,
            "kafka_ssl_cafile": ca_file,
            "kafka_ssl_certfile": client_cert,
            "kafka_ssl_keyfile": client_key,
            "redis_url": f"rediss://{REDIS_USER}:{REDIS_PASSWORD}@127.0.0.1:{redis_port}/0",
            "redis_tls_ca_certs": ca_file,
            "redis_tls_certfile": client_cert,
            "redis_tls_keyfile": client_key,
        }
    )
    secured_settings = Settings.model_validate(secured_settings.model_dump())  # SecretStr
    listener = SecuredListener(
        keystore=keystore,
        truststore=ca_file,
        users={"broker": "broker-s3cret", KAFKA_USER: KAFKA_PASSWORD},
    )
    try:
        start_kafka(secured_settings, secured=listener)
        yield Secured(secured_settings, settings.redis_address())
    finally:
        stop_kafka(secured_settings)
        redis_server.terminate()
        redis_server.wait(timeout=30)


@pytest.fixture(scope="module")
def fleet(secured: Secured) -> Iterator[LocalFleet]:
    env = {"TEST_SIDE_EFFECTS_URL": secured.plain_redis_url}
    with LocalFleet(secured.settings, tools=TOOLS, workers=1, extra_env=env) as running:
        yield running


@pytest.fixture(scope="module")
async def client(fleet: LocalFleet, secured: Secured) -> AsyncIterator[FleetClient]:
    async with connected_client(fleet, secured.settings) as fleet_client:
        yield fleet_client


async def test_a_turn_runs_end_to_end_over_sasl_ssl_and_redis_tls(
    client: FleetClient, secured: Secured, redis: Redis
) -> None:
    run_id = f"secured-{uuid.uuid4().hex[:8]}"
    call_id = f"{run_id}-c"
    event = ModelResponseEvent.model_validate(
        {
            "tenant_id": "secured", "run_id": run_id, "turn_id": 0,
            "agent": {"name": "a"}, "response_id": "r",
            "items": [{"type": "function_call", "call_id": call_id, "name": "charge",
                       "arguments": '{"amount": 7}'}],
        }
    )  # fmt: skip
    result = await client.run_turn(event, within=60)
    assert (result.status, [o.output for o in result.outputs]) == ("completed", ["charged 7"])
    assert int(await redis.get(effects_key(call_id)) or 0) == 1  # ran once, on the worker
    # The state went to the TLS Redis, as the ACL user: the call's ledger entry is there.
    from kernel.adapters.redis import connect_redis

    state = connect_redis(secured.settings)
    try:
        assert await state.acl_whoami() in (REDIS_USER, REDIS_USER.encode())
        assert await state.dbsize() > 0
    finally:
        await state.aclose()


def _start_with(secured: Secured, **update: object) -> subprocess.CompletedProcess[str]:
    """Start a planner with ``update`` applied to the secured settings; wait for it to exit."""
    wrong = Settings.model_validate(secured.settings.model_dump() | update)
    fleet = LocalFleet(wrong, tools=TOOLS, workers=0)
    return subprocess.run(
        [sys.executable, "-m", "toolfleet", "planner"],
        env=fleet.env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("update", "says"),
    [
        ({"kafka_sasl_password": BAD_PASSWORD}, "refused SASL PLAIN authentication as"),
        ({"redis_url": "bad password"}, "Redis refused the credentials of REDIS_URL"),
    ],
    ids=["kafka-password", "redis-password"],
)
def test_a_wrong_password_fails_fast_and_says_which_connection(
    secured: Secured, update: dict[str, object], says: str
) -> None:
    if "redis_url" in update:
        url = secured.settings.redis_address().replace(REDIS_PASSWORD, BAD_PASSWORD)
        update = {"redis_url": url}
    began = time.monotonic()
    done = _start_with(secured, **update)
    assert done.returncode != 0
    assert says in done.stderr, done.stderr[-2000:]
    assert time.monotonic() - began < 45  # it fails instead of waiting for a recovery
    assert BAD_PASSWORD not in done.stderr  # and never prints the secret
