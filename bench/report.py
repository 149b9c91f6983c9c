"""What a bench run measured, the targets, and the markdown report of it all."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SYSTEMS = ("toolfleet", "relay", "durable", "celery", "inprocess")
PEERS = ("temporal", "temporal_local", "dbos")
"""The systems platform teams pick instead of toolfleet, in their own table."""
LABELS = {
    "toolfleet": "toolfleet",
    "relay": "raw relay",
    "durable": "durable relay",
    "celery": "Celery chord",
    "inprocess": "in-process",
    "temporal": "Temporal (activities)",
    "temporal_local": "Temporal (local activities)",
    "dbos": "DBOS (queue)",
}
SERVICES = (
    "planner", "workers", "aggregator", "reconciler", "kafka", "redis", "server", "driver",
)  # fmt: skip
BASELINE_PREFIX = "toolfleet@"
"""System name prefix of another commit's toolfleet in the same run (``--baseline``)."""
TOOLFLEET_SERVICES = ("planner", "workers", "aggregator", "reconciler", "kafka", "redis", "driver")
"""The processes of a toolfleet row, in the before-and-after CPU table."""


def label(system: str) -> str:
    """The report's name of a system (``toolfleet@4da064b``: toolfleet at that commit)."""
    if system.startswith(BASELINE_PREFIX):
        return f"toolfleet at {system.removeprefix(BASELINE_PREFIX)}"
    return LABELS.get(system, system)


@dataclass
class Throughput:
    """Scenario (a): one closed-loop run."""

    system: str
    calls_per_turn: int
    workers: int
    calls_per_s: float
    turns_per_s: float
    failed: int
    seconds: float
    cpu_s: dict[str, float] = field(default_factory=dict)
    machine_busy: float = 0.0
    redis_commands: dict[str, tuple[int, float]] = field(default_factory=dict)
    """Redis command -> (calls, microseconds) during the window (the server is shared)."""
    aof_rewrites: int = 0
    """Redis AOF rewrites during the window: each costs a fork and a copy of the dataset."""

    def cpu(self, service: str) -> float:
        """CPU seconds of a service (``workers``: all of them) over the window."""
        if service == "workers":
            found = [v for k, v in self.cpu_s.items() if k.startswith("worker")]
            return sum(found) if found else math.nan
        if service == "server":  # a peer's own server: Temporal's, or Postgres's processes
            found = [v for k, v in self.cpu_s.items() if k == "server" or k.startswith("postgres")]
            return sum(found) if found else math.nan
        return self.cpu_s.get(service, math.nan)

    def cores(self, service: str) -> float:
        """Share of one core a service used over the window."""
        return self.cpu(service) / self.seconds if self.seconds else math.nan

    def cpu_us_per_call(self) -> float:
        """CPU of every process of the system (and Kafka, Redis, the load generator) per call."""
        calls = self.calls_per_s * self.seconds
        return sum(self.cpu_s.values()) / calls * 1e6 if calls else math.nan

    def service_us_per_call(self, service: str) -> float:
        """CPU microseconds of one service (``workers``: all of them) per call."""
        calls = self.calls_per_s * self.seconds
        return self.cpu(service) / calls * 1e6 if calls else math.nan


@dataclass
class Latency:
    """Scenario (b): one open-loop run."""

    system: str
    calls_per_turn: int
    workers: int
    rate: float
    turns: int
    failed: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    note: str = ""
    phases_ms: dict[str, float] = field(default_factory=dict)


@dataclass
class Idle:
    """Scenario (e): one turn outstanding at a time, closed loop."""

    system: str
    calls_per_turn: int
    turns: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    phases_ms: dict[str, float] = field(default_factory=dict)
    """Medians of the hops, as in (b) (systems whose results carry call times)."""


@dataclass
class IoBound:
    """Scenario (c): one concurrency setting."""

    system: str
    concurrency: int
    calls_per_s: float
    machine_busy: float
    own_cpu: float
    """Share of the machine's cores the bench's own processes (and Kafka, Redis) used."""
    cores: dict[str, float] = field(default_factory=dict)
    """Share of one core each process used."""

    @property
    def ideal(self) -> float:
        return self.concurrency / 0.05


@dataclass
class Scale:
    """Scenario (d): calls in flight at once."""

    target_calls: int
    reached: int
    seconds: float
    rss_base: dict[str, int]
    rss_at_peak: dict[str, int]
    rss_hwm: dict[str, int]
    rss_slope: dict[str, float]
    """Bytes of RSS per call in flight (least squares over the samples), per service."""
    redis_delta: int
    redis_keys_per_call: float
    """Bytes per call from MEMORY USAGE of a sample of the calls' keys (ledger, turn)."""
    cpu_cores: dict[str, float] = field(default_factory=dict)
    """Share of a core each process used while the calls were being put in flight."""
    note: str = ""

    @property
    def extrapolated(self) -> bool:
        return self.reached < self.target_calls

    def at_target(self, service: str) -> float:
        """RSS at ``target_calls`` in flight: measured, or extrapolated from the slope."""
        if not self.extrapolated:
            return float(self.rss_at_peak.get(service, 0))
        return self.rss_base.get(service, 0) + self.rss_slope.get(service, 0.0) * self.target_calls


SCRIPT_COMMANDS = frozenset({"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"})
"""The commands that run a script (each also counts the commands its script runs)."""


@dataclass(frozen=True)
class ShardRow:
    """Scenario (f): one state layout (one Redis, or 3 shards) under one row of (a)'s load.

    Every figure is per call of the fleet, per Redis node (by port), over the window.
    """

    layout: str
    calls_per_turn: int
    calls: int
    seconds: float
    cpu_us_per_call: dict[int, float]
    """CPU (INFO ``used_cpu_sys`` + ``used_cpu_user``) microseconds."""
    sys_us_per_call: dict[int, float] = field(default_factory=dict)
    """The kernel's part of it (system time: socket reads and writes, the AOF's fsyncs)."""
    reads_per_call: dict[int, float] = field(default_factory=dict)
    """Read events (``total_reads_processed``): one per client connection per event-loop pass
    that found bytes to read."""
    commands_per_call: dict[int, float] = field(default_factory=dict)
    """Commands (INFO commandstats: those scripts run included, the bench's own not)."""
    scripts_per_call: dict[int, float] = field(default_factory=dict)
    """Script calls (EVALSHA, EVAL, FCALL)."""

    @property
    def sharded(self) -> bool:
        """More than one node holds the state."""
        return len(self.cpu_us_per_call) > 1

    @property
    def calls_per_s(self) -> float:
        """The fleet's calls per second over the window."""
        return self.calls / self.seconds if self.seconds else math.nan

    @property
    def busiest(self) -> float:
        """CPU µs per call of the node that worked hardest."""
        return max(self.cpu_us_per_call.values(), default=math.nan)

    @property
    def summed(self) -> float:
        """CPU µs per call of every node together."""
        return sum(self.cpu_us_per_call.values()) if self.cpu_us_per_call else math.nan

    @property
    def busiest_command_share(self) -> float:
        """The busiest node's share of all the nodes' commands."""
        total = sum(self.commands_per_call.values())
        return max(self.commands_per_call.values()) / total if total else math.nan


