"""Baseline 4: DBOS 3.x on Postgres, one durable workflow per turn, its calls on a DBOS queue.

What a team that wants durable execution without a broker would build: DBOS keeps every
workflow's state in a Postgres *system database* and its workers poll that database's queues.

- The driver enqueues one ``bench_turn`` workflow per turn on the ``bench-turns`` queue with
  ``DBOSClient.enqueue`` (an INSERT, committed: the turn is handed in), from a few threads.
- A worker dequeues it. The turn workflow enqueues one ``bench_call`` workflow per call on the
  ``bench-calls`` queue, all at once, then awaits their handles in model order and returns
  ``[(call_id, output), ...]``. Any worker may run any call.
- ``bench_call`` parses its arguments JSON and answers ``ok`` (``bench.tools.noop_body``).
- The driver collects finished turns with one ``DBOSClient.list_workflows`` query per poll for
  every outstanding turn (a handle's ``get_result`` would poll one row per turn per interval,
  which at hundreds of turns outstanding costs the driver more than the system it measures),
  and checks every result: completed, one ``ok`` per call, in model order.

Durable as in production: Postgres with ``fsync`` and ``synchronous_commit`` on, so every
commit (enqueue, dequeue, each workflow's outcome, the parent's record of each child's result)
waits for its WAL flush. DBOS's own settings are its defaults (system database pool of 20
connections per worker, LISTEN/NOTIFY on) except the polling intervals (``POLL_S``) and the
per-worker queue concurrency (``WORKER_CONCURRENCY``).

Where it does best: a worker is CPU-bound on DBOS's own database round trips (a dozen or so per
call, each through SQLAlchemy), and every outstanding turn polls its next call's result, so
throughput is flat from 25 to 200 calls outstanding and falls beyond (at 400 outstanding, turns
of 5 and 20 calls all but stop for the first seconds: the pollers crowd out the work).

Postgres is a private cluster (``PostgresCluster``): initdb'ed once under the state dir (as
root: under the ``postgres`` user's home, since /root is closed to that user), listening on
127.0.0.1:15432 only, password auth, its socket in a private directory. Each run gets a fresh
database, dropped at the end, and the server is stopped when the run ends (reused between runs
it would hold memory and a port for nothing; a start costs well under a second).

Workers: ``python -m bench.dbos_peer worker --name worker-N``, one process each, configured by
``BENCH_DBOS_URL`` (the system database) and ``BENCH_DBOS_POLL_S``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import psutil
from dbos import DBOS, DBOSClient, EnqueueOptions, Queue, WorkflowStatus

from bench.procs import ProcessGroup, progress, python_env, spawn, terminate
from bench.tools import noop_body
from bench.workload import Listener, Turn

if TYPE_CHECKING:
    from bench.systems import RunContext

APP = "toolfleet-bench"
"""DBOS application name of the workers and the driver's client (queues belong to it)."""
VERSION = "bench"
"""Application version of every worker, and of every turn the driver enqueues."""
TURN_QUEUE = "bench-turns"
CALL_QUEUE = "bench-calls"
TURN_WORKFLOW = "bench_turn"
CALL_WORKFLOW = "bench_call"

POLL_S = float(os.environ.get("BENCH_DBOS_POLL_S", "0.01"))
"""How often a worker polls each queue (``polling_interval_sec``; DBOS's default is 1 s), a
turn workflow its calls' results (``get_result(polling_interval_sec=)``, also 1 s by default)
and the driver its turns' results: 10 ms, what a user who wants interactive latency would set
(a turn waits for up to three polls). It is not free: an idle worker spends about half a core
polling its two queues (0.18 at 50 ms, 0.04 at 1 s), and every turn waiting for a call polls
too, which is why DBOS does best with few turns outstanding. 50 ms measured 15-60 ms slower
per idle turn; 20 ms about the same as 10."""

