"""Campaigns: many seeds, in parallel processes, with their faults and states summed up.

Every seed is independent and reproducible: ``python -m toolfleet.testing.sim --seed N``
replays seed ``N`` exactly (same faults, same interleaving), under the same fault kinds.
"""

from __future__ import annotations

import gc
import os
import shlex
import sys
from collections import Counter
from collections.abc import Callable, Generator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from toolfleet.testing.sim._world import FAULT_KINDS, Report, simulate

HASH_SEED = "0"
"""Python's string hashing is seeded per process; a replay needs the campaign's seed."""


@dataclass
class Campaign:
    """What a batch of seeds did and found."""

    seeds: int = 0
    failed: dict[int, list[str]] = field(default_factory=dict)
    faults: Counter[str] = field(default_factory=Counter)
    """Faults injected, per kind."""
    states: Counter[str] = field(default_factory=Counter)
    """Protocol states reached (ledger, outcomes, turns, tasks, crash points...)."""
    steps: int = 0

    def add(self, report: Report) -> None:
        """Count one seed's report in."""
        self.seeds += 1
        self.steps += report.steps
        self.faults.update(report.faults)
        self.states.update(report.states)
        if not report.ok:
            self.failed[report.seed] = report.violations

    def merge(self, other: Campaign) -> None:
        """Count another batch's seeds in."""
        self.seeds += other.seeds
        self.steps += other.steps
        self.faults.update(other.faults)
        self.states.update(other.states)
        self.failed.update(other.failed)

    def to_json(self) -> dict[str, Any]:
        """What the batch did, as JSON values (``from_json`` reads it back)."""
        return {
            "seeds": self.seeds,
            "steps": self.steps,
            "faults": dict(sorted(self.faults.items())),
            "states": dict(sorted(self.states.items())),
            "failed": {str(seed): found for seed, found in sorted(self.failed.items())},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], allowed: tuple[str, ...]) -> Campaign:
        """The batch ``to_json`` wrote, allowed the fault kinds ``allowed``."""
        return cls(
            seeds=int(data["seeds"]),
            steps=int(data["steps"]),
            faults=Counter({str(k): int(v) for k, v in data["faults"].items()}),
            states=Counter({str(k): int(v) for k, v in data["states"].items()}),
            failed={int(seed): list(found) for seed, found in data["failed"].items()},
            allowed=allowed,
        )

    @property
    def gaps(self) -> list[str]:
        """Fault kinds allowed but never injected: a hole in the generator, not a pass."""
        return [k for k in self.allowed if not self.faults[k]]

    allowed: tuple[str, ...] = FAULT_KINDS


def replay_command(seed: int, faults: frozenset[str] | None) -> str:
    """The one command that replays ``seed`` exactly."""
    only = "" if faults is None else f" --faults {shlex.quote(','.join(sorted(faults)))}"
    return f"PYTHONHASHSEED={HASH_SEED} python -m toolfleet.testing.sim --seed {seed}{only}"


def _one(args: tuple[int, frozenset[str] | None]) -> Report:
    seed, faults = args
    return simulate(seed, faults=faults)


def _freeze_heap() -> None:
    """Move what the process holds before its first seed (the modules, mostly) out of the
    collector's sight: each seed begins with a full collection (``World.run``), which would
    otherwise walk all of it every time (a tenth of a small seed's cost). Collected first, so
    no garbage is frozen; what is frozen is never collected, and no seed sees a difference."""
    gc.collect()
    gc.freeze()


def allowed(faults: frozenset[str] | None) -> tuple[str, ...]:
    """The fault kinds a campaign under ``faults`` (None: all) may inject."""
    return FAULT_KINDS if faults is None else tuple(sorted(faults))


def run(
    first: int,
    count: int,
    *,
    jobs: int = 1,
    faults: frozenset[str] | None = None,
    progress: Callable[[Campaign], None] | None = None,
) -> Campaign:
    """Simulate seeds ``first`` .. ``first + count - 1`` on ``jobs`` processes (``progress``
    is called after each seed)."""
    campaign = Campaign(allowed=allowed(faults))
    for report in reports(first, count, jobs=jobs, faults=faults):
        campaign.add(report)
        if progress is not None:
            progress(campaign)
    return campaign


def reports(
    first: int, count: int, *, jobs: int = 1, faults: frozenset[str] | None = None
) -> Generator[Report, None, None]:
    """The reports of seeds ``first`` .. ``first + count - 1``, in seed order, simulated on
    ``jobs`` processes. Closing the iterator early cancels the seeds not begun."""
    work = [(seed, faults) for seed in range(first, first + count)]
    if jobs <= 1:
        _freeze_heap()
        for item in work:
            yield _one(item)
        return
    env = os.environ.get("PYTHONHASHSEED")
    os.environ["PYTHONHASHSEED"] = HASH_SEED  # the pool's processes hash as a replay will
    pool = ProcessPoolExecutor(jobs, initializer=_freeze_heap)
    try:
        yield from pool.map(_one, work, chunksize=8)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        if env is None:
            os.environ.pop("PYTHONHASHSEED", None)
        else:
            os.environ["PYTHONHASHSEED"] = env


def hashing_is_seeded() -> bool:
    """Whether this process hashes strings as a campaign's processes do."""
    return os.environ.get("PYTHONHASHSEED") == HASH_SEED or sys.flags.hash_randomization == 0