@dataclass
class Profile:
    """One service profiled (CPU samples) under the load of the busiest one's (a) run."""

    service: str
    html: str
    summary: dict[str, Any]
    cpu_share: float
    """Share of a core the service used in that (a) run (without the profiler)."""
    tree: list[str] = field(default_factory=list)
    """The top of pyinstrument's call tree (percent of samples)."""
    busiest: bool = False

    @property
    def busy(self) -> float:
        """Share of the sampled time not spent idle in the event loop's poll."""
        total = self.summary.get("total_s") or 0.0
        return 1.0 - self.summary.get("idle_s", 0.0) / total if total else math.nan


@dataclass
class Results:
    """Everything one run measured."""

    started: str
    meta: dict[str, str] = field(default_factory=dict)
    throughput: list[Throughput] = field(default_factory=list)
    latency: list[Latency] = field(default_factory=list)
    idle: list[Idle] = field(default_factory=list)
    io: list[IoBound] = field(default_factory=list)
    scale: Scale | None = None
    profiles: list[Profile] = field(default_factory=list)
    profile_config: str = ""
    profile_calls_per_s: float = 0.0
    retained_per_call: float | None = None
    baseline: str = ""
    """The system name of another commit's toolfleet measured in this run (``--baseline``:
    ``toolfleet@<short sha>``), or empty."""
    state_scale: list[ShardRow] = field(default_factory=list)
    """(f): the rows on one Redis, then the rows on 3 shards."""
    errors: list[str] = field(default_factory=list)

    def tp(self, system: str, calls: int, workers: int) -> Throughput | None:
        for t in self.throughput:
            if (t.system, t.calls_per_turn, t.workers) == (system, calls, workers):
                return t
        return None

    def lat(self, system: str) -> Latency | None:
        return next((x for x in self.latency if x.system == system), None)


# ----------------------------------------------------------------------------------- targets


@dataclass
class Target:
    name: str
    held: bool | None
    detail: str


def _ratios(results: Results, other: str) -> list[tuple[str, float]]:
    rows = []
    for t in results.throughput:
        if t.system != "toolfleet":
            continue
        base = results.tp(other, t.calls_per_turn, t.workers)
        if base is not None and base.calls_per_s > 0:
            rows.append((f"{t.calls_per_turn}x{t.workers}w", t.calls_per_s / base.calls_per_s))
    return rows


def _throughput_target(
    results: Results, other: str, at_least: float, what: str, shown: str
) -> Target:
    """toolfleet's calls/s against ``other``'s, at least ``at_least`` times in every row."""
    ratios = _ratios(results, other)
    if not ratios:
        return Target(f"calls/s ≥ {what}", None, "not measured")
    row, worst = min(ratios, key=lambda r: r[1])
    value = f"{worst:{shown}}" + ("x" if shown.endswith("f") else "")
    return Target(
        f"calls/s ≥ {what} (every turn size and worker count)",
        worst >= at_least,
        f"lowest {value} at {row}",
    )


def _peer_target(results: Results, label: str, systems: tuple[str, ...]) -> Target:
    """toolfleet's calls/s against the peer's best variant in the same row, at least 10x."""
    name = f"calls/s ≥ 10x {label}'s best (every turn size and worker count)"
    ratios = []
    for t in results.throughput:
        if t.system != "toolfleet":
            continue
        theirs = [results.tp(p, t.calls_per_turn, t.workers) for p in systems]
        best = max((x for x in theirs if x is not None), key=lambda x: x.calls_per_s, default=None)
        if best is not None and best.calls_per_s > 0:
            ratios.append((t.calls_per_s / best.calls_per_s, t, best))
    if not ratios:
        return Target(name, None, "not measured")
    ratio, ours, best = min(ratios, key=lambda r: r[0])
    return Target(
        name,
        ratio >= 10.0,
        f"lowest {ratio:.1f}x at {ours.calls_per_turn}x{ours.workers}w: toolfleet "
        f"{ours.calls_per_s:,.0f} calls/s, {LABELS[best.system]} {best.calls_per_s:,.0f}",
    )


THROUGHPUT_SHARE = 0.6
"""calls/s: at least this share of the durable relay's, in every row of (a)."""
CPU_RATIO = 1.6
"""CPU per call over every process: at most this many times the durable relay's, every row."""
IO_LINEAR = 0.8
"""(c) at concurrency 100: at least this share of linear (or the machine saturated)."""
IO_SATURATED = 0.85
"""(c): the bench's processes using this share of all cores counts as the CPU saturated."""
IO_GAIN = 2.0
"""(c) at concurrency 1,000: at least this many times the baseline commit's calls/s."""
IDLE_P50_MARGIN_MS = 2.0
"""Idle one-call turn: p50 within this of the durable relay's."""
IDLE_P99_MS = 40.0
_SHARE_OF_DURABLE = f"{THROUGHPUT_SHARE:.0%} of the durable relay's"