WORKER_CONCURRENCY = int(os.environ.get("BENCH_DBOS_CONCURRENCY", "2000"))
"""``worker_concurrency`` of both queues: how many of the queue's workflows one worker runs at
once, and so claims in one poll. 2,000: above the most calls (and turns) the bench keeps
outstanding (1,600), so it never limits; the workflows are async and share the worker's event
loop, so idle slots cost nothing. Workers share the work by polling in turn (each claims what
was queued since its last poll)."""

WINDOW_CALLS = 100
"""Calls to keep outstanding in the closed loop (bench (a)) for DBOS: where it does best (25 to
200 were within noise of each other on two cores; at 400 multi-call turns collapse)."""

SUBMITTERS = 4
"""Driver threads enqueueing turns (``DBOSClient`` is synchronous); ``send`` waits for a free
one, so at most this many enqueues are in flight: the driver's backpressure."""

TERMINAL = ["SUCCESS", "ERROR", "CANCELLED", "MAX_RECOVERY_ATTEMPTS_EXCEEDED"]

PG_PORT = int(os.environ.get("BENCH_PG_PORT", "15432"))
PG_USER = "toolfleet"
"""The cluster's superuser (password in ``<cluster>/password``)."""
PG_SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "max_connections": "200",  # 20 per worker (DBOS's pool) + listeners + the driver
    "logging_collector": "off",  # the server logs to stderr: the run's postgres.log
}
"""Passed on the command line at every start, so a reused cluster runs with them too."""

READY = "dbos worker ready"


# ---------------------------------------------------------------------------- workflows

_queues: dict[str, Queue] = {}
"""A worker's queues by name (a ``Queue`` comes only from the system database)."""


@DBOS.workflow(name=CALL_WORKFLOW)
async def bench_call(call_id: str, arguments: str) -> str:
    """One call: the no-op tool, which parses its arguments and answers ``ok``."""
    json.loads(arguments)
    return await noop_body()


@DBOS.workflow(name=TURN_WORKFLOW)
async def bench_turn(run_id: str, calls: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """One turn: its calls enqueued at once, their outputs gathered in model order."""
    queue = _queues.get(CALL_QUEUE) or await DBOS.retrieve_queue_async(CALL_QUEUE)
    assert queue is not None, f"queue {CALL_QUEUE} is not registered"
    handles = await asyncio.gather(*(queue.enqueue_async(bench_call, c, a) for c, a in calls))
    return [
        (call_id, await handle.get_result(polling_interval_sec=POLL_S))
        for (call_id, _a), handle in zip(calls, handles, strict=True)
    ]


def worker_main(name: str) -> None:
    """A DBOS worker: launch, listen to every queue of ``APP``, run until SIGTERM."""
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    instance = DBOS(
        config={
            "name": APP,
            "system_database_url": os.environ["BENCH_DBOS_URL"],
            "application_version": VERSION,
            "executor_id": name,
            "run_migrations": False,  # the bench migrated the database before any worker
            "log_level": "INFO",
        }
    )
    DBOS.launch()
    calls_queue = DBOS.retrieve_queue(CALL_QUEUE)
    if calls_queue is None:
        raise SystemExit(f"{name}: queue {CALL_QUEUE} is not registered")
    _queues[CALL_QUEUE] = calls_queue
    # Open (nearly) the whole pool now: the CPU meter sees Postgres's backends as they are when
    # it starts, so they should not appear later under load. Two are left to DBOS's threads.
    pool: Any = instance._sys_db.engine.pool  # DBOS has no public handle on it
    held = []
    while pool.checkedout() < pool.size() - 2:
        held.append(instance._sys_db.engine.connect())
    for conn in held:
        conn.close()
    wanted = {f"queue-worker-{TURN_QUEUE}", f"queue-worker-{CALL_QUEUE}"}
    deadline = time.monotonic() + 60
    while not wanted <= {t.name for t in threading.enumerate()}:
        if time.monotonic() > deadline or stop.is_set():
            raise SystemExit(f"{name}: DBOS queue threads not started within 60 s")
        stop.wait(0.05)  # polling interval of a deadline-bounded wait
    print(json.dumps({"msg": READY, "pid": os.getpid()}), flush=True)
    while not stop.wait(1.0):  # until SIGTERM (the handler sets the event)
        pass
    DBOS.destroy()


# ----------------------------------------------------------------------------- Postgres


def pg_bindir() -> Path:
    """Where initdb and postgres are: on PATH, else Debian's newest /usr/lib/postgresql/N/bin."""
    found = shutil.which("initdb")
    if found is not None and (Path(found).resolve().parent / "postgres").exists():
        return Path(found).resolve().parent
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: [int(x) if x.isdigit() else 0 for x in p.parent.parent.name.split(".")],
    )
    if not versions:
        raise RuntimeError("PostgreSQL server not found: run scripts/install-postgres.sh")
    return versions[-1].parent


