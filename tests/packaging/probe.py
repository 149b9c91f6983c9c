"""Run by a fresh virtualenv's Python (not by pytest): what of toolfleet imports there.

Imports every module of toolfleet's top-level packages, then ``toolfleet.agents.FleetRunner``
and the console's application as a user would, and prints one JSON object: the modules that
failed to import (the exception's type, the missing module, the message), what the two public
imports raised, and the distributions installed. Only the standard library and toolfleet are
imported here, so the probe itself needs nothing an extra installs.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import sys
from importlib import metadata
from typing import Any

PACKAGES = ("schemas", "kernel", "planner", "executors", "aggregator", "reconciler", "toolfleet")


def _failure(exc: BaseException) -> dict[str, Any]:
    return {
        "type": type(exc).__name__,
        "missing": getattr(exc, "name", None),
        "message": str(exc),
        "import_error": isinstance(exc, ImportError),
        "toolfleet_error": any(c.__name__ == "ToolfleetError" for c in type(exc).__mro__),
    }


def _modules() -> dict[str, dict[str, Any] | None]:
    """Every module of the packages: None when it imported, else why not (a package that
    fails to import hides its submodules, as it would from a user)."""
    found: dict[str, dict[str, Any] | None] = {}

    def failed(name: str) -> None:
        try:
            importlib.import_module(name)
        except Exception as exc:
            found[name] = _failure(exc)

    for top in PACKAGES:
        package = importlib.import_module(top)
        found[top] = None
        for info in pkgutil.walk_packages(package.__path__, f"{top}.", onerror=failed):
            if info.name in found or info.name.endswith(".__main__"):  # __main__ runs the CLI
                continue
            try:
                importlib.import_module(info.name)
            except Exception as exc:
                found[info.name] = _failure(exc)
            else:
                found[info.name] = None
    return found


def _public(statement: str) -> dict[str, Any] | None:
    try:
        exec(statement, {})
    except Exception as exc:
        return _failure(exc)
    return None


def main() -> None:
    """Print the probe's findings as JSON on stdout."""
    report = {
        "modules": _modules(),
        "fleet_runner": _public("from toolfleet.agents import FleetRunner"),
        "create_app": _public("from toolfleet.app.console import create_app"),
        "mcp_app": _public("from toolfleet.app.mcp import create_app"),
        "distributions": sorted(
            (d.metadata["Name"] or "").lower().replace("_", "-") for d in metadata.distributions()
        ),
        "prefix": sys.prefix,
    }
    json.dump(report, sys.stdout)


if __name__ == "__main__":
    main()
