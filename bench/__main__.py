"""``python -m bench`` (``make bench``): every scenario, every baseline, one markdown report.

Starts the local Kafka and Redis (``toolfleet infra up``, idempotent), runs toolfleet, the raw
and the durable relay, Celery, the in-process baseline and the peers (Temporal with activities
and with local activities, DBOS on Postgres) one after another, prints the report on stdout,
writes it to ``bench/results/latest.md``, and with ``--docs`` refreshes the summary in
``docs/benchmarks.md``. Progress goes to stderr. Every process it starts is stopped on the way out.

``--baseline REF`` runs (a)'s toolfleet rows a second time, right after this checkout's, with
the services of commit REF (``bench.baseline``), for the report's before-and-after section.
Scenario ``f`` measures toolfleet's state on one Redis against 3 shards (``bench.state_scale``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from bench.baseline import Baseline, BaselineError, materialise
from bench.procs import REPO, progress
from bench.report import PEERS, Results, readme_block, render, targets, update_readme
from bench.report import SYSTEMS as BASELINES
from bench.scenarios import Bench, Durations
from bench.systems import RunContext
from kernel.settings import Settings
from toolfleet.app import infra

RESULTS = REPO / "bench" / "results"
BENCH_PAGE = REPO / "docs" / "benchmarks.md"
"""The page whose latest-run block ``--docs`` rewrites (between the bench markers)."""
SCENARIOS = ("a", "b", "c", "d", "e", "f", "profile")
SYSTEMS = (*BASELINES, *PEERS)


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "--quick", action="store_true", help="short windows and 10,000 calls for (d): a smoke run"
    )
    parser.add_argument(
        "--only",
        default=",".join(SCENARIOS),
        help="comma-separated scenarios among " + ",".join(SCENARIOS) + " (default: all)",
    )
    parser.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help="comma-separated systems among " + ",".join(SYSTEMS) + " (default: all)",
    )
    parser.add_argument(
        "--profile",
        metavar="SERVICE",
        help="profile this service (planner, aggregator, worker-0) instead of the busiest",
    )
    parser.add_argument(
        "--baseline",
        metavar="REF",
        default="",
        help="also run (a)'s toolfleet rows with the services of commit REF (its tree written "
        "out under .artifacts/bench-baseline/), for the report's before and after; empty: none",
    )
    parser.add_argument(
        "--redis-max-connections",
        type=int,
        metavar="N",
        help="give toolfleet's services a Redis pool of N connections (REDIS_URL "
        "?max_connections=N) instead of redis-py's default",
    )
    parser.add_argument(
        "--docs",
        "--readme",  # its name while the numbers were in the README
        dest="docs",
        action="store_true",
        help=f"also refresh the numbers in {BENCH_PAGE.relative_to(REPO)}",
    )
    parser.add_argument(
        "--output", type=Path, default=RESULTS / "latest.md", help="where the report goes"
    )
    return parser.parse_args(argv)


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "?"
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return out.stdout.strip() + (" (with uncommitted changes)" if dirty else "")


async def _run(bench: Bench, scenarios: set[str], systems: set[str]) -> None:
    # (system the --systems filter knows it by, what progress calls it, what runs it)
    sections = [
        ("toolfleet", "toolfleet", bench.run_toolfleet),
        *(
            [("toolfleet", bench.baseline.system, bench.run_baseline)]
            if bench.baseline is not None and "a" in scenarios
            else []
        ),
        ("relay", "relay", bench.run_relay),
        ("durable", "durable", bench.run_durable),
        ("celery", "celery", bench.run_celery),
        ("inprocess", "inprocess", bench.run_inprocess),
        ("temporal", "temporal", bench.run_temporal),
        ("temporal_local", "temporal_local", bench.run_temporal_local),
        ("dbos", "dbos", bench.run_dbos),
    ]
    try:
        await bench.warm_broker()
        for wanted, system, run in sections:
            if wanted not in systems:
                continue
            progress(f"--- {system}")
            try:
                await bench.quiet_broker(system)
                await run(scenarios)
            except Exception as exc:
                bench.results.errors.append(f"{system}: {type(exc).__name__}: {exc}")
                progress(f"{system} FAILED: {type(exc).__name__}: {exc}")
        if "d" in scenarios and "toolfleet" in systems:
            progress("--- (d) scale")
            try:
                await bench.run_scale()
            except Exception as exc:
                bench.results.errors.append(f"scale: {type(exc).__name__}: {exc}")
                progress(f"scale FAILED: {type(exc).__name__}: {exc}")
        if "f" in scenarios and "toolfleet" in systems:
            progress("--- (f) state scale: one Redis, then 3 shards")
            try:
                await bench.run_state_scale()
            except Exception as exc:
                bench.results.errors.append(f"state scale: {type(exc).__name__}: {exc}")
                progress(f"state scale FAILED: {type(exc).__name__}: {exc}")
    finally:
        progress("cleaning up this run's topics and Redis keys")
        await bench.ctx.cleanup()


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks; exit status 1 if any part failed."""
    args = _args(sys.argv[1:] if argv is None else argv)
    scenarios = set(args.only.split(","))
    systems = set(args.systems.split(","))
    began = time.monotonic()
    baseline: Baseline | None = None
    if args.baseline:
        try:
            baseline = materialise(args.baseline)
        except BaselineError as exc:
            progress(f"--baseline {args.baseline}: {exc}")
            return 2
        progress(f"baseline {baseline.system}: its tree is {baseline.root}")
    settings = Settings()
    progress("starting Kafka and Redis if they are not running (toolfleet infra up)")
    status = infra.up(settings)
    load = os.getloadavg()
    results = Results(started=dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"))
    results.meta.update(
        cores=str(psutil.cpu_count()),
        memory=f"{psutil.virtual_memory().total / 2**30:.0f} GiB",
        load_before=f"{load[0]:.2f}",
        commit=_commit(),
        mode="quick" if args.quick else "full",
        infra=f"Kafka {status.bootstrap_servers}, Redis {status.redis_url}",
    )
    if load[0] > 0.5:
        results.meta["noise"] = (
            f"Other work was running when the run started (load average {load[0]:.2f}): "
            "absolute numbers are noisy; ratios less so."
        )
    ctx = RunContext(settings, RESULTS, redis_max_connections=args.redis_max_connections)
    if args.redis_max_connections is not None:
        results.meta["config"] = (
            f"toolfleet's services ran with a Redis pool of {args.redis_max_connections} "
            "connections (REDIS_URL ?max_connections), not redis-py's default of 100."
        )
    progress(f"run {ctx.run_id}: logs in {ctx.log_root}")
    bench = Bench(ctx, Durations.quick() if args.quick else Durations(), results)
    bench.profile_service = args.profile
    bench.baseline = baseline
    try:
        asyncio.run(_run(bench, scenarios, systems))
    except KeyboardInterrupt:
        progress("interrupted: every child process has been stopped")
        return 130
    elapsed = time.monotonic() - began
    results.meta["runtime"] = f"{elapsed / 60:.1f} min"
    report = render(results)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(report + "\n")
    print(report)
    if args.docs:
        path = args.output.relative_to(REPO) if args.output.is_relative_to(REPO) else args.output
        update_readme(BENCH_PAGE, readme_block(results, str(path)))
        progress(f"{BENCH_PAGE.relative_to(REPO)}: the latest run's numbers refreshed")
    verdicts = ", ".join(
        f"{'held' if t.held else 'missed' if t.held is not None else 'n/a'}"
        for t in targets(results)
    )
    progress(f"done in {elapsed / 60:.1f} min; targets: {verdicts}; report: {args.output}")
    return 1 if results.errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