def cluster_dir(state_dir: Path) -> Path:
    """The private cluster's directory: under the state dir, or as root under the home of
    the ``postgres`` user that runs it (root's state dir is closed to every other user)."""
    if os.geteuid() != 0:
        return state_dir / "postgres"
    try:
        home = Path(pwd.getpwnam("postgres").pw_dir)
    except KeyError:
        raise RuntimeError(
            "running as root, Postgres needs a non-root user to run as: the 'postgres' user "
            "(created by scripts/install-postgres.sh) does not exist"
        ) from None
    return home / "toolfleet-bench"


@dataclass
class PostgresCluster:
    """A private Postgres cluster on loopback: initdb once, started and stopped per run."""

    root: Path
    log_path: Path
    port: int = PG_PORT
    popen: subprocess.Popen[bytes] | None = None
    adopted: int | None = None
    """Pid of a server that was already running on this cluster (left running at the end)."""
    setup_s: dict[str, float] = field(default_factory=dict)
    _log: IO[bytes] | None = None

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        return self.root / "run"

    @property
    def password_file(self) -> Path:
        return self.root / "password"

    def _owner(self) -> pwd.struct_passwd | None:
        """The user the server runs as when the bench is root (None: the bench's own)."""
        return pwd.getpwnam("postgres") if os.geteuid() == 0 else None

    def _argv(self, program: str, *args: str) -> list[str]:
        argv = [str(pg_bindir() / program), *args]
        owner = self._owner()
        if owner is None:
            return argv
        # setpriv execs the program (its pid is the server's) and sets the parent-death
        # signal after switching user, which clears the one spawn() set.
        return [
            "setpriv", f"--reuid={owner.pw_uid}", f"--regid={owner.pw_gid}", "--init-groups",
            "--pdeathsig=TERM", "--", *argv,
        ]  # fmt: skip

    def _own(self, path: Path) -> None:
        owner = self._owner()
        if owner is not None:
            os.chown(path, owner.pw_uid, owner.pw_gid)

    def password(self) -> str:
        return self.password_file.read_text().strip()

    def conninfo(self, database: str) -> dict[str, Any]:
        return {
            "host": "127.0.0.1", "port": self.port, "user": PG_USER,
            "password": self.password(), "dbname": database, "connect_timeout": 5,
        }  # fmt: skip

    def url(self, database: str) -> str:
        return f"postgresql://{PG_USER}:{self.password()}@127.0.0.1:{self.port}/{database}"

    async def start(self) -> None:
        """initdb if needed, start the server (or adopt a running one), wait until it serves."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        await self._initdb()
        began = time.monotonic()
        running = self._running_pid()
        if running is not None:
            self.adopted = running
            progress(f"postgres: using the server already running on {self.root} ({running})")
        else:
            self.socket_dir.mkdir(mode=0o700, exist_ok=True)
            self._own(self.socket_dir)
            args = ["-D", str(self.data), "-c", f"port={self.port}",
                    "-c", f"unix_socket_directories={self.socket_dir}"]  # fmt: skip
            for name, value in PG_SETTINGS.items():
                args += ["-c", f"{name}={value}"]
            self.popen = spawn(self._argv("postgres", *args), dict(os.environ), self._log)
        await self._wait_ready(within=60)
        # An adopted server was started by someone else: measure only a durable one.
        durable = await asyncio.to_thread(self._settings, ["fsync", "synchronous_commit"])
        if set(durable.values()) != {"on"}:
            raise RuntimeError(f"postgres on port {self.port} is not durable: {durable}")
        self.setup_s["postgres start"] = time.monotonic() - began
        progress(
            f"postgres: serving on 127.0.0.1:{self.port} in {self.setup_s['postgres start']:.2f} s"
        )

    async def _initdb(self) -> None:
        if (self.data / "PG_VERSION").exists():
            if not self.password_file.exists():
                raise RuntimeError(
                    f"{self.password_file} is missing: delete {self.root} to start over"
                )
            self.setup_s["initdb"] = 0.0
            return
        began = time.monotonic()
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._own(self.root)
        shutil.rmtree(self.data, ignore_errors=True)  # what a failed initdb may have left
        fd = os.open(self.password_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(24) + "\n")
        self._own(self.password_file)
        argv = self._argv(
            "initdb", "-D", str(self.data), "-U", PG_USER, f"--pwfile={self.password_file}",
            "--auth-local=scram-sha-256", "--auth-host=scram-sha-256", "-E", "UTF8",
            "--no-locale",
        )  # fmt: skip
        assert self._log is not None
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=self._log, stderr=self._log, cwd=self.root
        )
        try:
            code = await asyncio.wait_for(proc.wait(), 120)
        except TimeoutError:
            proc.kill()
            raise
        if code != 0:
            raise RuntimeError(f"initdb exited with {code}:\n{self.log_tail()}")
        self.setup_s["initdb"] = time.monotonic() - began
        progress(f"postgres: initdb {self.data} in {self.setup_s['initdb']:.2f} s")

    def _running_pid(self) -> int | None:
        """The pid in postmaster.pid if that process is a live postgres, else None."""
        with contextlib.suppress(OSError, ValueError, IndexError, psutil.Error):
            pid = int((self.data / "postmaster.pid").read_text().splitlines()[0])
            if psutil.Process(pid).name() in {"postgres", "postmaster"}:
                return pid
        return None

    def _connect(self) -> None:
        import psycopg

        with psycopg.connect(**self.conninfo("postgres")) as conn:
            conn.execute("SELECT 1")

    async def _wait_ready(self, within: float) -> None:
        deadline = time.monotonic() + within
        while True:
            self.check()
            try:
                await asyncio.to_thread(self._connect)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"postgres: not accepting connections within {within:g} s:\n"
                        + self.log_tail()
                    ) from None
            await asyncio.sleep(0.05)  # polling interval of a deadline-bounded wait

    def _settings(self, names: list[str]) -> dict[str, str]:
        import psycopg

        with psycopg.connect(**self.conninfo("postgres")) as conn:
            rows = conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)", [names]
            ).fetchall()
        return {str(name): str(setting) for name, setting in rows}

    def _execute(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(**self.conninfo("postgres"), autocommit=True) as conn:
            conn.execute(sql)  # type: ignore[arg-type]

    async def create_database(self, name: str) -> str:
        """A fresh, empty database; returns its URL."""
        await asyncio.to_thread(self._execute, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await asyncio.to_thread(self._execute, f'CREATE DATABASE "{name}"')
        return self.url(name)

    def drop_database(self, name: str) -> None:
        self._execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def pid(self) -> int | None:
        if self.popen is not None:
            return self.popen.pid
        return self.adopted

    def alive(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return self.adopted is not None and psutil.pid_exists(self.adopted)

    def check(self) -> None:
        if self.popen is not None and self.popen.poll() is not None:
            raise RuntimeError(f"postgres exited with {self.popen.returncode}:\n{self.log_tail()}")

    def log_tail(self, lines: int = 15) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Fast shutdown (SIGINT: sessions are closed, a checkpoint written), then SIGKILL."""
        try:
            if self.popen is not None:
                if self.popen.poll() is None:
                    self.popen.send_signal(signal.SIGINT)
                terminate(self.popen, grace_s=30)
                self.popen = None
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None


