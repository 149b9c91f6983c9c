"""Every package states its public names, and every public name says what it is."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PACKAGES = ["schemas", "kernel", "planner", "executors", "aggregator", "reconciler", "toolfleet"]


def _packages() -> list[str]:
    found = []
    for top in PACKAGES:
        found.append(top)
        module = importlib.import_module(top)
        for info in pkgutil.walk_packages(module.__path__, prefix=f"{top}."):
            if info.ispkg and not any(p.startswith("_") for p in info.name.split(".")):
                found.append(info.name)
    return found


@pytest.mark.parametrize("name", _packages())
def test_a_package_lists_its_public_names_and_each_has_a_docstring(name: str) -> None:
    package = importlib.import_module(name)
    assert package.__doc__, f"{name} has no docstring"
    exported = getattr(package, "__all__", None)
    assert exported is not None, f"{name}/__init__.py states no __all__"
    for public in exported:
        value = getattr(package, public, None)
        if value is None:  # a submodule named in __all__, imported on demand
            value = importlib.import_module(f"{name}.{public}")
        if inspect.isclass(value) or inspect.isfunction(value) or inspect.ismodule(value):
            assert inspect.getdoc(value), f"{name}.{public} has no docstring"


def test_toolfleet_exports_the_client_the_settings_and_the_errors() -> None:
    import toolfleet
    from kernel import errors

    assert {"FleetClient", "Settings"} <= set(toolfleet.__all__)
    assert set(errors.__all__) <= set(toolfleet.__all__)


def test_the_error_tree_drawn_in_kernel_errors_names_every_error_class() -> None:
    from kernel.errors import ToolfleetError

    for name in PACKAGES:
        for info in pkgutil.walk_packages(importlib.import_module(name).__path__, f"{name}."):
            if not info.name.endswith("__main__"):  # that one runs the command
                importlib.import_module(info.name)
    drawn = inspect.getdoc(importlib.import_module("kernel.errors")) or ""
    classes: list[type] = [ToolfleetError]
    seen: set[type] = set()
    while classes:
        cls = classes.pop()
        seen.add(cls)
        classes.extend(c for c in cls.__subclasses__() if c not in seen)
    public = {c.__name__ for c in seen if not c.__name__.startswith("_")}
    missing = sorted(n for n in public if n not in drawn)
    assert not missing, f"kernel/errors.py's tree does not draw {missing}"
