"""What the MCP front door costs: python -m bench.mcp_door (``make bench-mcp``).

One fleet (planner, aggregator, reconciler, two workers serving ``bench.tools:tools``) and one
``toolfleet mcp`` process in front of it (a static token of tenant ``bench``). In one run, the
same one-call turn (``bench_noop``) goes two ways:

- **FleetClient**: ``FleetClient.run_turn`` in the bench process, straight to Kafka;
- **FleetClient, on the outcome**: the door's own wait without HTTP and MCP: follow the run's
  outcomes (``FleetClient.follow``), submit, answer with the first outcome that settles the
  call (the aggregator's rule), not the aggregator's turn result;
- **MCP door**: ``tools/call`` from the ``mcp`` package's client (Streamable HTTP, one client
  reused for every call) to the door, which runs the same one-call turn on the fleet and
  answers on the call's outcome.

(a) idle: ``--turns`` turns one at a time per way, the ways taking turns call by call so that
all see the same fleet; p50 / p99. (b) load: ``--callers`` concurrent callers through each
way for ``--seconds``; calls/s, p50 / p99, the door's CPU per call and the bench process's
(the callers' side). Prints a markdown report and writes it to ``bench/results/mcp-door.md``
(``--out``). Every process it starts is stopped on the way out.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import hashlib
import json
import os
import re
import secrets
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx2
import psutil
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client

from bench.procs import REPO, progress
from kernel.adapters.topics import ensure_topics
from kernel.rules.effects import settles_call
from kernel.settings import Settings
from schemas import AgentRef, CallOutcome, ModelResponseEvent
from toolfleet.app import infra
from toolfleet.client import FleetClient
from toolfleet.testing import LocalFleet, connected_client

TENANT = "bench"
OUT = REPO / "bench" / "results" / "mcp-door.md"

Call = Callable[[], Awaitable[None]]

FLEET, OUTCOME, DOOR = "FleetClient.run_turn", "FleetClient, on the outcome", "MCP door"


def _turn() -> ModelResponseEvent:
    run = f"mcp-bench-{uuid.uuid4().hex[:10]}"
    return ModelResponseEvent(
        tenant_id=TENANT, run_id=run, turn_id=0, agent=AgentRef(name="bench"),
        response_id=f"resp-{run}",
        items=[{"type": "function_call", "call_id": f"{run}-0", "name": "bench_noop",
                "arguments": '{"query": "x"}'}],
    )  # fmt: skip


def _fleet_call(client: FleetClient) -> Call:
    async def call() -> None:
        result = await client.run_turn(_turn(), within=120)
        assert result.status == "completed", result

    return call


def _outcome_call(client: FleetClient) -> Call:
    async def call() -> None:
        event = _turn()
        settled: asyncio.Future[CallOutcome] = asyncio.get_running_loop().create_future()

        def on_outcome(outcome: CallOutcome) -> None:
            settles = outcome.kind == "execute" and settles_call(outcome, "reconcile_then_report")
            if settles and not settled.done():
                settled.set_result(outcome)

        stop = await client.follow(event.run_id, 0, on_outcome)
        try:
            await client.submit(event)
            outcome = await asyncio.wait_for(settled, 120)
        finally:
            stop()
        assert outcome.status == "succeeded", outcome

    return call


def _door_call(client: Client) -> Call:
    async def call() -> None:
        result = await client.call_tool("bench_noop", {"query": "x"})
        assert result.is_error is False, result

    return call


async def _door_url(fleet: LocalFleet, within: float = 60) -> str:
    """The door's MCP URL, as ``toolfleet mcp --port 0`` prints it once it serves."""
    deadline = time.monotonic() + within
    while True:
        fleet.check()
        found = re.search(r"^mcp: (http://\S+)$", fleet.logs("mcp"), flags=re.MULTILINE)
        if found:
            return found.group(1)
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the door did not start within {within:.0f} s:\n{fleet.logs('mcp')}"
            )
        await asyncio.sleep(0.2)  # polling interval of a deadline-bounded wait


