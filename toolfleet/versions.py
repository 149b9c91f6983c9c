"""How the versions of one tool are ordered: which one is the newest.

Workers (a command without a version runs the newest they serve), the registry in Redis (its
main hash holds the newest live version) and the planner (routing) must agree, so the order
is defined once, here.
"""

from __future__ import annotations

from collections.abc import Iterable


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
