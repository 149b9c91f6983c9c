"""Detached service processes tracked by pid files: start, find, stop.

A pid alone is not proof of ownership (pids are reused), so every lookup also asks the
caller's ``is_ours`` predicate to recognise the process before anything is reported or
signalled.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from kernel.errors import InfrastructureError

log = logging.getLogger(__name__)

Matcher = Callable[[psutil.Process], bool]

# Popen objects of services this interpreter started: kept so they are not garbage-collected
# while running (which warns) and so a dead child can be reaped instead of lingering as a zombie.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


@dataclass(frozen=True)
class ServiceStatus:
    """One service as seen by ``toolfleet infra``.

    ``state`` is ``running`` (our process is alive), ``stopped``, or ``external`` (the address
    came from KAFKA_BOOTSTRAP_SERVERS / REDIS_URL and nothing is managed locally).
    ``started`` is True only in what a start call returns when that call spawned the process.
    """

    name: str
    state: str
    address: str
    pid: int | None = None
    log_file: Path | None = None
    started: bool = False

    @property
    def available(self) -> bool:
        """Whether clients can be pointed at ``address``."""
        return self.state in ("running", "external")


def local_status(
    name: str, address: str, pid_file: Path, is_ours: Matcher, log_file: Path
) -> ServiceStatus:
    """A locally managed service's status, from its pid file (no network call)."""
    proc = find_running(pid_file, is_ours)
    return ServiceStatus(
        name,
        "running" if proc else "stopped",
        address,
        pid=proc.pid if proc else None,
        log_file=log_file,
    )


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` so concurrent ``up``/``down`` calls do not race."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def read_pid(pid_file: Path) -> int | None:
    """The pid recorded in ``pid_file``, or None when there is no usable one."""
    try:
        return int(pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def find_running(pid_file: Path, is_ours: Matcher) -> psutil.Process | None:
    """The live process recorded in ``pid_file`` if it is still the one we started."""
    pid = read_pid(pid_file)
    if pid is None:
        return None
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            _reap(pid)
            return None
        return proc if is_ours(proc) else None
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def spawn(argv: list[str], *, cwd: Path, log_file: Path, pid_file: Path) -> int:
    """Start ``argv`` in its own session (so it outlives us and our Ctrl-C), record its pid."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("ab") as out:
        out.write(f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {argv}\n".encode())
        out.flush()
        child = subprocess.Popen(
            argv,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    _CHILDREN[child.pid] = child
    tmp = pid_file.with_suffix(".tmp")
    tmp.write_text(f"{child.pid}\n")
    tmp.replace(pid_file)
    log.info("started %s as pid %d (log %s)", argv[0], child.pid, log_file)
    return child.pid


def is_alive(pid: int) -> bool:
    """Whether ``pid`` is a live (non-zombie) process; reaps it if it is our dead child."""
    try:
        if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            return True
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        pass
    _reap(pid)
    return False


def terminate(pid_file: Path, is_ours: Matcher, *, timeout: float) -> int | None:
    """Stop the process recorded in ``pid_file`` (SIGTERM, then SIGKILL after ``timeout``).

    Returns the pid that was stopped, or None when nothing of ours was running. The pid file
    is removed either way, since it no longer describes a live process.
    """
    proc = find_running(pid_file, is_ours)
    stopped = None
    if proc is not None:
        stopped = proc.pid
        log.info("stopping pid %d with SIGTERM", proc.pid)
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
            try:
                proc.wait(timeout)
            except psutil.TimeoutExpired:
                log.warning("pid %d ignored SIGTERM for %.0f s, sending SIGKILL", proc.pid, timeout)
                proc.kill()
                proc.wait(10)
        _reap(proc.pid)
    pid_file.unlink(missing_ok=True)
    return stopped


def ensure_port_free(port: int, service: str, setting: str) -> None:
    """Fail early, with advice, when another program already listens on ``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            raise InfrastructureError(
                f"{service} cannot start: 127.0.0.1:{port} is already in use ({exc.strerror}). "
                f"Stop whatever listens there, or pick another port with {setting}."
            ) from exc


def log_tail(log_file: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of ``log_file``, for error messages."""
    try:
        text = log_file.read_text(errors="replace")
    except FileNotFoundError:
        return "(no log written)"
    return "\n".join(text.splitlines()[-lines:])


def _reap(pid: int) -> None:
    child = _CHILDREN.pop(pid, None)
    if child is not None:
        # A child that psutil already waited for reports ECHILD here; Popen treats that as done.
        child.poll()
