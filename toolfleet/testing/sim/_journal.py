"""A campaign that survives interruption: its finished seeds, kept in a journal.

A long campaign outlasts a session, and any process may be killed at any moment. With a
journal, ``campaign`` appends each finished chunk of seeds (``CHUNK``: their faults, states,
steps and failed seeds) to a file as one JSON line, flushed and synced to disk before the
next chunk is counted. Run again with the same journal and arguments, it goes on after the
last chunk recorded; a chunk cut short is run again whole. Its summary sums the journal.

The journal's first line names what the seeds ran on, since a seed replays only on the code
that ran it: ``code_digest()`` (the bytes of the fleet's and the simulator's source: every
``.py``, ``.lua``, ``.toml`` and ``.json`` file under their packages, committed or not), the
Python version, the state server's engine (fakeredis, lupa, redis-py), the fault kinds and the
seeds. A later sitting on anything else is refused. Each sitting adds a line of its own (when
it began, on how many processes); each chunk names its sitting and the wall time that sitting
had run when the chunk was written.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import importlib
import importlib.metadata
import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from kernel.errors import UsageError
from toolfleet.testing.sim._campaign import HASH_SEED, Campaign, allowed, reports
from toolfleet.testing.sim._loop import PACKAGES

CHUNK = 100
"""Seeds a journal line records (a kill loses at most the chunk under way)."""

SOURCE_SUFFIXES = (".py", ".lua", ".toml", ".json")
"""The files of the packages that make a seed's run: code, scripts, the state baseline, the
wire schemas."""

ENGINE = ("fakeredis", "lupa", "redis")
"""The packages that run the state server's commands and scripts."""

KIND = "toolfleet simulator campaign"
VERSION = 1


class JournalError(UsageError):
    """A journal cannot be used for this campaign (the message says what to do instead)."""


def code_digest() -> str:
    """SHA-256 over the relative path and bytes of every source file of the fleet's packages
    (``PACKAGES``, the simulator's among them), in path order."""
    digest = hashlib.sha256()
    for root in _package_roots():
        for path in sorted(root.rglob("*")):
            if path.suffix in SOURCE_SUFFIXES and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(root.parent)).encode() + b"\0")
                digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _package_roots() -> list[Path]:
    roots = []
    for name in PACKAGES:
        module = importlib.import_module(name)
        roots += [Path(p) for p in module.__path__]
    return roots


def runs_on() -> dict[str, Any]:
    """What the seeds of this process run on (the journal's header compares it)."""
    return {
        "code": code_digest(),
        "python": platform.python_version(),
        "engine": {name: importlib.metadata.version(name) for name in ENGINE},
        "hash_seed": HASH_SEED,
    }


@dataclass
class Sitting:
    """One run of the command that added to a journal."""

    began: str
    jobs: int
    seeds: int = 0
    wall_s: float = 0.0
    """Wall time from the sitting's start to its last chunk written."""


