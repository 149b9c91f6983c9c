"""The scenarios, system by system: (a) throughput, (b) latency, (c) I/O-bound, (d) scale,
(e) idle latency.

Systems run one after another (two cores cannot host two systems at once without each
skewing the other), and every figure of one run is measured on the same machine, broker and
Redis within minutes of the others.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
from redis.asyncio import Redis

from bench import state_scale
from bench import tools as bench_tools
from bench.baseline import Baseline
from bench.procs import (
    REPO,
    CpuMeter,
    cpu_seconds,
    infra_pids,
    peak_rss_bytes,
    progress,
    rss_bytes,
)
from bench.report import (
    Idle,
    IoBound,
    Latency,
    Profile,
    Results,
    Scale,
    Throughput,
    tree_excerpt,
)
from bench.systems import Peer, RunContext, Toolfleet, celery, relay, toolfleet
from bench.targets import InProcessTarget
from bench.warmup import ROUND_S, warm_broker
from bench.workload import (
    LoadResult,
    Target,
    TurnFactory,
    closed_loop,
    open_loop,
    prime,
    query_args,
)
from kernel.settings import Settings
from kernel.stores.keys import Keys

TURN_SIZES = (1, 5, 20)
WORKERS = (1, 2)
LATENCY_CALLS = 5
LATENCY_WORKERS = 2
IDLE_TURN_SIZES = (1, 5)
"""(e): turns of these sizes, one outstanding at a time."""
IO_CONCURRENCY = (10, 100, 1000)
WINDOW_CALLS = 1600
"""Calls (a) keeps outstanding: enough that every system's maximum, not its latency, sets the
pace (at 400 the relay left 17% of the machine idle at 20 calls per turn, toolfleet 14%)."""
CELERY_WINDOW_CALLS = 400
"""Celery's (a) window: its calls/s fall as its backlog deepens (1 call per turn: 106 with 400
outstanding, 54 with 1,600), so it is measured where it does best."""
NOOP_CONCURRENCY = WINDOW_CALLS
"""Worker ``--concurrency`` for (a) and (b): the calls (a) keeps outstanding, so that a
worker's slots are not what limits a pipeline of no-op calls (the relay's worker has none)."""


@dataclass(frozen=True)
class Durations:
    """How long each measurement runs (seconds); ``quick`` for trying the harness out."""

    warmup: float = 1.5
    measure: float = 4.0
    latency: float = 10.0
    io: float = 4.0
    profile: float = 6.0
    scale_budget: float = 120.0
    scale_calls: int = 100_000
    shards: float = 8.0
    """(f)'s window per row and layout: its figures are per call, so a few thousand calls do."""

    @classmethod
    def quick(cls) -> Durations:
        return cls(1.0, 2.0, 4.0, 2.0, 4.0, 30.0, 10_000, shards=2.0)

    def short(self) -> Durations:
        """For the in-process baseline, whose figures settle within a second."""
        return dataclasses.replace(
            self, warmup=min(self.warmup, 1.0), measure=min(self.measure, 2.0),
            latency=min(self.latency, 6.0), io=min(self.io, 2.0),
        )  # fmt: skip


QUIET_SHARE = 0.15
"""Kafka's CPU (share of a core) under which the broker counts as quiet before a system runs."""
QUIET_WITHIN_S = 30.0
"""How long the bench waits for a quiet broker before it measures anyway (and says so)."""


