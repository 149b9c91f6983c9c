"""Fewer slot groups for the simulated fleet.

A deployment spreads its run keys over ``kernel.stores.keys.SLOT_GROUPS`` (64) slot groups,
and the scans of the reconciler and the stores run one script or command per group. The
simulator's state server is one shard, so the groups buy it nothing, and those scans were
most of a seed's cost. ``slot_groups(n)`` makes the fleet use ``n`` groups while inside.

A module that copied ``SLOT_GROUPS`` or ``GROUP_TAGS`` at import (``from kernel.stores.keys
import SLOT_GROUPS``) holds a copy of its own; a copy left at 64 would scan groups nobody
writes to, or write keys to groups nobody scans. So every copy is found from the source of
the fleet's loaded modules (an import of either name, under any alias), each is swapped for
the duration, and on the way in and out every loaded module is checked to hold the intended
value under each of those names. A module that derives a value from them at import (a
module-level ``range(SLOT_GROUPS)``, a default argument, a class attribute) cannot be swapped
afterwards: ``slot_groups`` refuses to run and names it.
"""

from __future__ import annotations

import ast
import functools
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager

from kernel.errors import ToolfleetError
from kernel.stores import keys

NAMES = frozenset({"SLOT_GROUPS", "GROUP_TAGS"})
"""The names of ``kernel.stores.keys`` that fix how many slot groups there are."""

PACKAGES = ("kernel", "planner", "executors", "aggregator", "reconciler", "toolfleet", "schemas")
"""The fleet's packages: the modules whose copies are swapped and checked."""


class SlotGroupsError(ToolfleetError):
    """The slot groups cannot be changed consistently for a simulation."""


@contextmanager
def slot_groups(count: int) -> Iterator[None]:
    """While inside, the fleet spreads its keys over ``count`` slot groups (the first
    ``count`` of ``GROUP_TAGS``), in ``kernel.stores.keys`` and in every copy of its names."""
    if _inside:
        raise SlotGroupsError("slot_groups is already in effect: it does not nest")
    groups, tags = keys.SLOT_GROUPS, keys.GROUP_TAGS
    if not 1 <= count <= groups:
        raise SlotGroupsError(f"slot groups: choose between 1 and {groups}, not {count}")
    _set(groups, tags, count, tags[:count])
    _inside.append(count)
    try:
        yield
    finally:
        _inside.clear()
        # Modules imported while inside copied the patched values: restored with the rest.
        _set(count, tags[:count], groups, tags)


_inside: list[int] = []


def _set(old_groups: int, old_tags: tuple[str, ...], groups: int, tags: tuple[str, ...]) -> None:
    value: dict[str, object] = {"SLOT_GROUPS": groups, "GROUP_TAGS": tags}
    old: dict[str, object] = {"SLOT_GROUPS": old_groups, "GROUP_TAGS": old_tags}
    swaps = []
    for module, bound in _copies():  # every copy is checked before any is changed
        for alias, name in bound.items():
            if alias not in vars(module):
                continue  # imported inside a function: read when called
            held = vars(module)[alias]
            if held != old[name] and held != value[name]:
                raise SlotGroupsError(
                    f"{module.__name__}.{alias} is {held!r}, neither {old[name]!r} nor "
                    f"{value[name]!r}: the simulator cannot tell which slot groups it means"
                )
            swaps.append((module, alias, value[name]))
    for module, alias, new in swaps:
        setattr(module, alias, new)
    _check(value)


def _check(value: dict[str, object]) -> None:
    """Every loaded module of the fleet holds ``value`` under each copy of the names."""
    stale = [
        f"{module.__name__}.{alias}"
        for module, bound in _copies()
        for alias, name in bound.items()
        if alias in vars(module) and vars(module)[alias] != value[name]
    ]
    if stale:
        raise SlotGroupsError(f"slot groups left unchanged in {stale}: report it as a bug")


def _copies() -> Iterator[tuple[types.ModuleType, dict[str, str]]]:
    """(module, {alias: name}) of every loaded fleet module that binds the names."""
    for name, module in list(sys.modules.items()):
        if module is None or name.split(".")[0] not in PACKAGES:
            continue
        bound = _bindings(name, getattr(module, "__file__", None))
        if bound:
            yield module, bound


@functools.cache
def _bindings(module_name: str, path: str | None) -> dict[str, str]:
    """The aliases under which module ``module_name`` holds the names (``keys`` itself: the
    names); raises if it uses them at import."""
    if path is None or not path.endswith(".py"):
        return {}
    with open(path, encoding="utf-8") as source:
        text = source.read()
    if not any(name in text for name in NAMES):
        return {}
    tree = ast.parse(text, path)
    bound = {n: n for n in NAMES} if module_name == keys.__name__ else {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and _resolve(node, module_name) == keys.__name__:
            bound.update({a.asname or a.name: a.name for a in node.names if a.name in NAMES})
    for line in _read_at_import(tree, frozenset(bound), module_name == keys.__name__):
        raise SlotGroupsError(
            f"{path}:{line} reads SLOT_GROUPS or GROUP_TAGS at import: a value derived from "
            "them there cannot follow the simulator's slot groups; read them inside a function"
        )
    return bound


def _resolve(node: ast.ImportFrom, importer: str) -> str | None:
    if not node.level:
        return node.module
    base = importer.split(".")[: -node.level]
    return ".".join([*base, node.module] if node.module else base)


def _read_at_import(tree: ast.Module, aliases: frozenset[str], is_keys: bool) -> Iterator[int]:
    """Lines where the module reads an alias (or an attribute of the names) at import time:
    outside function bodies, default arguments and decorators included."""
    pending: list[ast.AST] = list(tree.body)
    while pending:
        node = pending.pop()
        if is_keys and isinstance(node, ast.Assign) and _assigns(node, "GROUP_TAGS"):
            continue  # keys derives GROUP_TAGS from SLOT_GROUPS; both are swapped together
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            pending += [*node.decorator_list, *node.args.defaults]
            pending += [d for d in node.args.kw_defaults if d is not None]
            continue
        if isinstance(node, ast.Lambda):
            pending += [*node.args.defaults, *(d for d in node.args.kw_defaults if d)]
            continue
        if isinstance(node, ast.Name | ast.Attribute) and _reads(node, aliases):
            yield node.lineno
        pending += list(ast.iter_child_nodes(node))


def _reads(node: ast.Name | ast.Attribute, aliases: frozenset[str]) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr in NAMES
    return node.id in aliases and isinstance(node.ctx, ast.Load)


def _assigns(node: ast.Assign, name: str) -> bool:
    return any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