def _tokens(token: str) -> str:
    digest = hashlib.sha256(token.encode()).hexdigest()
    return json.dumps(
        [{"name": "bench", "sha256": digest, "role": "operator", "tenants": [TENANT]}]
    )


@asynccontextmanager
async def _door_client(url: str, token: str) -> AsyncIterator[Client]:
    """The ``mcp`` package's client of the door, once the door lists ``bench_noop``."""
    headers = {"Authorization": f"Bearer {token}"}
    limits = httpx2.Limits(max_connections=200, max_keepalive_connections=200)
    timeout = httpx2.Timeout(30, read=120)
    async with (
        httpx2.AsyncClient(headers=headers, timeout=timeout, limits=limits) as http,
        Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
    ):
        deadline = time.monotonic() + 60
        while "bench_noop" not in {tool.name for tool in (await client.list_tools()).tools}:
            if time.monotonic() > deadline:
                raise RuntimeError("the door did not list bench_noop within 60 s")
            await asyncio.sleep(0.2)  # polling interval of a deadline-bounded wait
        yield client


def _cuts(samples: list[float]) -> tuple[float, float]:
    """p50 and p99, in ms."""
    cuts = statistics.quantiles(samples, n=100, method="inclusive")
    return cuts[49] * 1000, cuts[98] * 1000


async def _timed(call: Call, into: list[float]) -> None:
    began = time.perf_counter()
    await call()
    into.append(time.perf_counter() - began)


async def _idle(ways: dict[str, Call], turns: int) -> dict[str, list[float]]:
    """``turns`` calls per way, one at a time, alternating ways call by call."""
    samples: dict[str, list[float]] = {name: [] for name in ways}
    for i in range(turns):
        order = list(ways.items())
        for name, call in order[i % len(order) :] + order[: i % len(order)]:
            await _timed(call, samples[name])
    return samples


@dataclass
class Load:
    """One way's figures under load."""

    calls: int
    seconds: float
    samples: list[float]
    door_cpu_s: float
    bench_cpu_s: float

    @property
    def rate(self) -> float:
        """Calls per second."""
        return self.calls / self.seconds


async def _load(call: Call, callers: int, seconds: float, door: psutil.Process) -> Load:
    """``callers`` concurrent callers, each calling again as soon as its call returns."""
    samples: list[float] = []
    stop = time.monotonic() + seconds

    async def caller() -> None:
        while time.monotonic() < stop:
            await _timed(call, samples)

    bench = psutil.Process()
    cpu, own = sum(door.cpu_times()[:2]), sum(bench.cpu_times()[:2])
    began = time.monotonic()
    await asyncio.gather(*(caller() for _ in range(callers)))
    elapsed = time.monotonic() - began
    door_cpu, bench_cpu = sum(door.cpu_times()[:2]) - cpu, sum(bench.cpu_times()[:2]) - own
    return Load(len(samples), elapsed, samples, door_cpu, bench_cpu)


async def _run(args: argparse.Namespace) -> str:
    base = Settings()
    infra.up(base)
    settings = base.model_copy(update={"topic_prefix": f"mcpdoor-{uuid.uuid4().hex[:6]}."})
    await ensure_topics(settings)
    token = secrets.token_urlsafe(32)
    extra = {"TOOLFLEET_MCP_TOKENS": _tokens(token)}
    with LocalFleet(settings, tools="bench.tools:tools", workers=2, extra_env=extra) as fleet:
        fleet.start("mcp", ["mcp", "--host", "127.0.0.1", "--port", "0"])
        door = psutil.Process(fleet.pid("mcp"))
        url = await _door_url(fleet)
        progress("fleet and door up; warming both ways")
        async with (
            connected_client(fleet, settings) as fleet_client,
            _door_client(url, token) as door_client,
        ):
            ways = {
                FLEET: _fleet_call(fleet_client),
                OUTCOME: _outcome_call(fleet_client),
                DOOR: _door_call(door_client),
            }
            await _idle(ways, 30)  # warm: connections, pools, the door's tool directory
            progress(f"(a) idle: {args.turns} turns each way, alternating")
            idle = await _idle(ways, args.turns)
            loads: dict[str, Load] = {}
            for name, call in ways.items():
                progress(f"(b) {args.callers} callers through {name} for {args.seconds:.0f} s")
                await _load(call, args.callers, 3, door)  # warm the pools under load
                loads[name] = await _load(call, args.callers, args.seconds, door)
            fleet.check()
    return _report(args, idle, loads)


