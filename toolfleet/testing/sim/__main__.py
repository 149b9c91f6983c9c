"""``python -m toolfleet.testing.sim``: run a campaign of seeds, or replay one seed."""

from __future__ import annotations

import argparse
import os
import sys
import time

from toolfleet.testing.sim._campaign import (
    HASH_SEED,
    Campaign,
    hashing_is_seeded,
    replay_command,
    run,
)
from toolfleet.testing.sim._world import FAULT_KINDS, simulate


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
    began = time.monotonic()

    def progress(campaign: Campaign) -> None:
        if campaign.seeds % 500 == 0:
            print(f"  {campaign.seeds} seeds, {len(campaign.failed)} failed, "
                  f"{time.monotonic() - began:.0f} s", file=sys.stderr, flush=True)  # fmt: skip

    campaign = run(args.first, args.seeds, jobs=args.jobs, faults=faults, progress=progress)
    took = time.monotonic() - began
    print(f"{campaign.seeds} seeds in {took:.0f} s on {args.jobs} processes "
          f"({campaign.steps // max(campaign.seeds, 1)} steps a seed); "
          f"{len(campaign.failed)} failed")  # fmt: skip
    print("faults injected: " + ", ".join(f"{k} {v}" for k, v in sorted(campaign.faults.items())))
    print(f"states reached ({len(campaign.states)}):")
    for state, n in sorted(campaign.states.items()):
        print(f"  {state}: {n}")
    if campaign.gaps:
        print(f"fault kinds never injected (a gap in the generator): {campaign.gaps}")
    for seed, violations in sorted(campaign.failed.items()):
        print(f"seed {seed} failed: {violations[0]}")
        print(f"  replay: {replay_command(seed, faults)}")
    return 0 if not campaign.failed and not campaign.gaps else 1


if __name__ == "__main__":
    sys.exit(main())
