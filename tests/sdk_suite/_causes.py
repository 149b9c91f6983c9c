"""Why a test that passes in-process fails on FleetRunner: the committed mapping
(``causes.toml``) from a failure to a known cause, and to the deviation that documents it."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CAUSES = Path(__file__).with_name("causes.toml")


@dataclass(frozen=True)
class Cause:
    """One known cause of failures on FleetRunner.

    ``documented`` names where docs/ documents the deviation (a page and anchor under docs/),
    empty when the cause is a defect or not documented yet. A failure matches the cause when
    it is one of the cause's (its node id listed in ``tests``, alone or with its parameters, or
    it failed at a line listed in ``at``, ``path:line`` of the SDK's test file) and, when the
    cause has ``patterns`` (regular expressions), one is found in its description:
    ``<exception type>: <message>`` and pytest's crash line. A cause with neither matches
    nothing.
    """

    id: str
    title: str
    documented: str = ""
    reason: str = ""
    inexpressible: bool = False
    """The test could not be run on the fleet at all (a tool the fleet cannot serve)."""
    race: bool = False
    """The documented deviation is a matter of timing (which body starts first, a result
    that arrives after the test looks): its tests may pass when run again, and such a test
    still counts under this cause, not as intermittent."""
    patterns: tuple[re.Pattern[str], ...] = ()
    tests: frozenset[str] = field(default_factory=frozenset)
    at: frozenset[str] = field(default_factory=frozenset)

    def matches(self, entry: dict[str, Any]) -> bool:
        """Whether a failing test's record line falls under this cause."""
        nodeid = entry["nodeid"]
        if self.tests or self.at:
            named = nodeid in self.tests or nodeid.partition("[")[0] in self.tests
            if not (named or entry.get("crash_at") in self.at):
                return False
        elif not self.patterns:
            return False
        text = describe(entry)
        return not self.patterns or any(p.search(text) for p in self.patterns)


UNKNOWN = Cause(
    id="unknown",
    title="Not explained yet: no known cause matches the failure",
)
INTERMITTENT = Cause(
    id="intermittent",
    title="Intermittent: failed in the run, passed when run again on a fresh fleet",
    reason=(
        "Still a failure: it depends on timing or on what ran before it on the fleet, a "
        "defect to find (its first failure is listed)."
    ),
)
RESERVED = frozenset({UNKNOWN.id, INTERMITTENT.id})


@dataclass(frozen=True)
class Expectations:
    """The committed floor and the known causes, in the order they are tried."""

    floor: float
    """The lowest share of the in-process passes that must pass on FleetRunner."""
    target: float
    """What issue 35 asks for (the floor rises towards it as failures are fixed)."""
    causes: tuple[Cause, ...]

    def classify(self, entry: dict[str, Any]) -> Cause:
        """The first cause that matches a failing test's line, else ``UNKNOWN``."""
        return next((c for c in self.causes if c.matches(entry)), UNKNOWN)


def describe(entry: dict[str, Any]) -> str:
    """A failure's text as the patterns see it."""
    head = f"{entry.get('exc_type', '')}: {entry.get('exc_message', '')}"
    return f"{head}\n{entry.get('crash', '')}"


def parse(data: dict[str, Any]) -> Expectations:
    """Expectations from the TOML document's data (``causes.toml``'s layout)."""
    causes = []
    seen: set[str] = set()
    for raw in data.get("cause", []):
        if raw["id"] in seen or raw["id"] in RESERVED:
            raise ValueError(f"cause id {raw['id']!r} is used twice (or reserved)")
        seen.add(raw["id"])
        causes.append(
            Cause(
                id=raw["id"],
                title=raw["title"],
                documented=raw.get("documented", ""),
                reason=raw.get("reason", ""),
                inexpressible=bool(raw.get("inexpressible", False)),
                race=bool(raw.get("race", False)),
                patterns=tuple(re.compile(p) for p in raw.get("patterns", ())),
                tests=frozenset(raw.get("tests", ())),
                at=frozenset(raw.get("at", ())),
            )
        )
    return Expectations(
        floor=float(data["floor"]), target=float(data.get("target", 0.95)), causes=tuple(causes)
    )


def load(path: Path = CAUSES) -> Expectations:
    """The committed expectations."""
    with path.open("rb") as source:
        return parse(tomllib.load(source))
