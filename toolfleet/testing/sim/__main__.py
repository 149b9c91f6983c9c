"""``python -m toolfleet.testing.sim``: run a campaign of seeds, or replay one seed."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from toolfleet.testing.sim._campaign import (
    HASH_SEED,
    Campaign,
    hashing_is_seeded,
    replay_command,
    run,
)
from toolfleet.testing.sim._journal import Journal, JournalError, campaign
from toolfleet.testing.sim._world import FAULT_KINDS, simulate

PROGRESS_EVERY = 500
"""Seeds between two progress lines."""


def main(argv: list[str] | None = None) -> int:
    """Run the command line; 0 when every seed held every invariant."""
    parser = argparse.ArgumentParser(prog="python -m toolfleet.testing.sim")
    parser.add_argument("--seed", type=int, help="replay this one seed, with its log")
    parser.add_argument("--seeds", type=int, default=200, help="how many seeds (default 200)")
    parser.add_argument("--first", type=int, default=1, help="the first seed (default 1)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--faults",
        help=f"comma-separated fault kinds (default all: {', '.join(FAULT_KINDS)})",
    )
    parser.add_argument(
        "--journal",
        type=Path,
        help="record each finished chunk of seeds in this file; run again with the same "
        "arguments to go on after the last chunk recorded",
    )
    args = parser.parse_args(argv)
    if not hashing_is_seeded():  # a replay must hash strings as the campaign did
        os.environ["PYTHONHASHSEED"] = HASH_SEED
        os.execv(sys.executable, [sys.executable, "-m", "toolfleet.testing.sim", *sys.argv[1:]])
    faults = None
    if args.faults:
        faults = frozenset(k.strip() for k in args.faults.split(","))
        unknown = faults - set(FAULT_KINDS)
        if unknown:
            parser.error(f"unknown fault kinds {sorted(unknown)}; choose among {FAULT_KINDS}")
    if args.seed is not None:
        report = simulate(args.seed, faults=faults)
        print(f"seed {args.seed}: {'held' if report.ok else 'FAILED'}")
        for violation in report.violations:
            print(f"  violation: {violation}")
        print(f"  faults: {dict(report.faults)}")
        print(f"  steps {report.steps}, virtual {report.virtual_s:.1f} s")
        return 0 if report.ok else 1
    if args.journal is not None:
        try:
            return _journaled(args.journal, args.first, args.seeds, args.jobs, faults)
        except JournalError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    began = time.monotonic()

    def progress(campaign: Campaign) -> None:
        if campaign.seeds % PROGRESS_EVERY == 0:
            print(f"  {campaign.seeds} seeds, {len(campaign.failed)} failed, "
                  f"{time.monotonic() - began:.0f} s", file=sys.stderr, flush=True)  # fmt: skip

    done = run(args.first, args.seeds, jobs=args.jobs, faults=faults, progress=progress)
    took = time.monotonic() - began
    print(f"{done.seeds} seeds in {took:.0f} s on {args.jobs} processes "
          f"({done.steps // max(done.seeds, 1)} steps a seed); "
          f"{len(done.failed)} failed")  # fmt: skip
    return _summary(done, faults)


def _journaled(path: Path, first: int, seeds: int, jobs: int, faults: frozenset[str] | None) -> int:
    journal = Journal.open(path, first=first, seeds=seeds, faults=faults)
    if journal.done.seeds:
        print(f"{path}: {journal.done.seeds} seeds recorded in {len(journal.sittings)} "
              f"sittings; going on from seed {journal.next_seed}",
              file=sys.stderr, flush=True)  # fmt: skip
    began = time.monotonic()

    def progress(journal: Journal, chunk: Campaign) -> None:
        if chunk.seeds and (journal.done.seeds + chunk.seeds) % PROGRESS_EVERY == 0:
            failed = len(journal.done.failed) + len(chunk.failed)
            print(f"  {journal.done.seeds + chunk.seeds} of {journal.seeds} seeds, {failed} "
                  f"failed, {time.monotonic() - began:.0f} s",
                  file=sys.stderr, flush=True)  # fmt: skip

    campaign(journal, jobs=jobs, progress=progress)
    done = journal.done
    print(f"{done.seeds} seeds (from seed {journal.first}) recorded in {path}, in "
          f"{len(journal.sittings)} sittings ({done.steps // max(done.seeds, 1)} steps a "
          f"seed); {len(done.failed)} failed")  # fmt: skip
    for number, sitting in enumerate(journal.sittings, start=1):
        print(f"  sitting {number}, began {sitting.began}: {sitting.seeds} seeds in "
              f"{sitting.wall_s:.0f} s on {sitting.jobs} processes")  # fmt: skip
    return _summary(done, faults)


def _summary(done: Campaign, faults: frozenset[str] | None) -> int:
    """Print what a campaign injected, reached and found; its exit status."""
    print("faults injected: " + ", ".join(f"{k} {v}" for k, v in sorted(done.faults.items())))
    print(f"states reached ({len(done.states)}):")
    for state, n in sorted(done.states.items()):
        print(f"  {state}: {n}")
    if done.gaps:
        print(f"fault kinds never injected (a gap in the generator): {done.gaps}")
    for seed, violations in sorted(done.failed.items()):
        print(f"seed {seed} failed: {violations[0]}")
        print(f"  replay: {replay_command(seed, faults)}")
    return 0 if not done.failed and not done.gaps else 1


if __name__ == "__main__":
    sys.exit(main())