@dataclass
class Journal:
    """A campaign's journal: the seeds it covers, and what its chunks so far recorded."""

    path: Path
    first: int
    seeds: int
    faults: frozenset[str] | None
    done: Campaign
    """The recorded chunks, summed."""
    sittings: list[Sitting] = field(default_factory=list)
    _file: IO[bytes] | None = None

    @property
    def next_seed(self) -> int:
        """The first seed no chunk recorded."""
        return self.first + self.done.seeds

    @property
    def end(self) -> int:
        """One past the campaign's last seed."""
        return self.first + self.seeds

    @property
    def complete(self) -> bool:
        """Whether every seed of the campaign is recorded."""
        return self.next_seed >= self.end

    @classmethod
    def open(
        cls,
        path: Path,
        *,
        first: int,
        seeds: int,
        faults: frozenset[str] | None,
        on: dict[str, Any] | None = None,
    ) -> Journal:
        """The journal at ``path`` for this campaign, made if there is none; refused
        (``JournalError``) if it was written for other seeds, fault kinds or code (``on``:
        ``runs_on()`` by default). Holds an exclusive lock on it until ``close``."""
        on = runs_on() if on is None else on
        header = {
            "journal": KIND,
            "version": VERSION,
            **on,
            "faults": sorted(allowed(faults)),
            "first": first,
            "seeds": seeds,
        }
        handle = open(path, "ab+")  # noqa: SIM115  (kept open, and locked, until close)
        try:
            _lock(handle, path)
            lines = _read(handle, path)
            if not lines:
                _append(handle, header)
                _sync_directory(path)
                lines = [header]
            journal = cls(path, first, seeds, faults, Campaign(allowed=allowed(faults)))
            journal._check(lines[0], header)
            journal._replay(lines[1:])
        except BaseException:
            handle.close()
            raise
        journal._file = handle
        return journal

    def _check(self, found: dict[str, Any], wanted: dict[str, Any]) -> None:
        if found.get("version") != VERSION or set(found) != set(wanted):
            raise JournalError(
                f"{self.path} is a journal of another version of the simulator (this one writes "
                f"version {VERSION}): give --journal a new file"
            )
        if found["code"] != wanted["code"]:
            raise JournalError(
                f"{self.path} was written by other code (digest {found['code'][:12]}, this "
                f"checkout's is {wanted['code'][:12]}): its seeds would not replay here. Go on "
                "with the code it began with, or start over with a new --journal file"
            )
        for what in ("python", "engine", "hash_seed"):
            if found[what] != wanted[what]:
                raise JournalError(
                    f"{self.path} was written with {what} {found[what]}, this process has "
                    f"{wanted[what]}: go on where it began, or start over with a new --journal"
                )
        if found["faults"] != wanted["faults"]:
            raise JournalError(
                f"{self.path} is a campaign with the fault kinds {','.join(found['faults'])}: "
                "run it with those (--faults), or start over with a new --journal file"
            )
        if (found["first"], found["seeds"]) != (wanted["first"], wanted["seeds"]):
            raise JournalError(
                f"{self.path} is a campaign of {found['seeds']} seeds from seed "
                f"{found['first']}: run it with --first {found['first']} --seeds "
                f"{found['seeds']}, or start over with a new --journal file"
            )

    def _replay(self, lines: list[dict[str, Any]]) -> None:
        """Sum the chunks and sittings recorded so far."""
        for number, line in enumerate(lines, start=2):
            if "sitting" in line and "first" not in line:
                self.sittings.append(Sitting(began=line["began"], jobs=line["jobs"]))
                continue
            if line.get("first") != self.next_seed:
                raise JournalError(
                    f"line {number} of {self.path} records seeds from {line.get('first')}, "
                    f"not {self.next_seed}: the journal is damaged; start over with a new one"
                )
            if not 1 <= line.get("sitting", 0) <= len(self.sittings):
                raise JournalError(
                    f"line {number} of {self.path} names no sitting before it: the journal is "
                    "damaged; start over with a new one"
                )
            self.done.merge(Campaign.from_json(line, self.done.allowed))
            sitting = self.sittings[line["sitting"] - 1]
            sitting.seeds += line["seeds"]
            sitting.wall_s = max(sitting.wall_s, line["wall_s"])

    def begin(self, jobs: int) -> Sitting:
        """Record that a sitting begins."""
        began = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        self._write({"sitting": len(self.sittings) + 1, "began": began, "jobs": jobs})
        self.sittings.append(Sitting(began=began, jobs=jobs))
        return self.sittings[-1]

    def record(self, chunk: Campaign, wall_s: float) -> None:
        """Append the chunk that begins at ``next_seed``, finished ``wall_s`` seconds into
        the current sitting; on disk when this returns."""
        line = {"first": self.next_seed, **chunk.to_json()}
        self._write({**line, "sitting": len(self.sittings), "wall_s": round(wall_s, 1)})
        self.done.merge(chunk)
        self.sittings[-1].seeds += chunk.seeds
        self.sittings[-1].wall_s = wall_s

    def _write(self, line: dict[str, Any]) -> None:
        if self._file is None:
            raise JournalError(f"{self.path} is closed: open it again")
        _append(self._file, line)

    def close(self) -> None:
        """Let go of the file (and its lock)."""
        if self._file is not None:
            self._file.close()
            self._file = None


def campaign(
    journal: Journal,
    *,
    jobs: int = 1,
    chunk: int = CHUNK,
    progress: Callable[[Journal, Campaign], None] | None = None,
) -> Journal:
    """Simulate the seeds of ``journal``'s campaign that it has not recorded, recording them
    chunk by chunk, in a new sitting; returns it closed (``journal.done`` sums all of it).
    ``progress`` is called after each seed with the chunk under way."""
    try:
        if journal.complete:
            return journal
        journal.begin(jobs)
        began = time.monotonic()
        part = Campaign(allowed=journal.done.allowed)
        runs = reports(journal.next_seed, journal.end - journal.next_seed, jobs=jobs,
                       faults=journal.faults)  # fmt: skip
        with contextlib.closing(runs):
            for report in runs:
                part.add(report)
                if progress is not None:
                    progress(journal, part)
                if part.seeds == chunk or report.seed == journal.end - 1:
                    journal.record(part, time.monotonic() - began)
                    part = Campaign(allowed=journal.done.allowed)
    finally:
        journal.close()
    return journal


def _lock(handle: IO[bytes], path: Path) -> None:
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise JournalError(
            f"another campaign is writing {path}: wait for it to end, or stop it first"
        ) from None


def _read(handle: IO[bytes], path: Path) -> list[dict[str, Any]]:
    """The journal's lines. A last line cut short (the process was killed while writing it)
    is cut off the file, its chunk to run again; a file that is not a journal is left as
    it is."""
    handle.seek(0)
    data = handle.read()
    whole = data[: data.rfind(b"\n") + 1]
    if not data.startswith(b'{"journal":' + json.dumps(KIND).encode()):
        if data:
            raise JournalError(
                f"{path} is not a simulator campaign's journal: give --journal a new file"
            )
        return []
    lines = []
    for number, raw in enumerate(whole.splitlines(), start=1):
        try:
            line = json.loads(raw)
        except ValueError:
            line = None
        if not isinstance(line, dict):
            raise JournalError(
                f"line {number} of {path} is not a JSON object: the journal is damaged; start "
                "over with a new --journal file"
            )
        lines.append(line)
    if len(whole) < len(data):
        handle.truncate(len(whole))
        os.fsync(handle.fileno())
    return lines


def _append(handle: IO[bytes], line: dict[str, Any]) -> None:
    handle.write(json.dumps(line, separators=(",", ":")).encode() + b"\n")
    handle.flush()
    os.fsync(handle.fileno())


def _sync_directory(path: Path) -> None:
    """Make the new file's name as durable as its first line."""
    directory = os.open(path.resolve().parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