def targets(results: Results) -> list[Target]:
    """The targets, each held, missed, or not measured (None). Temporal and DBOS are
    measured in the same run and compared in their own table; they set no bar here."""
    out = [
        _throughput_target(results, "durable", THROUGHPUT_SHARE, _SHARE_OF_DURABLE, ".1%"),
        _cpu_target(results),
        _throughput_target(results, "celery", 10.0, "10x Celery's", ".2f"),
    ]
    tf, du = results.lat("toolfleet"), results.lat("durable")
    if tf and du and du.p99_ms > 0:
        ratio = tf.p99_ms / du.p99_ms
        out.append(
            Target(
                "p99 turn latency at half load ≤ 2x the durable relay's p99 (same offered load)",
                ratio <= 2.0,
                f"{tf.p99_ms:.0f} ms vs {du.p99_ms:.0f} ms = {ratio:.1f}x at {tf.rate:.1f} turns/s",
            )
        )
    else:
        out.append(Target("p99 turn latency at half load ≤ 2x the durable relay's", None, "-"))
    out += _io_targets(results)
    out.append(_idle_target(results))
    out += shard_targets(results.state_scale)
    return out


def _cpu_target(results: Results) -> Target:
    """CPU per call over every process against the durable relay's, in every row of (a)."""
    name = f"CPU per call over every process ≤ {CPU_RATIO:g}x the durable relay's (every row)"
    ratios = []
    for t in results.throughput:
        if t.system != "toolfleet":
            continue
        base = results.tp("durable", t.calls_per_turn, t.workers)
        if base is not None and base.cpu_us_per_call() > 0:
            ours, theirs = t.cpu_us_per_call(), base.cpu_us_per_call()
            ratios.append((ours / theirs, f"{t.calls_per_turn}x{t.workers}w", ours, theirs))
    if not ratios:
        return Target(name, None, "not measured")
    ratio, row, ours, theirs = max(ratios)
    detail = f"highest {ratio:.2f}x at {row} ({ours:,.0f} vs {theirs:,.0f} µs)"
    return Target(name, ratio <= CPU_RATIO, detail)


def _io_targets(results: Results) -> list[Target]:
    """(c): near linear at concurrency 100, and twice the baseline commit's calls/s at 1,000."""
    rows = {x.concurrency: x for x in results.io if x.system == "toolfleet"}
    linear_name = (
        f"I/O-bound at concurrency 100: ≥ {IO_LINEAR:.0%} of linear (concurrency/50 ms), or "
        f"the bench's processes ≥ {IO_SATURATED:.0%} of all cores"
    )
    gain_name = f"I/O-bound at concurrency 1,000: ≥ {IO_GAIN:g}x the baseline commit's calls/s"
    out = []
    at_100 = rows.get(100)
    if at_100 is None:
        out.append(Target(linear_name, None, "not measured"))
    else:
        share = at_100.calls_per_s / at_100.ideal
        out.append(
            Target(
                linear_name,
                share >= IO_LINEAR or at_100.own_cpu >= IO_SATURATED,
                f"{share:.0%} of linear, toolfleet+Kafka+Redis CPU {at_100.own_cpu:.0%} "
                "of the machine",
            )
        )
    at_1000 = rows.get(1000)
    base = next(
        (
            x
            for x in results.io
            if results.baseline and x.system == results.baseline and x.concurrency == 1000
        ),
        None,
    )
    if at_1000 is None or base is None or not base.calls_per_s:
        out.append(Target(gain_name, None, "not measured (needs --baseline and (c))"))
    else:
        gain = at_1000.calls_per_s / base.calls_per_s
        out.append(
            Target(
                gain_name,
                gain >= IO_GAIN,
                f"{gain:.2f}x: {at_1000.calls_per_s:,.0f} vs {base.calls_per_s:,.0f} calls/s "
                f"({results.baseline})",
            )
        )
    return out


def _idle_target(results: Results) -> Target:
    """Idle one-call turn: p50 within 2 ms of the durable relay's, p99 at most 40 ms."""
    name = (
        f"idle one-call turn: p50 within {IDLE_P50_MARGIN_MS:g} ms of the durable relay's, "
        f"p99 ≤ {IDLE_P99_MS:g} ms"
    )

    def one_call(system: str) -> Idle | None:
        return next((x for x in results.idle if x.system == system and x.calls_per_turn == 1), None)

    ours, theirs = one_call("toolfleet"), one_call("durable")
    if ours is None or theirs is None:
        return Target(name, None, "not measured")
    return Target(
        name,
        ours.p50_ms <= theirs.p50_ms + IDLE_P50_MARGIN_MS and ours.p99_ms <= IDLE_P99_MS,
        f"p50 {ours.p50_ms:.1f} ms vs {theirs.p50_ms:.1f} ms, p99 {ours.p99_ms:.1f} ms "
        f"({ours.turns} turns)",
    )


SHARD_COMMAND_SHARE = 0.40
"""(f): the most of the fleet's Redis commands per call one of 3 shards may do."""
SHARD_CPU_RATIO = 1.2
"""(f): the most the 3 shards' summed Redis CPU per call may be, against the single Redis's."""


def shard_pairs(rows: list[ShardRow]) -> list[tuple[ShardRow, ShardRow]]:
    """(f)'s rows as (single Redis, 3 shards) pairs of the same turn size, smallest first."""
    single = {r.calls_per_turn: r for r in rows if not r.sharded}
    sharded = {r.calls_per_turn: r for r in rows if r.sharded}
    return [(single[c], sharded[c]) for c in sorted(single.keys() & sharded.keys())]


def shard_targets(rows: list[ShardRow]) -> list[Target]:
    """(f)'s two targets: how evenly 3 shards share the commands, and what sharding costs."""
    share_name = (
        f"(f) busiest of 3 shards ≤ {SHARD_COMMAND_SHARE:.0%} of the fleet's Redis commands "
        "per call (every turn size)"
    )
    cpu_name = (
        f"(f) 3 shards' summed Redis CPU per call ≤ {SHARD_CPU_RATIO:g}x the single Redis's "
        "(every turn size)"
    )
    pairs = shard_pairs(rows)
    if not pairs:
        return [Target(share_name, None, "not measured"), Target(cpu_name, None, "not measured")]
    shares = [(one.calls_per_turn, three) for one, three in pairs]
    share_held = all(t.busiest_command_share <= SHARD_COMMAND_SHARE for _, t in shares)
    share_detail = "; ".join(
        f"{calls}-call turns {three.busiest_command_share:.0%} "
        f"({_nodes(three.commands_per_call.values(), '.1f')} commands per call)"
        for calls, three in shares
    )
    ratios = [
        (one.calls_per_turn, three.summed / one.summed if one.summed else math.nan, one, three)
        for one, three in pairs
    ]
    cpu_held = all(r <= SHARD_CPU_RATIO for _, r, _, _ in ratios)
    cpu_detail = "; ".join(
        f"{calls}-call turns {ratio:.2f}x ({three.summed:,.0f} vs {one.summed:,.0f} µs)"
        for calls, ratio, one, three in ratios
    )
    return [
        Target(share_name, share_held, share_detail),
        Target(cpu_name, cpu_held, cpu_detail),
    ]


