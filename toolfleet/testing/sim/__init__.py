"""A deterministic simulator of the whole fleet: the real services' code under seeded
schedules and faults, with the invariants checked after every seed.

``simulate(seed)`` runs one seed and returns its ``Report``; ``run(first, count, jobs=...)``
runs a campaign; ``python -m toolfleet.testing.sim`` does both from the command line and prints
the command that replays a failing seed. docs/reliability.md explains what is simulated.
"""

from toolfleet.testing.sim._campaign import Campaign, replay_command, run
from toolfleet.testing.sim._world import FAULT_KINDS, Report, simulate

__all__ = ["FAULT_KINDS", "Campaign", "Report", "replay_command", "run", "simulate"]