def _report(args: argparse.Namespace, idle: dict[str, list[float]], loads: dict[str, Load]) -> str:
    cuts = {name: _cuts(samples) for name, samples in idle.items()}
    (fleet_p50, fleet_p99), (door_p50, door_p99) = cuts[FLEET], cuts[DOOR]
    (own_p50, own_p99) = cuts[OUTCOME]
    lines = [
        "# The MCP front door against FleetClient (`python -m bench.mcp_door`)",
        "",
        f"{dt.date.today().isoformat()}, this machine ({os.cpu_count()} cores), local Kafka and "
        "Redis, a fleet of planner, aggregator, reconciler and two workers, and one "
        "`toolfleet mcp` process in front of it (static token). The same one-call turn "
        "(`bench_noop`), in one run, three ways: `FleetClient.run_turn` (an application's "
        "turn, answered by the aggregator's turn result); `FleetClient` answered on the "
        "call's outcome (the door's own wait, without HTTP and MCP); and `tools/call` through "
        "the door from the `mcp` package's client (Streamable HTTP, one client reused). The "
        "door answers a call on its outcome, as the second way does, so it skips the hop "
        "through the aggregator that `run_turn` waits for.",
        "",
        f"(a) Idle: {args.turns:,} calls each way, one at a time, the ways taking turns.",
        "",
        "| way | p50 ms | p99 ms |",
        "|---|---|---|",
        *(f"| {name} | {p50:.1f} | {p99:.1f} |" for name, (p50, p99) in cuts.items()),
        "",
        f"(b) Load: {args.callers} concurrent callers through each way for "
        f"{args.seconds:.0f} s (one way after the other). CPU per call: the door process's, "
        "and the bench process's, where the callers and their client run.",
        "",
        "| way | calls | calls/s | p50 ms | p99 ms | door CPU ms/call | callers' CPU ms/call |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, load in loads.items():
        p50, p99 = _cuts(load.samples)
        door_cpu = f"{load.door_cpu_s / load.calls * 1000:.2f}" if name == DOOR else "-"
        lines.append(
            f"| {name} | {load.calls:,} | {load.rate:,.0f} | {p50:.1f} | {p99:.1f} | "
            f"{door_cpu} | {load.bench_cpu_s / load.calls * 1000:.2f} |"
        )
    ratio = loads[DOOR].rate / loads[FLEET].rate
    lines += [
        "",
        f"Idle, a call through the door takes {door_p50 - fleet_p50:+.1f} ms at p50 and "
        f"{door_p99 - fleet_p99:+.1f} ms at p99 against `FleetClient.run_turn`; against the "
        f"same wait without HTTP and MCP, the door adds {door_p50 - own_p50:.1f} ms at p50 "
        f"and {door_p99 - own_p99:.1f} ms at p99. Under {args.callers} callers the door "
        f"serves {ratio:.0%} of `run_turn`'s calls/s ({loads[DOOR].rate:,.0f} against "
        f"{loads[FLEET].rate:,.0f}): one door process, on a machine of "
        f"{os.cpu_count()} cores it shares with the whole fleet and the callers.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    """Parse the arguments, run, print and write the report."""
    parser = argparse.ArgumentParser(prog="python -m bench.mcp_door", description=__doc__)
    parser.add_argument("--turns", type=int, default=300, help="idle calls each way")
    parser.add_argument("--callers", type=int, default=50, help="concurrent callers in (b)")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of (b), each way")
    parser.add_argument("--out", type=Path, default=OUT, help="where the report is written")
    args = parser.parse_args()
    report = asyncio.run(_run(args))
    print(report)
    args.out.write_text(report)


if __name__ == "__main__":
    main()
