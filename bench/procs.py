"""Child processes of the bench and what they cost: start, stop (always), CPU time, RSS.

Every process the bench starts is started with ``PR_SET_PDEATHSIG``, so even a bench that is
SIGKILLed takes its children with it; a normal exit or an exception stops them in ``finally``
blocks (SIGTERM, then SIGKILL after a grace period).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil
import redis

from kernel.settings import Settings
from toolfleet.app import infra
from toolfleet.testing import ChildProcess, LocalFleet

REPO = Path(__file__).resolve().parent.parent

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def progress(message: str) -> None:
    """One progress line on stderr (stdout carries only the report)."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def spawn(
    argv: list[str], env: Mapping[str, str], log: IO[bytes], cwd: Path = REPO
) -> subprocess.Popen[bytes]:
    """Start a child that dies with the bench, in ``cwd``; call only from the main thread."""
    return subprocess.Popen(
        argv,
        env=dict(env),
        stdout=log,
        stderr=log,
        cwd=cwd,
        preexec_fn=_die_with_parent,  # noqa: PLW1509 - prctl only, no locks or threads
    )


def terminate(popen: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """SIGTERM, wait up to ``grace_s``, then SIGKILL."""
    if popen.poll() is None:
        popen.send_signal(signal.SIGTERM)
    try:
        popen.wait(grace_s)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait()


def source_path(root: Path = REPO) -> str:
    """PYTHONPATH of a child whose code comes from the source tree ``root``: it goes first,
    so every top-level package (and ``bench.tools``) is imported from there, before the
    virtualenv's editable install of this checkout (a ``.pth`` entry after site-packages)."""
    return os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))