# -------------------------------------------------------------------------------- target


class DbosTarget:
    """Enqueues one turn workflow per turn with DBOSClient; polls finished turns in batches."""

    def __init__(self, url: str, label: str = "DBOS (queue)") -> None:
        self.url = url
        self.label = label
        self.listener: Listener | None = None
        self.errors: list[BaseException] = []
        self.client: DBOSClient | None = None
        self._outstanding: dict[str, tuple[str, ...]] = {}
        """run_id -> its call ids, in model order."""
        self._submit = ThreadPoolExecutor(SUBMITTERS, thread_name_prefix="dbos-submit")
        self._poll = ThreadPoolExecutor(1, thread_name_prefix="dbos-poll")
        self._slots = asyncio.Semaphore(SUBMITTERS)
        self._wake = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self._stopping = False

    async def start(self) -> None:
        """Connect, register both queues (before any worker starts), start the reader."""
        self.client = await asyncio.to_thread(
            lambda: DBOSClient(
                system_database_url=self.url,
                application_name=APP,
                system_database_pool_size=SUBMITTERS + 1,
            )
        )
        client = self.client
        for queue in (TURN_QUEUE, CALL_QUEUE):
            await asyncio.to_thread(
                lambda q=queue: client.register_queue(
                    q, worker_concurrency=WORKER_CONCURRENCY, polling_interval_sec=POLL_S
                )
            )
        self._reader = asyncio.create_task(self._read())

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._reader is not None:
            await asyncio.wait({self._reader}, timeout=5)
        self._submit.shutdown(wait=True, cancel_futures=True)
        self._poll.shutdown(wait=True, cancel_futures=True)
        if self.client is not None:
            await asyncio.to_thread(self.client.destroy)
            self.client = None

    def check(self) -> None:
        """Raise the first error an enqueue or a result poll hit."""
        if self.errors:
            raise RuntimeError(f"{self.label}: the DBOS client failed") from self.errors[0]

    async def send(self, turn: Turn) -> None:
        await self._slots.acquire()
        self._outstanding[turn.run_id] = tuple(c.call_id for c in turn.calls)
        self._wake.set()
        future = asyncio.get_running_loop().run_in_executor(self._submit, self._enqueue, turn)
        future.add_done_callback(self._submitted)

    def _enqueue(self, turn: Turn) -> None:
        assert self.client is not None
        options: EnqueueOptions = {
            "workflow_name": TURN_WORKFLOW,
            "queue_name": TURN_QUEUE,
            "workflow_id": turn.run_id,
            "app_version": VERSION,
        }
        self.client.enqueue(options, turn.run_id, [(c.call_id, c.arguments) for c in turn.calls])

    def _submitted(self, future: asyncio.Future[None]) -> None:
        self._slots.release()
        if not future.cancelled() and future.exception() is not None:
            self.errors.append(future.exception())  # type: ignore[arg-type]

    def _finished(self, ids: list[str]) -> list[WorkflowStatus]:
        assert self.client is not None
        return self.client.list_workflows(
            workflow_ids=ids, status=TERMINAL, load_input=False, load_output=True
        )

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopping:
            if not self._outstanding:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), 1.0)
                continue
            try:
                done = await loop.run_in_executor(
                    self._poll, self._finished, list(self._outstanding)
                )
            except Exception as e:  # surfaced by check()
                self.errors.append(e)
                return
            for status in done:
                call_ids = self._outstanding.pop(status.workflow_id, None)
                if call_ids is None:
                    continue
                ok = status.status == "SUCCESS" and [tuple(o) for o in status.output or []] == [
                    (c, "ok") for c in call_ids
                ]
                if self.listener is not None:
                    self.listener(status.workflow_id, ok)
            await asyncio.sleep(POLL_S)  # the result poll's interval


