"""Each seed begins as it would in a new process.

A campaign runs many seeds in one process, and a failing seed is replayed alone in a new one:
the replay is exact only if nothing a seed leaves behind changes the next. The fleet keeps a
little state per process in module-level objects: the dependency monitor's view of Kafka and
Redis (whose return wakes waiting services), the tool failure log's windows (whose first
failure sets a timer). ``as_new_process`` gives every such object (an instance of a fleet
class held by a module) back the attributes it had before the process's first seed.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from toolfleet.testing.sim._loop import PACKAGES, is_fleet_object

_FIRST: dict[int, tuple[object, dict[str, Any]]] = {}
"""Per object (by id; the object is kept, so the id stays its own): its attributes before
the first seed that saw it."""


@contextmanager
def as_new_process() -> Iterator[None]:
    """While inside, the fleet's module-level objects hold what they held before the
    process's first seed (an object first seen now is taken as it is)."""
    for thing in _module_objects():
        first = _FIRST.get(id(thing))
        if first is None:
            _FIRST[id(thing)] = (thing, _copied(vars(thing)))
        else:
            attributes = vars(thing)
            attributes.clear()
            attributes.update(_copied(first[1]))
    yield


def _module_objects() -> Iterator[object]:
    seen: set[int] = set()
    for name, module in list(sys.modules.items()):
        if module is None or name.split(".")[0] not in PACKAGES:
            continue
        for value in list(vars(module).values()):
            if id(value) not in seen and is_fleet_object(value):
                seen.add(id(value))
                yield value


def _copied(attributes: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of each attribute that has one (a lock has none: it stays the same)."""
    copied = {}
    for name, value in attributes.items():
        try:
            copied[name] = copy.deepcopy(value)
        except TypeError:
            copied[name] = value
    return copied