def python_env(**extra: str) -> dict[str, str]:
    """Environment of a Python child of the bench: unbuffered, the repo on its path."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": source_path(), **extra}


@dataclass
class ProcessGroup:
    """The named child processes of one system under test, each logging to its own file.

    Celery's, Temporal's and DBOS's workers and the relay's services are each one group: it
    starts them (a fresh log per start, so a readiness check reads this start's), tells when
    one died (with its log's tail), scales the ``worker-N`` processes and stops them all.
    """

    label: str
    log_dir: Path
    grace_s: float = 15.0
    """How long a SIGTERMed child may take to exit before it is killed."""
    procs: dict[str, tuple[subprocess.Popen[bytes], IO[bytes]]] = field(default_factory=dict)

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def log_text(self, name: str) -> str:
        path = self.log_path(name)
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self, name: str, argv: list[str], env: Mapping[str, str]) -> None:
        path = self.log_path(name)
        if path.exists():
            path.rename(self.log_dir / f"{name}.{time.monotonic_ns()}.log")
        log = path.open("ab")
        self.procs[name] = (spawn(argv, env, log), log)

    def stop(self, name: str) -> None:
        popen, log = self.procs.pop(name)
        terminate(popen, self.grace_s)
        log.close()

    def stop_all(self, last: str | None = None) -> None:
        """Stop every child, ``last`` after the others (a server its workers talk to)."""
        for name in sorted(self.procs, key=lambda n: n == last):
            self.stop(name)

    def check(self) -> None:
        """Raise, with the log's tail, if a child has exited."""
        for name, (popen, _log) in self.procs.items():
            if popen.poll() is not None:
                tail = "\n".join(self.log_text(name).splitlines()[-15:])
                raise RuntimeError(f"{self.label} {name} exited with {popen.returncode}:\n{tail}")

    def pids(self) -> dict[str, int]:
        return {name: popen.pid for name, (popen, _log) in self.procs.items()}

    def workers(self) -> list[str]:
        """The running ``worker-N`` names."""
        return sorted(n for n in self.procs if n.startswith("worker-"))

    def scale(self, count: int, start_worker: Callable[[int], None]) -> None:
        """Stop the workers past ``count``; start ``worker-N`` for each missing N < count."""
        for name in self.workers()[count:]:
            self.stop(name)
        for n in range(count):
            if f"worker-{n}" not in self.procs:
                start_worker(n)


def child_env(settings: Settings, **extra: str) -> dict[str, str]:
    """Environment of a bench child: the services' addresses, the prefix, the repo on the path."""
    env = dict(
        KAFKA_BOOTSTRAP_SERVERS=settings.kafka_servers(),
        REDIS_URL=settings.redis_address(),
        TOOLFLEET_TOPIC_PREFIX=settings.topic_prefix,
        TOOLFLEET_PARTITIONS=str(settings.partitions),
        TOOLFLEET_METRICS_PORT="0",
    )
    return python_env(**{**env, **extra})


def latest_assignment(log_text: str) -> list[int] | None:
    """The partitions of the last ``partitions assigned`` JSON log line, if any."""
    found = None
    for line in log_text.splitlines():
        if line.startswith("{") and '"partitions assigned"' in line:
            with contextlib.suppress(ValueError, KeyError):
                found = list(json.loads(line)["partitions"])
    return found


async def wait_until(
    condition: Callable[[], bool],
    *,
    within: float,
    what: str,
    check: Callable[[], None] | None = None,
    poll_s: float = 0.1,
) -> None:
    """Poll an observable condition until it holds; TimeoutError after ``within`` s."""
    deadline = time.monotonic() + within
    while not condition():
        if check is not None:
            check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not reached within {within:g} s")
        await asyncio.sleep(poll_s)  # the polling interval of a deadline-bounded wait


@dataclass
class BenchFleet(LocalFleet):
    """LocalFleet whose children die with the bench, keep one log per start, can be profiled.

    ``profile`` maps a child name (``planner``, ``aggregator``, ``worker-0``) to an output
    path stem: that child then runs under pyinstrument and writes ``<stem>.html`` and
    ``<stem>.txt`` when it stops.

    ``root`` is the source tree the children run: this checkout, or another commit's tree
    (``bench.baseline``), which is then their working directory and first on PYTHONPATH.
    """

    profile: dict[str, Path] = field(default_factory=dict)
    root: Path = REPO

    def env(self) -> dict[str, str]:
        """LocalFleet's environment plus ``root`` on PYTHONPATH (for ``bench.tools``)."""
        env = super().env()
        env["PYTHONPATH"] = source_path(self.root)
        return env

    def start(self, name: str, args: list[str]) -> None:
        """Start one ``toolfleet`` subcommand (a fresh log each time, so readiness is current)."""
        path = self.log_dir / f"{name}.log"
        if path.exists():
            path.rename(self.log_dir / f"{name}.{time.monotonic_ns()}.log")
        log = path.open("ab")
        argv = [sys.executable, "-m", "toolfleet", *args]
        if name in self.profile:
            argv = [sys.executable, "-m", "bench.profiled", str(self.profile[name]), *args]
        popen = spawn(argv, self.env(), log, cwd=self.root)
        self._procs[name] = ChildProcess(name, argv, log, popen)

    def terminate(self, name: str, grace_s: float = 20.0) -> None:
        """Stop one child cleanly (SIGTERM, then SIGKILL) and forget it."""
        proc = self._procs.pop(name)
        if proc.popen is not None:
            terminate(proc.popen, grace_s)
        proc.log.close()

    def pids(self) -> dict[str, int]:
        """Running children by name."""
        return {
            name: p.popen.pid
            for name, p in self._procs.items()
            if p.popen is not None and p.popen.poll() is None
        }

    def stop_now(self) -> None:
        """SIGKILL everything (after a measurement whose in-flight work is not wanted)."""
        for proc in self._procs.values():
            if proc.popen is not None and proc.popen.poll() is None:
                proc.popen.kill()
        for proc in self._procs.values():
            if proc.popen is not None:
                proc.popen.wait()
            proc.log.close()
        self._procs.clear()


def infra_pids(settings: Settings) -> dict[str, int]:
    """Kafka's and Redis's pids when this machine runs them (else nothing to measure)."""
    status = infra.status(settings)
    pids = {}
    for name, service in (("kafka", status.kafka), ("redis", status.redis)):
        if service.pid:
            pids[name] = service.pid
    return pids


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its reaped children so far; 0 when gone.

    The children matter for Redis: its AOF rewrites run in forked children, every few
    seconds under load, and are part of what the ledger costs.
    """
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return float(t.user + t.system + t.children_user + t.children_system)


def rss_bytes(pid: int) -> int:
    """Current resident set size; 0 when gone."""
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return 0


def peak_rss_bytes(pid: int) -> int:
    """Peak resident set size since the process started (Linux VmHWM), else the current RSS."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return rss_bytes(pid)


class CpuMeter:
    """Over one window: CPU seconds of each named process, the machine's busy share, and (given
    a Redis URL) how many calls and microseconds each Redis command took (INFO commandstats,
    which counts the commands Lua scripts run too) and how many AOF rewrites Redis started."""

    def __init__(self, pids: Mapping[str, int], redis_url: str | None = None) -> None:
        self.pids = dict(pids)
        self.redis_url = redis_url
        self._began: dict[str, float] = {}
        self._machine: Any = None
        self._commands: dict[str, tuple[int, float]] = {}
        self._t0 = 0.0
        self.seconds = 0.0
        self.used: dict[str, float] = {}
        self.machine_busy = 0.0
        """Share of all cores that were busy (0..1) over the window."""
        self.redis_commands: dict[str, tuple[int, float]] = {}
        """Redis command -> (calls, microseconds) over the window."""
        self.aof_rewrites = 0
        """AOF rewrites that ran during the window (each forks Redis and copies its dataset)."""
        self._rewrites = 0

    def start(self) -> None:
        self._began = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self._machine = psutil.cpu_times()
        self._commands, started, running = self._command_stats()
        # One already running when the window began costs the window too.
        self._rewrites = started - running
        self._t0 = time.monotonic()

    def stop(self) -> dict[str, float]:
        self.seconds = time.monotonic() - self._t0
        self.used = {
            name: max(0.0, cpu_seconds(pid) - self._began.get(name, 0.0))
            for name, pid in self.pids.items()
        }
        now = psutil.cpu_times()
        if self._machine is not None:
            total = sum(now) - sum(self._machine)
            idle = (now.idle + getattr(now, "iowait", 0.0)) - (
                self._machine.idle + getattr(self._machine, "iowait", 0.0)
            )
            self.machine_busy = 1.0 - idle / total if total > 0 else 0.0
        after, started, _running = self._command_stats()
        self.aof_rewrites = started - self._rewrites
        self.redis_commands = {
            name: (calls - self._commands.get(name, (0, 0.0))[0],
                   usec - self._commands.get(name, (0, 0.0))[1])
            for name, (calls, usec) in after.items()
            if calls > self._commands.get(name, (0, 0.0))[0]
        }  # fmt: skip
        return self.used

    def _command_stats(self) -> tuple[dict[str, tuple[int, float]], int, int]:
        """Redis command -> (calls, microseconds) so far, the AOF rewrites started so far
        (Redis counts one when it forks) and whether one is running."""
        if self.redis_url is None:
            return {}, 0, 0
        client = redis.Redis.from_url(self.redis_url)
        try:
            stats = client.info("commandstats")
            persistence = client.info("persistence")
        except redis.RedisError:
            return {}, 0, 0
        finally:
            client.close()
        commands = {
            str(name).removeprefix("cmdstat_"): (int(v["calls"]), float(v["usec"]))
            for name, v in stats.items()
            if isinstance(v, dict)
        }
        started = int(persistence.get("aof_rewrites", 0))
        return commands, started, int(persistence.get("aof_rewrite_in_progress", 0))