# -------------------------------------------------------------------------------- system


@dataclass
class DbosSystem:
    """The private Postgres, DBOS worker processes, and the load target."""

    postgres: PostgresCluster
    url: str
    target: DbosTarget
    processes: ProcessGroup
    """The workers (``worker-N``); Postgres runs under its own user, apart."""
    setup_s: dict[str, float] = field(default_factory=dict)
    """Seconds each set-up step took: initdb (0 when the cluster was reused), postgres start,
    database (create + DBOS migrations), workers ready."""

    def start(self, n: int) -> None:
        argv = [sys.executable, "-m", "bench.dbos_peer", "worker", "--name", f"worker-{n}"]
        env = python_env(BENCH_DBOS_URL=self.url, BENCH_DBOS_POLL_S=str(POLL_S))
        self.processes.start(f"worker-{n}", argv, env)

    def check(self) -> None:
        """Raise (with the log's tail) if Postgres or a worker died, or the client failed."""
        self.target.check()
        self.postgres.check()
        self.processes.check()

    def pids(self) -> dict[str, int]:
        """The postmaster (``postgres``: with the CPU of the backends it has reaped), each of
        its live children (``postgres-<pid>``: backends, WAL writer, checkpointer...) and the
        workers. Every worker opens its whole pool when it starts, so the backends here are
        the ones a measurement that starts now will see working."""
        pids: dict[str, int] = {}
        postmaster = self.postgres.pid()
        if postmaster is not None:
            pids["postgres"] = postmaster
            with contextlib.suppress(psutil.Error):
                for child in psutil.Process(postmaster).children():
                    pids[f"postgres-{child.pid}"] = child.pid
        pids.update(self.processes.pids())
        return pids

    async def set_workers(self, count: int) -> None:
        """Run ``count`` worker processes; wait until every one is ready."""
        self.processes.scale(count, self.start)
        await self.ready()

    async def ready(self, within: float = 120) -> None:
        """Wait until every worker has launched DBOS and its queue threads are polling."""
        began = time.monotonic()
        deadline = began + within
        log = self.processes.log_text
        while not all(READY in log(name) for name in self.processes.workers()):
            self.check()
            if time.monotonic() > deadline:
                raise TimeoutError(f"dbos workers not ready within {within:g} s")
            await asyncio.sleep(0.1)  # polling interval of a deadline-bounded wait
        self.setup_s["workers ready"] = time.monotonic() - began