def _nodes(values: Any, form: str = ".0f") -> str:
    """Per-node figures as ``a / b / c``."""
    return " / ".join(format(v, form) for v in values)


# ------------------------------------------------------------------------------------ render


def _f(value: float | None, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def _ratio(a: float | None, b: float | None, digits: int = 2) -> str:
    if a is None or b is None or not b:
        return "-"
    return f"{a / b:.{digits}f}x"


def _mib(value: float) -> str:
    return f"{value / 2**20:,.0f}"


def render(results: Results) -> str:
    """The whole report as markdown."""
    lines: list[str] = []
    add = lines.append
    m = results.meta
    add(f"# toolfleet benchmarks — {results.started}")
    add("")
    add(
        f"Machine: {m.get('cores', '?')} cores, {m.get('memory', '?')} RAM, load average "
        f"{m.get('load_before', '?')} at start; commit {m.get('commit', '?')}; "
        f"run time {m.get('runtime', '?')}; {m.get('mode', 'full')} run."
    )
    add(
        "Every comparison ran side by side in this run, on the same Kafka broker and Redis "
        f"server ({m.get('infra', '?')}). {m.get('warmup', '')} {m.get('noise', '')} "
        f"{m.get('config', '')}"
    )
    add("")
    _render_targets(results, add)
    _render_throughput(results, add)
    _render_before_after(results, add)
    _render_peers(results, add)
    _render_latency(results, add)
    _render_idle(results, add)
    _render_io(results, add)
    _render_scale(results, add)
    _render_state_scale(results, add)
    _render_cpu(results, add)
    _render_profile(results, add)
    add("## How it was measured")
    add("")
    for line in METHOD:
        add(line)
    add("")
    if results.errors:
        add("## Errors")
        add("")
        for e in results.errors:
            add(f"- {e}")
        add("")
    return "\n".join(lines)


def _render_targets(results: Results, add: Any) -> None:
    add("## Targets")
    add("")
    add("| target | verdict | measured |")
    add("|---|---|---|")
    for t in targets(results):
        verdict = "not measured" if t.held is None else ("**held**" if t.held else "**missed**")
        add(f"| {t.name} | {verdict} | {t.detail} |")
    add("")


def _render_throughput(results: Results, add: Any) -> None:
    if not results.throughput:
        return
    add("## (a) Throughput: no-op calls, end to end (model response in → turn result out)")
    add("")
    add(
        "| calls/turn | workers | toolfleet calls/s | toolfleet turns/s | raw relay calls/s "
        "| durable relay calls/s | Celery calls/s | in-process calls/s | toolfleet / relay "
        "| toolfleet / durable relay | toolfleet / Celery | toolfleet / in-process |"
    )
    add("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    keys = sorted({(t.calls_per_turn, t.workers) for t in results.throughput if t.workers})
    for calls, workers in keys:
        tf = results.tp("toolfleet", calls, workers)
        rl = results.tp("relay", calls, workers)
        du = results.tp("durable", calls, workers)
        ce = results.tp("celery", calls, workers)
        ip = results.tp("inprocess", calls, 0)
        found = zip(SYSTEMS, (tf, rl, du, ce, ip), strict=True)
        v = {k: (x.calls_per_s if x else None) for k, x in found}
        add(
            f"| {calls} | {workers} | {_f(v['toolfleet'])} | "
            f"{_f(tf.turns_per_s if tf else None, 1)} | {_f(v['relay'])} | {_f(v['durable'])} | "
            f"{_f(v['celery'])} | {_f(v['inprocess'])} | "
            f"{_ratio(v['toolfleet'], v['relay'], 3)} | "
            f"{_ratio(v['toolfleet'], v['durable'], 3)} | "
            f"{_ratio(v['toolfleet'], v['celery'])} | {_ratio(v['toolfleet'], v['inprocess'], 4)} |"
        )
    failed = sum(t.failed for t in results.throughput)
    add("")
    add(
        f"Turns that did not complete with every output `ok`: {failed}. In-process has no "
        "worker processes: its one figure per turn size is repeated on both rows."
    )
    rewritten = [
        f"{t.calls_per_turn}x{t.workers}w"
        for t in results.throughput
        if t.system == "toolfleet" and t.aof_rewrites
    ]
    if rewritten:
        add("")
        add(
            "Redis rewrote its append-only file during the toolfleet rows "
            + ", ".join(rewritten)
            + " (see the CPU table): those rows pay for a copy of the whole dataset."
        )
    add("")


def _render_peers(results: Results, add: Any) -> None:
    measured = [p for p in PEERS if any(t.system == p for t in results.throughput)]
    if not measured:
        return
    add("## (a) Peers: the same turns of no-op calls on Temporal and DBOS")
    add("")
    add(
        "One workflow per turn, its calls run concurrently (Temporal: as activities, or as "
        "local activities; DBOS: through a queue), outputs gathered in model order; the "
        "driver keeps 100 calls outstanding, where both do best (deeper backlogs slow them "
        "down: DBOS's waiting turns poll their calls' results, and Temporal's workflow "
        "starts queue up). Each peer runs on its own server, as shipped: Temporal's dev "
        "server (one Go process, its store in memory, so less durable than toolfleet's "
        "fsynced Redis; its task dispatch is paced at 20 polls/s by default, which sets "
        "its idle latency), and for DBOS a private Postgres with fsync and synchronous "
        "commit on, polled every 10 ms."
    )
    add("")
    add(
        "| calls/turn | workers | toolfleet calls/s | "
        + " | ".join(f"{LABELS[p]} calls/s" for p in measured)
        + " | "
        + " | ".join(f"toolfleet / {LABELS[p]}" for p in measured)
        + " |"
    )
    add("|" + "---:|" * (3 + 2 * len(measured)))
    keys = sorted({(t.calls_per_turn, t.workers) for t in results.throughput if t.workers})
    for calls, workers in keys:
        tf = results.tp("toolfleet", calls, workers)
        ours = tf.calls_per_s if tf else None
        theirs = [results.tp(p, calls, workers) for p in measured]
        values = [x.calls_per_s if x else None for x in theirs]
        add(
            f"| {calls} | {workers} | {_f(ours)} | "
            + " | ".join(_f(v) for v in values)
            + " | "
            + " | ".join(_ratio(ours, v, 1) for v in values)
            + " |"
        )
    add("")


def _render_latency(results: Results, add: Any) -> None:
    if not results.latency:
        return
    tf = results.lat("toolfleet")
    add("## (b) Latency: end-to-end turn latency at about half of toolfleet's maximum throughput")
    add("")
    if tf:
        add(
            f"Open loop, {tf.calls_per_turn} no-op calls per turn, {tf.workers} workers, "
            f"{tf.rate:.1f} turns/s offered to every system (half of toolfleet's maximum)."
        )
        add("")
    add("| system | offered turns/s | turns | p50 ms | p95 ms | p99 ms | p99 / relay p99 | note |")
    add("|---|---:|---:|---:|---:|---:|---:|---|")
    rl = results.lat("relay")
    for x in results.latency:
        add(
            f"| {LABELS[x.system]} | {x.rate:.1f} | {x.turns} | {_f(x.p50_ms, 1)} | "
            f"{_f(x.p95_ms, 1)} | {_f(x.p99_ms, 1)} | "
            f"{_ratio(x.p99_ms, rl.p99_ms if rl else None, 1)} | {x.note} |"
        )
    add("")
    split = [x for x in results.latency if x.phases_ms]
    if split:
        add(
            "Where the time goes (medians, from the calls' started / finished times in the "
            "turn results; wall clocks of one machine):"
        )
        add("")
        add("| system | model response → first call started | calls running "
            "| last call finished → turn result read |")  # fmt: skip
        add("|---|---:|---:|---:|")
        for x in split:
            p = x.phases_ms
            add(
                f"| {LABELS[x.system]} | {_f(p.get('to first call start'), 1)} ms | "
                f"{_f(p.get('calls running'), 1)} ms | "
                f"{_f(p.get('last call end to result'), 1)} ms |"
            )
        add("")


def _render_idle(results: Results, add: Any) -> None:
    if not results.idle:
        return
    add("## (e) Idle latency: one turn outstanding at a time (closed loop)")
    add("")
    add(
        "| system | calls/turn | turns | p50 ms | p95 ms | p99 ms | model response → first "
        "call started | calls running | last call finished → turn result read |"
    )
    add("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for x in results.idle:
        p = x.phases_ms
        add(
            f"| {LABELS[x.system]} | {x.calls_per_turn} | {x.turns} | {_f(x.p50_ms, 1)} | "
            f"{_f(x.p95_ms, 1)} | {_f(x.p99_ms, 1)} | {_f(p.get('to first call start'), 1)} | "
            f"{_f(p.get('calls running'), 1)} | {_f(p.get('last call end to result'), 1)} |"
        )
    add("")
    add(
        "The hops are medians from the calls' started / finished times in the turn results "
        "(toolfleet and the relays; wall clocks of one machine)."
    )
    add("")


def _render_io(results: Results, add: Any) -> None:
    if not results.io:
        return
    add("## (c) I/O-bound tools (each sleeps 50 ms): calls/s by worker concurrency")
    add("")
    add(
        "One worker process with `--concurrency N`, 20 calls per turn; linear = N / 50 ms. "
        "In-process: the same calls under an asyncio.Semaphore(N)."
    )
    add("")
    add(
        "| concurrency | linear calls/s | toolfleet calls/s | of linear | machine CPU busy "
        "| bench processes' CPU | busiest processes (share of a core) | in-process calls/s |"
    )
    add("|---:|---:|---:|---:|---:|---:|---|---:|")
    for x in results.io:
        if x.system != "toolfleet":
            continue
        ip = next(
            (y for y in results.io if y.system == "inprocess" and y.concurrency == x.concurrency),
            None,
        )
        busiest = sorted(x.cores.items(), key=lambda kv: kv[1], reverse=True)[:3]
        add(
            f"| {x.concurrency:,} | {x.ideal:,.0f} | {x.calls_per_s:,.0f} | "
            f"{x.calls_per_s / x.ideal:.0%} | {x.machine_busy:.0%} | {x.own_cpu:.0%} | "
            + ", ".join(f"{n} {c:.0%}" for n, c in busiest)
            + f" | {_f(ip.calls_per_s if ip else None)} |"
        )
    add("")


def _render_scale(results: Results, add: Any) -> None:
    s = results.scale
    if s is None:
        return
    add(f"## (d) Scale: {s.target_calls:,} calls in flight")
    add("")
    if s.extrapolated:
        add(
            f"**Reached {s.reached:,} calls in flight in {s.seconds:.0f} s, not "
            f"{s.target_calls:,}**: calls were not put in flight fast enough to get there "
            "within the time budget (see the CPU shares below). The columns marked "
            "*extrapolated* are the measured baseline plus the measured per-call slope x "
            f"{s.target_calls:,}; they are estimates, not measurements."
        )
    else:
        add(f"Reached {s.reached:,} calls in flight in {s.seconds:.0f} s.")
    if s.note:
        add("")
        add(s.note)
    add("")
    head = "extrapolated" if s.extrapolated else "measured"
    add(
        f"| service | RSS idle MiB | RSS at {s.reached:,} MiB | peak RSS (HWM) MiB "
        f"| RSS per call in flight, bytes | RSS at {s.target_calls:,} MiB ({head}) |"
    )
    add("|---|---:|---:|---:|---:|---:|")
    for name in sorted(s.rss_at_peak):
        add(
            f"| {name} | {_mib(s.rss_base.get(name, 0))} | {_mib(s.rss_at_peak[name])} | "
            f"{_mib(s.rss_hwm.get(name, 0))} | {_f(s.rss_slope.get(name), 0)} | "
            f"{_mib(s.at_target(name))} |"
        )
    add("")
    per_call = s.redis_delta / s.reached if s.reached else math.nan
    add(
        f"Redis: used_memory grew by {_mib(s.redis_delta)} MiB for {s.reached:,} calls in "
        f"flight = **{_f(per_call)} bytes per call** (INFO memory delta; the server is shared "
        f"with other users, so this is noisy); a sample of the calls' own keys (ledger entry "
        f"and audit chain if any, 1/20 of the turn's state) gives "
        f"{_f(s.redis_keys_per_call)} bytes per call (MEMORY USAGE). At {s.target_calls:,} calls: "
        f"{_mib(s.redis_keys_per_call * s.target_calls)} MiB."
    )
    if s.cpu_cores:
        add("")
        add(
            "CPU while the calls were being put in flight (share of one core): "
            + ", ".join(f"{name} {share:.0%}" for name, share in s.cpu_cores.items())
            + "."
        )
    if results.retained_per_call is not None:
        add("")
        add(
            f"Retained after completion: {_f(results.retained_per_call)} bytes per finished "
            "call stay in Redis (ledger entry and audit chain if any, sampled with MEMORY "
            "USAGE after (a)) until the ledger's retention (`TOOLFLEET_LEDGER_RETENTION_S`, "
            "7 days by default) expires them."
        )
    add("")


def _render_before_after(results: Results, add: Any) -> None:
    """(a)'s toolfleet rows at the baseline commit and at this one, beside the durable relay."""
    if not results.baseline:
        return
    before = label(results.baseline)
    add(f"## Before and after: {before} and at this commit")
    add("")
    keys = sorted(
        {(t.calls_per_turn, t.workers) for t in results.throughput if t.system == results.baseline}
    )
    if not keys:
        add(f"{before} was not measured (see Errors).")
        add("")
        return
    add(
        f"(a)'s toolfleet rows run a second time in this run, right after this commit's, by "
        f"the services of {results.meta.get('baseline', before)}: the same load generator, "
        "broker, Redis, worker flags and durable relay. The targets are computed on this "
        "commit's rows only."
    )
    add("")
    b, a = results.baseline.removeprefix(BASELINE_PREFIX), _head(results)
    add(
        f"| calls/turn | workers | {b} calls/s | {a} calls/s | durable relay calls/s "
        f"| {b} / durable | {a} / durable | {a} / {b} | {b} CPU µs per call "
        f"| {a} CPU µs per call | durable relay CPU µs per call | {b} / durable CPU "
        f"| {a} / durable CPU |"
    )
    add("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for calls, workers in keys:
        old = results.tp(results.baseline, calls, workers)
        new = results.tp("toolfleet", calls, workers)
        du = results.tp("durable", calls, workers)
        rate = {k: (x.calls_per_s if x else None) for k, x in (("b", old), ("a", new), ("d", du))}
        cpu = {
            k: (x.cpu_us_per_call() if x else None) for k, x in (("b", old), ("a", new), ("d", du))
        }
        add(
            f"| {calls} | {workers} | {_f(rate['b'])} | {_f(rate['a'])} | {_f(rate['d'])} | "
            f"{_percent(rate['b'], rate['d'])} | {_percent(rate['a'], rate['d'])} | "
            f"{_ratio(rate['a'], rate['b'])} | {_f(cpu['b'])} | {_f(cpu['a'])} | {_f(cpu['d'])} | "
            f"{_ratio(cpu['b'], cpu['d'])} | {_ratio(cpu['a'], cpu['d'])} |"
        )
    add("")
    add(
        f"CPU per call by process, at {b} and at {a}: microseconds of each process per call "
        "(its share of one core in parentheses); *all* sums every process, the load "
        "generator's included."
    )
    add("")
    names = ["planner", "workers", "aggregator", "reconciler", "Kafka", "Redis", "load generator"]
    add("| commit | calls/turn | workers | calls/s | " + " | ".join(names) + " | all |")
    add("|---|---:|---:|---:|" + "---:|" * (len(names) + 1))
    for calls, workers in keys:
        for system, name in ((results.baseline, b), ("toolfleet", a)):
            t = results.tp(system, calls, workers)
            if t is None:
                continue
            cells = [
                f"{_f(t.service_us_per_call(s))} ({_pct(t.cores(s))})" for s in TOOLFLEET_SERVICES
            ]
            add(
                f"| {name} | {calls} | {workers} | {_f(t.calls_per_s)} | "
                + " | ".join(cells)
                + f" | {_f(t.cpu_us_per_call())} |"
            )
    add("")


def _head(results: Results) -> str:
    """This run's commit, short (its working tree may have had changes: see the header)."""
    commit = results.meta.get("commit", "").split(" ")[0]
    return commit if commit and commit != "?" else "this commit"


def _percent(a: float | None, b: float | None) -> str:
    if a is None or b is None or not b:
        return "-"
    return f"{a / b:.0%}"


def _render_state_scale(results: Results, add: Any) -> None:
    """(f): the same load on one Redis and on 3 shards, per node and per call."""
    pairs = shard_pairs(results.state_scale)
    if not pairs:
        return
    add("## (f) State scale: one Redis against 3 shards, per call of the fleet")
    add("")
    add(
        f"This commit's toolfleet under (a)'s load ({results.meta.get('state_scale', '')}), "
        "first with one redis-server as its state, then with a 3-master Redis Cluster: both "
        "started by the bench for this scenario alone (the same binary and durable settings as "
        "`toolfleet infra up`'s: the append-only file fsynced on every write). Each node's "
        "CPU (INFO `used_cpu_sys` + `used_cpu_user`) and commands (INFO commandstats, the "
        "commands scripts run included, the bench's own INFO / CLUSTER / PING not) are read "
        "around each window and divided by the calls the fleet completed in it. Two shards' "
        "CPU is not comparable on two shared cores, so the targets are on what scales: the "
        "busiest shard's share of the commands, and the shards' summed CPU against the "
        "single Redis's. The last column shows how evenly the work, not the count, spreads "
        "(a script's commands can cost far more than another's)."
    )
    add("")
    add(
        "| calls/turn | state | calls/s | commands per call, per node | script calls per call, "
        "per node | busiest node's share of commands | Redis CPU µs per call, per node "
        "| all nodes | all nodes / single Redis | busiest node's share of CPU |"
    )
    add("|---:|---|---:|---|---|---:|---|---:|---:|---:|")
    for one, three in pairs:
        for row in (one, three):
            add(
                f"| {row.calls_per_turn} | {row.layout} | {_f(row.calls_per_s)} | "
                f"{_nodes(row.commands_per_call.values(), '.1f')} | "
                f"{_nodes(row.scripts_per_call.values(), '.2f')} | "
                f"{_pct(row.busiest_command_share)} | "
                f"{_nodes(row.cpu_us_per_call.values())} | {_f(row.summed)} | "
                f"{_ratio(row.summed, one.summed)} | {_percent(row.busiest, row.summed)} |"
            )
    add("")


def _render_cpu(results: Results, add: Any) -> None:
    # Another commit's rows are in the before-and-after section.
    rows = [t for t in results.throughput if t.cpu_s and t.system != results.baseline]
    if not rows:
        return
    add("## Where the CPU goes during (a): share of one core, by process")
    add("")
    add(
        "| system | calls/turn | workers | calls/s | planner | workers | aggregator | reconciler "
        "| Kafka | Redis | peer's server | load generator | CPU µs per call, all processes "
        "| machine busy | Redis AOF rewrites |"
    )
    add("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for t in rows:
        cells = [_pct(t.cores(s)) for s in SERVICES]
        add(
            f"| {LABELS[t.system]} | {t.calls_per_turn} | {t.workers} | {_f(t.calls_per_s)} | "
            + " | ".join(cells)
            + f" | {_f(t.cpu_us_per_call())} | {t.machine_busy:.0%} | {t.aof_rewrites} |"
        )
    add("")
    add(
        "Celery's, Temporal's and DBOS's worker processes are under *workers*, Temporal's dev "
        "server and DBOS's Postgres under *peer's server*; in-process runs in the load generator. "
        "Kafka and Redis serve anything else running on the machine too, so their figures "
        "include that load; so does *machine busy*. A row during which Redis rewrote its "
        "append-only file (a forked child copies the whole dataset, on the same two cores) "
        "pays for that rewrite in its Redis CPU and its throughput."
    )
    add("")
    tf = [t for t in rows if t.system == "toolfleet" and t.redis_commands]
    if not tf:
        return
    add("### Redis commands per toolfleet call during (a)")
    add("")
    add(
        "INFO commandstats over the window (commands run by Lua scripts are counted too; the "
        "server is shared, so other users' commands are in it): calls per toolfleet call and "
        "Redis CPU µs per toolfleet call, the top commands by time."
    )
    add("")
    add("| calls/turn | workers | Redis µs per call | top commands (calls per call, µs per call) |")
    add("|---:|---:|---:|---|")
    for t in tf:
        calls = t.calls_per_s * t.seconds
        if not calls:
            continue
        total = sum(u for _c, u in t.redis_commands.values()) / calls
        top = sorted(t.redis_commands.items(), key=lambda kv: kv[1][1], reverse=True)[:6]
        listed = ", ".join(f"`{name}` {c / calls:.1f} / {u / calls:,.0f}" for name, (c, u) in top)
        add(f"| {t.calls_per_turn} | {t.workers} | {total:,.0f} | {listed} |")
    add("")


def _pct(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.0%}"


def _render_profile(results: Results, add: Any) -> None:
    if not results.profiles:
        return
    add(f"## Profiles: every toolfleet service under the load of {results.profile_config}")
    add("")
    add(
        "pyinstrument, CPU samples every 1 ms in each service (a fleet of its own, "
        f"{results.profile_calls_per_s:,.0f} calls/s under the profilers). *busy* is the share "
        "of samples not idle in the event loop's poll; *core in (a)* is what the service used "
        "in the same (a) run without the profiler. HTML call trees are kept out of git."
    )
    add("")
    add("| service | core in (a) | busy | top functions by self time | call tree |")
    add("|---|---:|---:|---|---|")
    for p in results.profiles:
        top = ", ".join(
            f"`{r['function']}` {r['share']:.0%}"
            for r in p.summary.get("self", [])
            if r["function"] not in ("epoll.poll", "select", "poll")
        )
        top = ", ".join(top.split(", ")[:5])
        name = f"**{p.service}** (busiest)" if p.busiest else p.service
        add(f"| {name} | {_pct(p.cpu_share)} | {_pct(p.busy)} | {top} | `{p.html}` |")
    add("")
    for p in results.profiles:
        s = p.summary
        add(f"### {p.service}")
        add("")
        add(
            "Self time by package: "
            + ", ".join(
                f"{name} {share:.0%}" for name, share in list(s.get("packages", {}).items())[:8]
            )
        )
        add("")
        if p.tree:
            add("```")
            for line in p.tree:
                add(line)
            add("```")
            add("")


def tree_excerpt(text: str, limit: int = 45, threshold: float = 1.0) -> list[str]:
    """The lines of pyinstrument's text tree at or above ``threshold`` percent."""
    lines = []
    started = False
    for line in text.splitlines():
        match = re.search(r"(\d+\.\d+)%", line)
        if match is None:
            if started and "frames hidden" in line:
                lines.append(line.rstrip())
            continue
        started = True
        if float(match.group(1)) >= threshold:
            lines.append(line.rstrip())
        if len(lines) >= limit:
            break
    return lines


METHOD = [
    "- **toolfleet**: `LocalFleet` — planner, aggregator, reconciler and N workers as separate "
    "processes (`toolfleet worker --tools bench.tools:tools --concurrency 1600` for (a) and "
    "(b): as many as the calls outstanding, so worker slots are not the limit), a fresh topic "
    "prefix per run, 6 partitions per topic; every service on uvloop, Redis through an "
    "auto-pipelining client (commands issued in one loop turn share a round trip).",
    "- **raw relay** (`bench/relay.py`): the same hops, topics, keys, partitions, producer "
    "settings (idempotent, acks=all, the same linger, batches up to 256 KiB), read_committed "
    "consumers, manual commits, the same event loop (uvloop) and the same pydantic messages, "
    "in separate planner / worker / aggregator processes — but no Redis, no Kafka "
    "transactions, and one ack wait and one commit per polled batch.",
    "- **in-process**: the calls of a turn run concurrently in the load generator's process "
    "through the OpenAI Agents SDK's `invoke_function_tool` on `function_tool`s.",
    "- **Celery**: Celery 5 with Redis (database 3 of the same server) as broker and result "
    "backend, one worker process (threads pool, 8 threads) per worker, one chord per turn (the "
    "calls as the header, a collector as the body that pushes the turn result to a Redis "
    "list); chords are sent from 2 client threads.",
    "- **Load**: (a) closed loop, 1,600 calls outstanding (max(4, 1600 / calls per turn) "
    "turns: with 400 neither toolfleet nor the relay kept the CPU busy, so it measured their "
    "latency rather than their maximum; Celery keeps 400, where it does better), results "
    "counted over the measurement window after a warm-up; (b) open loop at a fixed "
    "rate; latency = from handing the model response to the producer to reading the turn "
    "result; (c) closed loop, 4x the worker's concurrency outstanding (at least 4 turns). "
    "Every 16th toolfleet / relay result is decoded and checked (completed, one `ok` "
    "output per call, in model order); every Celery and in-process result is checked.",
    "- **CPU**: user + system CPU time of each process over the measurement window (psutil); "
    "machine busy = 1 - idle share of all cores (includes anything else running).",
    "- **(d)**: a tool that parks until released (`bench_hold`), 2 workers with "
    "`--concurrency 60000`, 20 calls per turn; RSS from /proc (current and VmHWM), Redis from "
    "INFO memory and MEMORY USAGE.",
    "- **Before and after** (`--baseline REF`; `make bench` passes `BENCH_BASELINE`, 4da064b "
    "by default): the commit's tree is written out with `git archive` into "
    "`.artifacts/bench-baseline/<sha>` (git-ignored, reused), and its services run (a)'s "
    "toolfleet rows with that tree as their working directory and first on PYTHONPATH, so "
    "every package and `bench.tools` are the commit's (checked before the rows: a child "
    "started as they are imports each from that tree); the load generator is this commit's.",
    "- **(f)**: (a)'s load (turns of 1, 5 and 20 no-op calls) on this commit's toolfleet, first "
    "with one redis-server as the state, then with a 3-master Redis Cluster, both started by "
    "the bench on their own ports (26010; 26000-26002) and stopped after; per node, INFO "
    "`used_cpu_*` and commandstats around each window.",
]


README_BEGIN = "<!-- bench:begin -->"
README_END = "<!-- bench:end -->"


def readme_block(results: Results, report_path: str) -> str:
    """The summary of the latest run in docs/benchmarks.md (between the bench markers)."""
    lines = [
        README_BEGIN,
        f"Latest run: {results.started} ({results.meta.get('cores', '?')} cores, "
        f"load average {results.meta.get('load_before', '?')} at start, run time "
        f"{results.meta.get('runtime', '?')}). Full report: `{report_path}`."
        + (f" {results.meta['config']}" if results.meta.get("config") else ""),
        "",
        "| target | verdict | measured |",
        "|---|---|---|",
    ]
    for t in targets(results):
        verdict = "not measured" if t.held is None else ("held" if t.held else "**missed**")
        lines.append(f"| {t.name} | {verdict} | {t.detail} |")
    shown = ("toolfleet", "durable", "relay", "celery", "temporal", "temporal_local", "dbos")
    lines += [
        "",
        "| calls/turn | workers | "
        + " | ".join(LABELS[x] + (" calls/s" if x == "toolfleet" else "") for x in shown)
        + " | toolfleet / durable relay | toolfleet / Celery |",
        "|" + "---:|" * (len(shown) + 4),
    ]
    keys = sorted({(t.calls_per_turn, t.workers) for t in results.throughput if t.workers})
    for calls, workers in keys:
        c = {x: getattr(results.tp(x, calls, workers), "calls_per_s", None) for x in shown}
        lines.append(
            f"| {calls} | {workers} | "
            + " | ".join(_f(c[x]) for x in shown)
            + f" | {_ratio(c['toolfleet'], c['durable'], 3)} "
            f"| {_ratio(c['toolfleet'], c['celery'])} |"
        )
    lines += _before_after_line(results)
    tf, du = results.lat("toolfleet"), results.lat("durable")
    if tf:
        lines += [
            "",
            f"Turn latency at {tf.rate:.1f} turns/s ({tf.calls_per_turn} calls per turn): "
            f"toolfleet p50 / p95 / p99 = {_f(tf.p50_ms)} / {_f(tf.p95_ms)} / {_f(tf.p99_ms)} ms"
            + (
                f"; durable relay {_f(du.p50_ms)} / {_f(du.p95_ms)} / {_f(du.p99_ms)} ms."
                if du
                else "."
            ),
        ]
    idle = [x for x in results.idle if x.calls_per_turn == 1]
    if idle:
        lines += [
            "",
            "Idle, one one-call turn at a time, p50 / p99: "
            + "; ".join(
                f"{LABELS[x.system]} {_f(x.p50_ms, 1)} / {_f(x.p99_ms, 1)} ms" for x in idle
            )
            + ".",
        ]
    if results.scale:
        s = results.scale
        est = " (extrapolated)" if s.extrapolated else ""
        fleet_rss = sum(s.at_target(n) for n in s.rss_at_peak if n.startswith("worker"))
        lines += [
            "",
            f"Scale: {s.reached:,} calls in flight reached; at {s.target_calls:,}{est} the "
            f"workers would hold {_mib(fleet_rss)} MiB RSS in total and Redis "
            f"{_f(s.redis_keys_per_call)} bytes per call.",
        ]
    lines.append(README_END)
    return "\n".join(lines)


def _before_after_line(results: Results) -> list[str]:
    """The benchmarks page's one line on the baseline commit against this one."""

    def spread(system: str) -> str:
        rows = [t for t in results.throughput if t.system == system]
        if not rows:
            return "not measured"
        rates = [t.calls_per_s for t in rows]
        shares = [
            t.calls_per_s / du.calls_per_s
            for t in rows
            if (du := results.tp("durable", t.calls_per_turn, t.workers)) and du.calls_per_s
        ]
        cpu = [t.cpu_us_per_call() for t in rows]
        share = f" ({min(shares):.0%}-{max(shares):.0%} of the durable relay)" if shares else ""
        return (
            f"{min(rates):,.0f}-{max(rates):,.0f} calls/s{share}, "
            f"{min(cpu):,.0f}-{max(cpu):,.0f} µs of CPU per call"
        )

    if not results.baseline:
        return []
    return [
        "",
        f"Before and after, in the same run: {label(results.baseline)} "
        f"{spread(results.baseline)}; at {_head(results)} {spread('toolfleet')}.",
    ]


def update_readme(readme: Path, block: str) -> None:
    """Replace the marked block of the benchmarks page ``readme`` (append it if missing)."""
    text = readme.read_text()
    pattern = re.compile(re.escape(README_BEGIN) + r".*?" + re.escape(README_END), re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _m: block, text)
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    readme.write_text(text)
