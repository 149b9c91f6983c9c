"""Run one toolfleet service under pyinstrument: ``python -m bench.profiled STEM planner``.

The service runs exactly as ``toolfleet planner`` would; when it stops (SIGTERM), the profile
is written next to STEM: ``STEM.html`` (pyinstrument's interactive view), ``STEM.txt`` (its
call tree), ``STEM.top.json`` (functions by self time, and the share spent idle waiting
for I/O) and ``STEM.pyisession`` (the samples, for ``pyinstrument --load``). These files are
kept out of git (see .gitignore).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections import defaultdict
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from pyinstrument import Profiler
from pyinstrument.frame import Frame

T = TypeVar("T")

IDLE_FUNCTIONS = frozenset({"select", "poll", "epoll.poll", "select.select", "_run_once"})
"""Self time in these is the event loop waiting for I/O, not work."""


APP_PACKAGES = ("planner/", "executors/", "aggregator/", "toolfleet/", "schemas/", "bench/")


def top_frames(root: Frame | None, limit: int = 25) -> dict[str, Any]:
    """Where the time went: functions by self time, toolfleet's own functions by inclusive
    time, self time by package, and the share spent idle in the event loop's poll."""
    selfs: dict[tuple[str, str], float] = defaultdict(float)
    inclusive: dict[tuple[str, str], float] = defaultdict(float)
    packages: dict[str, float] = defaultdict(float)
    total = root.time if root is not None else 0.0

    def walk(frame: Frame, active: frozenset[tuple[str, str]]) -> None:
        key = (frame.function, f"{frame.file_path_short}:{frame.line_no}")
        if not frame.is_synthetic:
            if frame.total_self_time > 0:
                selfs[key] += frame.total_self_time
                package = (frame.file_path_short or "?").split("/")[0].removesuffix(".py")
                if frame.function in IDLE_FUNCTIONS:
                    package = "(idle)"
                packages[package] += frame.total_self_time
            path = frame.file_path_short or ""
            if path.startswith(APP_PACKAGES) and key not in active:
                inclusive[key] += frame.time  # outermost occurrence only (no double count)
                active = active | {key}
        for child in frame.children:
            walk(child, active)

    if root is not None:
        walk(root, frozenset())
    idle = sum(t for (fn, _w), t in selfs.items() if fn in IDLE_FUNCTIONS)

    def ranked(table: dict[tuple[str, str], float]) -> list[dict[str, Any]]:
        rows = sorted(table.items(), key=lambda kv: kv[1], reverse=True)[:limit]
        return [
            {"function": fn, "where": where, "seconds": t, "share": t / total if total else 0.0}
            for (fn, where), t in rows
        ]

    return {
        "total_s": total,
        "idle_s": idle,
        "self": ranked(selfs),
        "inclusive": ranked(inclusive),
        "packages": {
            name: t / total if total else 0.0
            for name, t in sorted(packages.items(), key=lambda kv: kv[1], reverse=True)[:12]
        },
    }


def main(argv: list[str]) -> None:
    """Profile ``toolfleet ARGS...``; write the reports when the service returns.

    ``BENCH_PROFILE_ASYNC=enabled`` starts the profiler inside the service's main task, so
    that the time the task spends awaiting (Redis replies, Kafka acks, the next poll) is
    attributed to the ``await`` it waits in: a wall-clock breakdown of a service that handles
    one message at a time (planner, aggregator). ``disabled`` (the default) samples whatever
    the thread runs: a CPU breakdown, right for the worker's many concurrent tasks.
    """
    stem, args = Path(argv[0]), argv[1:]
    from toolfleet.app.cli import main as cli

    mode = os.environ.get("BENCH_PROFILE_ASYNC", "disabled")
    profiler = Profiler(interval=0.001, async_mode=mode)  # type: ignore[arg-type]
    if mode == "enabled":
        original = asyncio.run

        def run_profiled(main: Coroutine[Any, Any, T], **kwargs: Any) -> T:
            async def profiled() -> T:
                profiler.start()
                try:
                    return await main
                finally:
                    profiler.stop()

            return original(profiled(), **kwargs)

        asyncio.run = run_profiled
    else:
        profiler.start()
    try:
        cli.main(args=args, prog_name="toolfleet", standalone_mode=False)
    finally:
        if profiler.is_running:
            profiler.stop()
        session = profiler.last_session
        stem.parent.mkdir(parents=True, exist_ok=True)
        if session is not None:  # first: fast, and enough to re-render the rest
            session.save(f"{stem}.pyisession")  # pyinstrument --load STEM.pyisession
        Path(f"{stem}.html").write_text(profiler.output_html())
        Path(f"{stem}.txt").write_text(
            profiler.output_text(unicode=False, color=False, time="percent_of_total")
        )
        summary = top_frames(session.root_frame() if session else None)
        summary["mode"] = mode
        Path(f"{stem}.top.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