@asynccontextmanager
async def dbos(ctx: RunContext, workers: int) -> AsyncIterator[DbosSystem]:
    """The private Postgres with a fresh database of this run, and ``workers`` DBOS workers."""
    log_dir = ctx.log_root / "dbos"
    log_dir.mkdir(parents=True, exist_ok=True)
    postgres = PostgresCluster(cluster_dir(ctx.base.state_dir), log_dir / "postgres.log")
    database = f"dbos_{ctx.run_id}"
    url = ""
    system: DbosSystem | None = None
    try:
        await postgres.start()
        began = time.monotonic()
        url = await postgres.create_database(database)
        await asyncio.to_thread(DBOS.migrate, url)
        system = DbosSystem(postgres, url, DbosTarget(url), ProcessGroup("dbos", log_dir))
        system.setup_s.update(postgres.setup_s)
        system.setup_s["database"] = time.monotonic() - began
        await system.target.start()
        for n in range(workers):
            system.start(n)
        await system.ready()
        progress(
            "dbos: "
            + ", ".join(f"{step} {seconds:.2f} s" for step, seconds in system.setup_s.items())
        )
        yield system
    finally:
        try:
            if system is not None:
                try:
                    await system.target.stop()
                finally:
                    system.processes.stop_all()
        finally:
            try:
                if url and postgres.alive():
                    await asyncio.to_thread(postgres.drop_database, database)
            except Exception as e:  # the run's own error matters more
                progress(f"postgres: could not drop database {database}: {e}")
            finally:
                postgres.stop()


def _main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.dbos_peer")
    sub = parser.add_subparsers(dest="command", required=True)
    worker = sub.add_parser("worker", help="run one DBOS worker (configured by BENCH_DBOS_URL)")
    worker.add_argument("--name", required=True, help="executor id, e.g. worker-0")
    args = parser.parse_args(argv)
    if args.command == "worker":
        worker_main(args.name)


if __name__ == "__main__":
    _main()
