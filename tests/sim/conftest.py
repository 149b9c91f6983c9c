"""Fixtures of the simulator's tests."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture
def fleet_module(tmp_path: Path) -> Iterator[Callable[[str], ModuleType]]:
    """Loads a module the test writes under a name inside the fleet's packages (where the
    simulator looks for what modules hold); gone from ``sys.modules`` afterwards."""
    name = f"toolfleet.testing.sim._test_module_{tmp_path.name}"

    def load(source: str) -> ModuleType:
        path = tmp_path / "module.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    yield load
    sys.modules.pop(name, None)