def window(calls_per_turn: int, outstanding: int = WINDOW_CALLS) -> int:
    """Turns kept outstanding in the closed loop: about ``outstanding`` calls."""
    return max(4, outstanding // calls_per_turn)


class Bench:
    """One bench run: the context, durations, and the results filled in as it goes."""

    def __init__(self, ctx: RunContext, durations: Durations, results: Results) -> None:
        self.ctx = ctx
        self.d = durations
        self.results = results
        self.infra = infra_pids(ctx.base)
        self.tf_busiest: tuple[str, float, int, int] | None = None
        self.profile_service: str | None = None
        """Profile this service instead of the busiest one (``--profile NAME``)."""
        self.baseline: Baseline | None = None
        """Another commit whose toolfleet runs (a)'s rows too (``--baseline REF``)."""

    async def warm_broker(self) -> None:
        """Compile the broker's request paths before the first row (``bench.warmup``)."""
        pid = self.infra.get("kafka")
        if pid is None:  # a broker elsewhere (KAFKA_BOOTSTRAP_SERVERS): not ours to measure
            return
        progress("warming the broker's JVM (its JIT compiles the request paths under traffic)")
        try:
            warm = await warm_broker(self.ctx.base, pid)
        except Exception as exc:  # the rows still run; the report says they met a cold broker
            note = (
                f"The broker could not be warmed before the first row "
                f"({type(exc).__name__}: {exc})."
            )
            self.results.meta["warmup"] = note
            progress(note)
            return
        rounds = warm.rounds_us
        summary = (
            f"Before the first row the broker's JVM was warmed for {warm.seconds:.0f} s "
            f"(its CPU per send {rounds[0]:,.0f} µs in the first {ROUND_S:g} s, "
            f"{rounds[-1]:,.0f} µs in the last"
            + ("" if warm.settled else "; its JIT compiler was still busy when the time ran out")
            + ")."
        )
        self.results.meta["warmup"] = summary
        progress(summary)

    async def quiet_broker(self, before: str) -> None:
        """Wait (up to ``QUIET_WITHIN_S``) until Kafka uses under ``QUIET_SHARE`` of a core.

        A broker just started, or deleting the topics of earlier runs (their partitions and
        their groups' offsets), spends a core of its own for a minute or more; measured in
        that time, the first system pays for it. The report says when the wait ran out.
        """
        pid = self.infra.get("kafka")
        if pid is None:
            return
        deadline = time.monotonic() + QUIET_WITHIN_S
        share = math.inf
        while time.monotonic() < deadline:
            began, used = time.monotonic(), cpu_seconds(pid)
            await asyncio.sleep(1.0)  # the sampling window of the broker's CPU
            share = (cpu_seconds(pid) - used) / (time.monotonic() - began)
            if share < QUIET_SHARE:
                return
        note = f"Kafka still used {share:.0%} of a core before {before}'s rows"
        self.results.meta["noise"] = (self.results.meta.get("noise", "") + " " + note + ".").strip()
        progress(note)

    def meter(self, pids: dict[str, int]) -> CpuMeter:
        pids = {**pids, **self.infra, "driver": os.getpid()}
        return CpuMeter(pids, redis_url=self.ctx.base.redis_address())

    async def throughput(  # noqa: PLR0917 - one row of the table, one argument per column
        self,
        system: str,
        target: Target,
        pids: dict[str, int],
        calls: int,
        workers: int,
        check: Callable[[], None] | None,
        tenant: str | None = None,
        outstanding: int = WINDOW_CALLS,
    ) -> Throughput:
        factory = TurnFactory(tenant or self.ctx.tenant, "bench_noop", calls, query_args)
        await prime(target, factory, check=check)
        meter = self.meter(pids)
        result = await closed_loop(
            target,
            factory,
            window=window(calls, outstanding),
            warmup_s=self.d.warmup,
            measure_s=self.d.measure,
            check=check,
            meter=meter,
        )
        row = Throughput(
            system,
            calls,
            workers,
            result.calls_per_s,
            result.turns_per_s,
            result.failed,
            meter.seconds,
            meter.used,
            meter.machine_busy,
            meter.redis_commands,
            meter.aof_rewrites,
        )
        self.results.throughput.append(row)
        progress(
            f"(a) {system:<9} {calls:>2} calls/turn {workers} worker(s): "
            f"{result.calls_per_s:,.0f} calls/s, {result.turns_per_s:,.1f} turns/s"
            + (f", {result.failed} FAILED" if result.failed else "")
        )
        return row

    async def latency(
        self,
        system: str,
        target: Target,
        rate: float,
        check: Callable[[], None] | None,
        note: str = "",
    ) -> Latency:
        factory = TurnFactory(self.ctx.tenant, "bench_noop", LATENCY_CALLS, query_args)
        redis_watch = self.meter({})  # a rewrite of a grown dataset shows in the tail
        redis_watch.start()
        result = await open_loop(
            target,
            factory,
            rate=rate,
            warmup_s=self.d.warmup,
            measure_s=self.d.latency,
            check=check,
        )
        redis_watch.stop()
        if redis_watch.aof_rewrites:
            rewrites = f"Redis rewrote its AOF {redis_watch.aof_rewrites}x during the run"
            note = f"{note}; {rewrites}" if note else rewrites
        row = _latency_row(system, rate, result, note)
        self.results.latency.append(row)
        progress(
            f"(b) {system:<9} at {rate:.1f} turns/s: p50 {row.p50_ms:.1f} ms, "
            f"p95 {row.p95_ms:.1f} ms, p99 {row.p99_ms:.1f} ms ({row.turns} turns)"
        )
        return row

    async def idle(self, system: str, target: Target, check: Callable[[], None] | None) -> None:
        """(e): one turn outstanding at a time, for each of ``IDLE_TURN_SIZES``."""
        for calls in IDLE_TURN_SIZES:
            factory = TurnFactory(self.ctx.tenant, "bench_noop", calls, query_args)
            result = await closed_loop(
                target,
                factory,
                window=1,
                warmup_s=self.d.warmup,
                measure_s=self.d.latency,
                check=check,
                keep_latency=True,
            )
            row = Idle(
                system, calls, len(result.latencies_s), result.percentile_ms(50),
                result.percentile_ms(95), result.percentile_ms(99), result.phases_ms,
            )  # fmt: skip
            self.results.idle.append(row)
            progress(
                f"(e) {system:<9} {calls:>2} calls/turn, one at a time: p50 {row.p50_ms:.1f} ms, "
                f"p95 {row.p95_ms:.1f} ms, p99 {row.p99_ms:.1f} ms ({row.turns} turns)"
            )

    # ------------------------------------------------------------------------- toolfleet

    async def run_toolfleet(self, scenarios: set[str]) -> None:
        async with toolfleet(self.ctx, "tf", workers=1, concurrency=NOOP_CONCURRENCY) as tf:
            redis_before = await _used_memory(self.ctx)
            if "a" in scenarios or "b" in scenarios:
                for workers in WORKERS:
                    await tf.set_workers(workers)
                    for calls in TURN_SIZES:
                        row = await self.throughput(
                            "toolfleet", tf.target, tf.pids(), calls, workers, tf.check
                        )
                        self._note_busiest(row)
                self.results.retained_per_call = await _retained_per_call(self.ctx, tf.settings)
                grown = (await _used_memory(self.ctx) - redis_before) / 2**20
                progress(
                    f"redis: used_memory +{grown:.0f} MiB over (a); "
                    f"{self.results.retained_per_call:,.0f} bytes kept per finished call"
                )
            if "b" in scenarios:
                top = self.results.tp("toolfleet", LATENCY_CALLS, LATENCY_WORKERS)
                if top is not None:
                    await tf.set_workers(LATENCY_WORKERS)
                    await self.latency("toolfleet", tf.target, top.turns_per_s / 2, tf.check)
            if "c" in scenarios:
                await self.io_bound(tf)
            if "e" in scenarios:
                await tf.set_workers(LATENCY_WORKERS)
                await self.idle("toolfleet", tf.target, tf.check)
        if "profile" in scenarios and self.tf_busiest is not None:
            await self.profile()

    async def run_baseline(self, scenarios: set[str]) -> None:
        """(a)'s toolfleet rows again, and (c) at its highest concurrency, by the services
        of the baseline commit's tree."""
        base = self.baseline
        if base is None or "a" not in scenarios:
            return
        found = await asyncio.to_thread(base.check_imports)
        progress(f"{base.system}: its services import toolfleet from {found['toolfleet']}")
        self.results.baseline = base.system
        self.results.meta["baseline"] = (
            f"commit {base.short} (`--baseline {base.ref}`; its tree in "
            f"`{base.root.relative_to(REPO) if base.root.is_relative_to(REPO) else base.root}`)"
        )
        name = f"base-{base.short}"
        async with toolfleet(
            self.ctx, name, workers=1, concurrency=NOOP_CONCURRENCY, root=base.root
        ) as tf:
            for workers in WORKERS:
                await tf.set_workers(workers)
                for calls in TURN_SIZES:
                    await self.throughput(
                        base.system, tf.target, tf.pids(), calls, workers, tf.check
                    )
            if "c" in scenarios:  # the gain at concurrency 1,000 is measured against it
                concurrency = max(IO_CONCURRENCY)
                await tf.set_workers(1, concurrency)
                row = await self._io_run(base.system, tf.target, tf.pids(), concurrency, tf.check)
                progress(
                    f"(c) {base.system} concurrency {concurrency:>4}: "
                    f"{row.calls_per_s:,.0f} calls/s ({row.calls_per_s / row.ideal:.0%} of linear)"
                )

    def _note_busiest(self, row: Throughput) -> None:
        span = row.seconds or self.d.measure
        for name, used in row.cpu_s.items():
            if name in ("kafka", "redis", "driver"):
                continue
            if self.profile_service is not None and name != self.profile_service:
                continue
            share = used / span
            if self.tf_busiest is None or share > self.tf_busiest[1]:
                self.tf_busiest = (name, share, row.calls_per_turn, row.workers)

    async def profile(self) -> None:
        """Every toolfleet service under pyinstrument, under the load the busiest one had.

        A fleet of its own (each service started under the profiler, CPU samples); the run
        is as long as ``Durations.profile``, and the profiles are written when it stops.
        """
        assert self.tf_busiest is not None
        busiest, share, calls, workers = self.tf_busiest
        names = ["planner", "aggregator", "reconciler", *(f"worker-{n}" for n in range(workers))]
        stems = {name: self.ctx.results / f"profile-{name}" for name in names}
        progress(
            f"profile: every service under pyinstrument, {calls} calls/turn, {workers} "
            f"worker(s); the busiest in (a) was the {busiest} ({share:.0%} of a core)"
        )
        for stale in self.ctx.results.glob("profile-*"):  # an earlier run's, maybe other services
            stale.unlink()
        factory = TurnFactory(self.ctx.tenant, "bench_noop", calls, query_args)
        async with toolfleet(self.ctx, "prof", workers=workers, profile=stems) as tf:
            await prime(tf.target, factory, check=tf.check)
            result = await closed_loop(
                tf.target,
                factory,
                window=window(calls),
                warmup_s=1.0,
                measure_s=self.d.profile,
                check=tf.check,
            )
        # Leaving the block stopped every service with SIGTERM: the profiles are written.
        self.results.profile_config = f"{calls} calls/turn, {workers} worker(s)"
        self.results.profile_calls_per_s = result.calls_per_s
        for name in sorted(names, key=lambda n: n != busiest):
            stem = stems[name]
            summary_path = Path(f"{stem}.top.json")
            if not await asyncio.to_thread(summary_path.exists):
                self.results.errors.append(f"the profile of the {name} was not written")
                continue
            summary = json.loads(await asyncio.to_thread(summary_path.read_text))
            tree_text = await asyncio.to_thread(Path(f"{stem}.txt").read_text)
            html = Path(f"{stem}.html")
            profile = Profile(
                service=name,
                html=str(html.relative_to(REPO) if html.is_relative_to(REPO) else html),
                summary=summary,
                cpu_share=self._cpu_share(name, calls, workers),
                tree=tree_excerpt(tree_text),
                busiest=name == busiest,
            )
            self.results.profiles.append(profile)
            progress(
                f"profile: {name} busy {profile.busy:.0%} of the sampled time; top: "
                + ", ".join(f"{r['function']} {r['share']:.0%}" for r in summary["self"][:3])
            )

    def _cpu_share(self, name: str, calls: int, workers: int) -> float:
        row = self.results.tp("toolfleet", calls, workers)
        if row is None or not row.seconds:
            return math.nan
        return row.cpu_s.get(name, 0.0) / row.seconds

    async def io_bound(self, tf: Toolfleet) -> None:
        for concurrency in IO_CONCURRENCY:
            await tf.set_workers(1, concurrency)
            row = await self._io_run("toolfleet", tf.target, tf.pids(), concurrency, tf.check)
            progress(
                f"(c) toolfleet concurrency {concurrency:>4}: {row.calls_per_s:,.0f} calls/s "
                f"({row.calls_per_s / row.ideal:.0%} of linear), machine CPU "
                f"{row.machine_busy:.0%}"
            )

    async def _io_run(
        self,
        system: str,
        target: Target,
        pids: dict[str, int],
        concurrency: int,
        check: Callable[[], None] | None,
    ) -> IoBound:
        calls = 20
        factory = TurnFactory(self.ctx.tenant, "bench_sleep50", calls, query_args)
        await prime(target, factory, check=check)
        meter = self.meter(pids)
        # 4x the concurrency outstanding (and at least 4 turns), so the workers never run dry:
        # a turn is outstanding for its calls' 50 ms plus the pipeline's own latency (planner,
        # Kafka hops, aggregator), and only a turn whose every call finished makes room for
        # the next.
        result = await closed_loop(
            target,
            factory,
            window=max(4, math.ceil(4 * concurrency / calls)),
            warmup_s=self.d.warmup,
            measure_s=self.d.io,
            check=check,
            meter=meter,
        )
        ncpu = psutil.cpu_count() or 1
        own = sum(meter.used.values()) / (self.d.io * ncpu)
        cores = {n: used / meter.seconds for n, used in meter.used.items()} if meter.seconds else {}
        row = IoBound(system, concurrency, result.calls_per_s, meter.machine_busy, own, cores)
        self.results.io.append(row)
        return row

    # ----------------------------------------------------------------------------- relay

    async def run_relay(self, scenarios: set[str], *, durable: bool = False) -> None:
        system = "durable" if durable else "relay"
        async with relay(self.ctx, workers=1, durable=durable) as rl:
            if "a" in scenarios:
                for workers in WORKERS:
                    await rl.set_workers(workers)
                    for calls in TURN_SIZES:
                        await self.throughput(
                            system, rl.target, rl.pids(), calls, workers, rl.check
                        )
            rate = self._latency_rate()
            if "b" in scenarios and rate:
                await rl.set_workers(LATENCY_WORKERS)
                await self.latency(system, rl.target, rate, rl.check)
            if "e" in scenarios:
                await rl.set_workers(LATENCY_WORKERS)
                await self.idle(system, rl.target, rl.check)

    async def run_durable(self, scenarios: set[str]) -> None:
        """The durable relay: the raw relay plus started / finished in Redis per call."""
        await self.run_relay(scenarios, durable=True)

    def _latency_rate(self) -> float | None:
        tf = self.results.lat("toolfleet")
        return tf.rate if tf else None

    # ---------------------------------------------------------------------------- Celery

    async def run_celery(self, scenarios: set[str]) -> None:
        async with celery(self.ctx, workers=1) as ce:
            if "a" in scenarios:
                for workers in WORKERS:
                    await ce.set_workers(workers)
                    for calls in TURN_SIZES:
                        await self.throughput(
                            "celery", ce.target, ce.pids(), calls, workers, ce.check,
                            outstanding=CELERY_WINDOW_CALLS,
                        )  # fmt: skip
            rate = self._latency_rate()
            if "b" in scenarios and rate:
                await ce.set_workers(LATENCY_WORKERS)
                top = self.results.tp("celery", LATENCY_CALLS, LATENCY_WORKERS)
                note = ""
                if top is not None and top.turns_per_s < rate * 1.1:
                    rate, note = top.turns_per_s / 2, "above Celery's maximum: at half of Celery's"
                await self.latency("celery", ce.target, rate, ce.check, note)
            if "e" in scenarios:
                await ce.set_workers(LATENCY_WORKERS)
                await self.idle("celery", ce.target, ce.check)

    # --------------------------------------------------------------------------- peers

    async def run_temporal(self, scenarios: set[str], *, local: bool = False) -> None:
        """Temporal, one workflow per turn, its calls as activities (or local activities)."""
        from bench.temporal_peer import WINDOW_CALLS, temporal

        system = "temporal_local" if local else "temporal"
        async with temporal(self.ctx, workers=1, local=local) as peer:
            await self._run_peer(system, peer, scenarios, WINDOW_CALLS)

    async def run_temporal_local(self, scenarios: set[str]) -> None:
        await self.run_temporal(scenarios, local=True)

    async def run_dbos(self, scenarios: set[str]) -> None:
        """DBOS on Postgres, one workflow per turn, its calls through a queue."""
        from bench.dbos_peer import WINDOW_CALLS, dbos

        async with dbos(self.ctx, workers=1) as peer:
            await self._run_peer("dbos", peer, scenarios, WINDOW_CALLS)

    async def _run_peer(
        self, system: str, peer: Peer, scenarios: set[str], outstanding: int
    ) -> None:
        """(a) with ``outstanding`` calls (where the peer does best) and (e); not (b): its
        offered load is far above what a peer sustains."""
        if "a" in scenarios:
            for workers in WORKERS:
                await peer.set_workers(workers)
                for calls in TURN_SIZES:
                    await self.throughput(
                        system, peer.target, peer.pids(), calls, workers, peer.check,
                        outstanding=outstanding,
                    )  # fmt: skip
        if "e" in scenarios:
            await peer.set_workers(LATENCY_WORKERS)
            await self.idle(system, peer.target, peer.check)

    # ------------------------------------------------------------------------ in-process

    async def run_inprocess(self, scenarios: set[str]) -> None:
        full, self.d = self.d, self.d.short()
        try:
            await self._run_inprocess(scenarios)
        finally:
            self.d = full

    async def _run_inprocess(self, scenarios: set[str]) -> None:
        target = InProcessTarget()
        if "a" in scenarios:
            for calls in TURN_SIZES:
                await self.throughput("inprocess", target, {}, calls, 0, None)
        rate = self._latency_rate()
        if "b" in scenarios and rate:
            await self.latency("inprocess", target, rate, None)
        if "e" in scenarios:
            await self.idle("inprocess", target, None)
        if "c" in scenarios:
            for concurrency in IO_CONCURRENCY:
                target.limit = asyncio.Semaphore(concurrency)
                row = await self._io_run("inprocess", target, {}, concurrency, None)
                progress(
                    f"(c) in-process concurrency {concurrency:>4}: {row.calls_per_s:,.0f} calls/s"
                )
            target.limit = None

    # ----------------------------------------------------------------------- state scale

    async def run_state_scale(self) -> None:
        """(f): (a)'s load on one Redis and on 3 shards, each started for it alone."""
        load = state_scale.Load(
            workers=max(WORKERS),
            window=WINDOW_CALLS,
            calls=TURN_SIZES,
            warmup=self.d.warmup,
            seconds=self.d.shards,
        )
        self.results.meta["state_scale"] = load.describe()
        self.results.state_scale = await state_scale.measure(self.ctx, load)

    # ----------------------------------------------------------------------------- scale

    async def run_scale(self) -> None:
        target_calls = self.d.scale_calls
        calls_per_turn = 20
        tenant = f"{self.ctx.tenant}-d"
        hold = f"{self.ctx.run_id}-d"
        per_worker = target_calls // 2 + target_calls // 5  # hash spread is never perfect
        async with toolfleet(self.ctx, "scale", workers=2, concurrency=per_worker) as tf:
            await prime(tf.target, TurnFactory(tenant, "bench_noop", 1, query_args), check=tf.check)
            pids = tf.pids()
            services = list(pids)
            redis = Redis.from_url(self.ctx.base.redis_address())
            try:
                base_memory = await _used_memory(self.ctx)
                rss_base = {n: rss_bytes(pids[n]) for n in services}
                factory = TurnFactory(
                    tenant, "bench_hold", calls_per_turn, lambda i: {"key": hold, "i": i}
                )
                meter = self.meter(pids)
                meter.start()
                began = time.monotonic()
                for _ in range(target_calls // calls_per_turn):
                    await tf.target.send(factory.make())
                parked, samples = await self._fill(tf, redis, hold, pids, began)
                seconds = time.monotonic() - began
                meter.stop()
                rss_at = {n: rss_bytes(pids[n]) for n in services}
                hwm = {n: peak_rss_bytes(pids[n]) for n in services}
                memory = await _used_memory(self.ctx) - base_memory
                per_call_keys = await _in_flight_per_call(
                    self.ctx, Keys.of(tf.settings), tenant, calls_per_turn
                )
                slope = {n: _slope([(p, r[n]) for p, r in samples if p > 0]) for n in services}
                await redis.set(bench_tools.release_key(hold), "1", ex=3600)
            finally:
                await redis.aclose()
                tf.fleet.stop_now()  # parked calls are not worth draining: the bench is done
        self.results.scale = Scale(
            target_calls=target_calls,
            reached=parked,
            seconds=seconds,
            rss_base=rss_base,
            rss_at_peak=rss_at,
            rss_hwm=hwm,
            rss_slope=slope,
            redis_delta=memory,
            redis_keys_per_call=per_call_keys,
            cpu_cores={n: used / meter.seconds for n, used in meter.used.items()},
        )
        progress(
            f"(d) {parked:,} calls in flight after {seconds:.0f} s; "
            + ", ".join(f"{n} {v / 2**20:,.0f} MiB" for n, v in rss_at.items())
            + f"; Redis +{memory / 2**20:,.0f} MiB ({per_call_keys:,.0f} B/call by key sample)"
        )

    async def _fill(
        self, tf: Toolfleet, redis: Redis, hold: str, pids: dict[str, int], began: float
    ) -> tuple[int, Samples]:
        """Sample calls in flight and RSS every second until the target, the budget or a stall."""
        target_calls = self.d.scale_calls
        samples: Samples = []
        parked, last_progress, last_growth, last_parked = 0, began, began, 0
        while True:
            tf.check()
            raw = await redis.hgetall(bench_tools.parked_key(hold))
            parked = sum(int(v) for v in raw.values())
            now = time.monotonic()
            samples.append((parked, {n: rss_bytes(pid) for n, pid in pids.items()}))
            if parked > last_parked:
                last_growth, last_parked = now, parked
            if now - last_progress >= 10:
                rate = parked / (now - began)
                progress(
                    f"(d) {parked:,} calls in flight after {now - began:.0f} s ({rate:,.0f}/s)"
                )
                last_progress = now
            if parked >= target_calls:
                return parked, samples
            if now - began > self.d.scale_budget or now - last_growth > 30:
                return parked, samples
            await asyncio.sleep(1.0)  # sampling period of the measurement


Samples = list[tuple[int, dict[str, int]]]


def _latency_row(system: str, rate: float, result: LoadResult, note: str) -> Latency:
    return Latency(
        system=system,
        calls_per_turn=LATENCY_CALLS,
        workers=LATENCY_WORKERS,
        rate=rate,
        turns=result.turns,
        failed=result.failed,
        p50_ms=result.percentile_ms(50),
        p95_ms=result.percentile_ms(95),
        p99_ms=result.percentile_ms(99),
        note=note,
        phases_ms=result.phases_ms,
    )


def _slope(points: list[tuple[int, int]]) -> float:
    """Least-squares slope of RSS against calls in flight (bytes per call)."""
    if len(points) < 2:
        return math.nan
    n = len(points)
    mx = sum(p for p, _ in points) / n
    my = sum(r for _, r in points) / n
    var = sum((p - mx) ** 2 for p, _ in points)
    if var == 0:
        return math.nan
    return sum((p - mx) * (r - my) for p, r in points) / var


async def _used_memory(ctx: RunContext) -> int:
    redis = Redis.from_url(ctx.base.redis_address())
    try:
        info = await redis.info("memory")
        return int(info["used_memory"])
    finally:
        await redis.aclose()


async def _memory_usage(redis: Redis, pattern: str, sample: int) -> list[int]:
    """MEMORY USAGE of up to ``sample`` keys matching ``pattern``."""
    sizes = []
    async for key in redis.scan_iter(match=pattern, count=1000):
        size = await redis.memory_usage(key, samples=0)
        if size:
            sizes.append(int(size))
        if len(sizes) >= sample:
            break
    return sizes


async def _ledger_bytes(redis: Redis, keys: Keys, tenant: str, sample: int) -> list[int]:
    """MEMORY USAGE of up to ``sample`` calls' ledger entries, each with its audit chain if it
    has one (a plain run has none: its events are in its entry)."""
    pattern = f"{keys.namespace}:{{g*}}:call:{tenant}\x1f*"  # every slot group
    sizes = []
    async for key in redis.scan_iter(match=pattern, count=1000):
        name = key.decode() if isinstance(key, bytes) else key
        entry = await redis.memory_usage(key, samples=0)
        chain = await redis.memory_usage(name.replace(":call:", ":audit:", 1), samples=0)
        if entry:
            sizes.append(int(entry) + int(chain or 0))
        if len(sizes) >= sample:
            break
    return sizes


async def _retained_per_call(ctx: RunContext, settings: Settings) -> float:
    """Bytes a finished call keeps in Redis: its ledger entry (and audit chain, if any)."""
    redis = Redis.from_url(ctx.base.redis_address())
    try:
        calls = await _ledger_bytes(redis, Keys.of(settings), ctx.tenant, 200)
    finally:
        await redis.aclose()
    return sum(calls) / len(calls) if calls else math.nan


async def _in_flight_per_call(
    ctx: RunContext, keys: Keys, tenant: str, calls_per_turn: int
) -> float:
    """Bytes per call in flight: ledger entry (+ audit chain) + its share of the turn's state."""
    redis = Redis.from_url(ctx.base.redis_address())
    try:
        calls = await _ledger_bytes(redis, keys, tenant, 200)
        turns = await _memory_usage(redis, keys.turn(tenant, "*", 0), 50)
        runs = await _memory_usage(redis, keys.turns(tenant, "*"), 50)
    finally:
        await redis.aclose()

    def mean(xs: list[int]) -> float:
        return sum(xs) / len(xs) if xs else 0.0

    return mean(calls) + (mean(turns) + mean(runs)) / calls_per_turn
