"""Admission's script alone, on a private Redis: python -m bench.admission_pass.

Admission is the one part of the fleet's state that a Redis Cluster cannot spread (every
decision reads and writes its structures together, in one hash slot), so its cost per call
is the floor of the busiest shard's. This measures it without the fleet: a private
``redis-server`` with toolfleet's durable settings, one worker's slots registered, and passes
that each release ``--batch`` calls, confirm the previous pass's and queue ``--batch`` new
ones (with ``--outstanding`` calls admitted at any time, as a loaded fleet holds them), the
way a planner's group-committed passes do under load.

Printed per batch size: the script's time per call (INFO commandstats, ``evalsha``) and the
server's CPU per call (``used_cpu_user`` + ``used_cpu_sys``: also the network and the AOF).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis as sync_redis
from redis.asyncio import Redis

from kernel.stores.admission import Admission, Waiting
from kernel.stores.keys import Keys
from toolfleet.app.infra.redis import redis_server, server_argv


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _measure(port: int, batch: int, outstanding: int, passes: int, payload: int) -> str:
    """One row: ``passes`` measured passes of ``batch`` calls after a warm-up to
    ``outstanding`` admitted calls."""
    client = Redis(port=port)
    admission = Admission(client, Keys(f"tf:pass-{batch}"))
    await admission.register_worker("default", "w0", 2 * outstanding, 3600, time.time())
    queued = 'default\x1f\x1f{"query":"' + "x" * payload + '"}'  # pool, no trace, command
    admitted: list[str] = []
    confirm: list[str] = []
    serial = 0

    def fresh() -> list[Waiting]:
        nonlocal serial
        calls = []
        for _ in range(batch):
            serial += 1
            run, call = divmod(serial, 5)
            calls.append(Waiting("t0", f"run{run}", f"c{call}", 1, "noop", "default", queued))
        return calls

    async def one_pass() -> None:
        nonlocal admitted, confirm
        release = admitted[:batch] if len(admitted) >= outstanding else []
        admitted = admitted[len(release) :]
        result = await admission.admit(
            time.time(), release=release, published=confirm, enqueue=fresh()
        )
        confirm = [member for member, _ in result.calls]
        admitted += confirm

    for _ in range(outstanding // batch + 20):
        await one_pass()
    server = sync_redis.Redis(port=port)
    server.config_resetstat()
    before = server.info("cpu")
    for _ in range(passes):
        await one_pass()
    after = server.info("cpu")
    script = server.info("commandstats").get("cmdstat_evalsha", {"usec": 0})
    server.close()
    await client.aclose()
    calls = passes * batch
    cpu = sum(after[k] - before[k] for k in ("used_cpu_user", "used_cpu_sys"))
    return f"| {batch} | {outstanding} | {script['usec'] / calls:.1f} | {cpu * 1e6 / calls:.1f} |"


def _wait_ready(port: int) -> None:
    probe = sync_redis.Redis(port=port)
    deadline = time.monotonic() + 10
    try:
        while True:
            try:
                probe.ping()
                return
            except sync_redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    finally:
        probe.close()


async def _rows(port: int, args: argparse.Namespace) -> None:
    print("| calls per pass | admitted at once | script µs per call | Redis CPU µs per call |")
    print("|---|---|---|---|")
    for batch in args.batch:
        print(await _measure(port, batch, args.outstanding, args.passes, args.payload))


def main(args: argparse.Namespace) -> None:
    """A private redis-server as toolfleet runs one, and one row per batch size on it."""
    port = _free_port()
    home = Path(tempfile.mkdtemp(prefix="toolfleet-admission-"))
    server = subprocess.Popen(
        server_argv(redis_server(), port, home), stdout=subprocess.DEVNULL, cwd=home
    )
    try:
        _wait_ready(port)
        asyncio.run(_rows(port, args))
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.admission_pass", description=__doc__)
    parser.add_argument(
        "--batch",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[5, 30, 100],
        help="calls per pass, one row each",
    )
    parser.add_argument("--outstanding", type=int, default=1600)
    parser.add_argument("--passes", type=int, default=1000)
    parser.add_argument("--payload", type=int, default=900, help="bytes of each command")
    main(parser.parse_args())
