"""Tool versions: how they are ordered, how operators name them, which one new calls go to.

Workers (a command without a version runs the newest they serve), the registry in Redis (its
main hash holds the newest live version), the planner (routing) and the operator commands
must agree, so each rule is defined once, here.

Routing: an operator's pin, else the newest healthy version. No I/O: the caller reads the live
versions (the registry), the pins and the circuits the decision needs (``circuits_to_check``),
and passes them in. Systemic failures are handled by stopping and rolling back: when the
newest version's circuit opens and an earlier live version is healthy, new calls go to that
one (automatic rollback). Calls the failing version already made stay on its circuit's human
task; routing never resolves them.
"""

from __future__ import annotations

from collections.abc import Iterable, Set
from dataclasses import dataclass
from typing import Literal


def _numeric(version: str) -> bool:
    # isdigit alone accepts characters int() refuses, such as "²".
    return version.isascii() and version.isdigit()


def version_order(versions: Iterable[str]) -> list[str]:
    """``versions`` oldest first, each once: numerically when every one is all digits
    ("9" before "10"), else as strings ("1.10" before "1.9", as strings do)."""
    unique = set(versions)
    if all(_numeric(v) for v in unique):
        # "01" and "1" are equal numbers: the string decides, so the order is total.
        return sorted(unique, key=lambda v: (int(v), v))
    return sorted(unique)


def newest_version(versions: Iterable[str]) -> str:
    """The newest of ``versions`` (see ``version_order``); ValueError when there are none."""
    ordered = version_order(versions)
    if not ordered:
        raise ValueError("no versions to choose from")
    return ordered[-1]


def version_ref(tool: str, version: str) -> str:
    """How operators name a tool version: ``NAME@VERSION``."""
    return f"{tool}@{version}"


Route = Literal["pinned", "newest", "rolled_back", "all_open"]
"""Why a version was chosen: an operator's pin; the newest live version (healthy, or
automatic rollback is off); an earlier version because newer ones are failing; or every
live version's circuit is open (the newest is chosen, and its workers refuse the calls)."""


@dataclass(frozen=True)
class VersionChoice:
    """The version new calls of one tool go to, and why."""

    tool: str
    version: str
    route: Route
    passed_over: tuple[str, ...] = ()
    """Newer live versions skipped because their circuits are open, newest first."""
    ignored_pin: str | None = None
    """A pin to a version that is not live: routing went on as if there were none."""

    @property
    def explicit(self) -> bool:
        """Whether commands must name the version. Otherwise a worker runs the newest it
        serves, exactly as before versions were routed: during a rolling deploy, workers
        still on the previous release keep serving what they have."""
        return self.route in ("pinned", "rolled_back")

    def describe(self) -> str:
        """The reason, for operators (``toolfleet tools versions``)."""
        ref = version_ref(self.tool, self.version)
        if self.route == "pinned":
            why = f"{ref}: pinned by an operator"
        elif self.route == "rolled_back":
            failing = ", ".join(version_ref(self.tool, v) for v in self.passed_over)
            why = f"{ref}: automatic rollback, the circuit of {failing} is open"
        elif self.route == "all_open":
            why = f"{ref}: every live version's circuit is open; calls are refused"
        else:
            why = f"{ref}: the newest live version"
        if self.ignored_pin is not None:
            why += f" (the pin to {self.ignored_pin} is ignored: that version is not live)"
        return why


def circuits_to_check(
    tool: str, live: Iterable[str], *, pin: str | None = None, auto_rollback: bool = True
) -> list[str]:
    """The circuit refs ``choose_version`` needs for this tool: none when a live pin, a
    single live version or automatic rollback being off decides alone (most tools, most
    turns: no circuit is read for them)."""
    versions = version_order(live)
    if (pin is not None and pin in versions) or not auto_rollback or len(versions) < 2:
        return []
    return [version_ref(tool, v) for v in versions]


def choose_version(
    tool: str,
    live: Iterable[str],
    open_circuits: Set[str],
    *,
    pin: str | None = None,
    auto_rollback: bool = True,
) -> VersionChoice:
    """The version new calls of ``tool`` go to.

    ``live``: the versions the registry serves; ``open_circuits``: refs (``NAME@VERSION``)
    whose circuit is open (at least those ``circuits_to_check`` names); ``pin``: the
    operator's pin, if any. In order: the pin, if it is live; the newest live version when
    its circuit is closed or automatic rollback is off; the newest earlier version whose
    circuit is closed (automatic rollback); the newest, when every circuit is open.
    """
    newest_first = version_order(live)[::-1]
    if not newest_first:
        raise ValueError(f"tool {tool!r} has no live version to route to")
    if pin is not None and pin in newest_first:
        return VersionChoice(tool, pin, "pinned")
    ignored = pin
    newest = newest_first[0]
    if not auto_rollback:
        return VersionChoice(tool, newest, "newest", ignored_pin=ignored)
    failing: list[str] = []
    for version in newest_first:
        if version_ref(tool, version) not in open_circuits:
            route: Route = "newest" if not failing else "rolled_back"
            return VersionChoice(tool, version, route, tuple(failing), ignored)
        failing.append(version)
    return VersionChoice(tool, newest, "all_open", ignored_pin=ignored)
