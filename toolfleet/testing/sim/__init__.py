"""A deterministic simulator of the whole fleet: the real services' code under seeded
schedules and faults, with the invariants checked after every seed.

``simulate(seed)`` runs one seed and returns its ``Report``; ``run(first, count, jobs=...)``
runs a campaign; ``python -m toolfleet.testing.sim`` does both from the command line and prints
the command that replays a failing seed. docs/reliability.md explains what is simulated.
Needs its state server's engine: ``pip install 'toolfleet[sim]'`` (without it, importing this
package raises ``MissingExtraError``, an ``ImportError`` that says so).
"""

from kernel.errors import MissingExtraError

try:
    import fakeredis  # noqa: F401  (first, so a missing engine is named before any use of it)
    import lupa  # type: ignore[import-untyped]  # noqa: F401  (fakeredis runs Lua with it)
except ModuleNotFoundError as exc:
    raise MissingExtraError(
        "toolfleet.testing.sim (the simulator)", extra="sim", missing=exc.name
    ) from exc

from toolfleet.testing.sim._campaign import Campaign, replay_command, run
from toolfleet.testing.sim._world import FAULT_KINDS, Report, simulate

__all__ = ["FAULT_KINDS", "Campaign", "Report", "replay_command", "run", "simulate"]
