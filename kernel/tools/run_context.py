"""An agent run's context, copied for the tool of one call, and its changes coming back.

An agent runtime (FleetRunner) sends the run's context with a response's calls as JSON text
(``RunContextCopy``); the worker rebuilds a copy for the call's tool and, after the call, sends
back only what the tool changed in it, as a JSON Patch (RFC 6902: ``replace``, ``add`` and
``remove`` of object members; a list is one value, replaced whole). The runtime applies the
patch to its own context object member by member, so a member no call changed keeps the
application's value and type.

Both sides use this module's codec, so a copy never depends on how one side happens to write
JSON. What can be copied: None, JSON's own values (str, numbers, bools, lists, dicts), and
instances of dataclasses and pydantic models whose fields pydantic can write as JSON. Anything
else (an object holding a client or a lock, say) is not copied.
"""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import is_dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter
from pydantic_core import PydanticSerializationError, to_json

from schemas import RunContextCopy

__all__ = [
    "CarriedRunContext",
    "apply_json_changes",
    "encode_run_context",
    "json_changes",
    "pointer_path",
    "rebuild_run_context",
]

Path = tuple[str, ...]
"""Where a member sits in a JSON document: the object keys from the root down."""

_COPY_ERRORS = (PydanticSerializationError, ValueError, TypeError, RecursionError)


def encode_run_context(value: Any) -> tuple[str, str | None] | None:
    """A run context as JSON text, with ``module:qualname`` of its class when it is a
    dataclass or pydantic model instance; None when it cannot be copied as JSON."""
    try:
        if isinstance(value, BaseModel) or (is_dataclass(value) and not isinstance(value, type)):
            cls = type(value)
            text = _adapter(cls).dump_json(value, by_alias=True).decode()
            return text, f"{cls.__module__}:{cls.__qualname__}"
        if value is None or isinstance(value, str | int | float | bool | list | dict):
            return to_json(value).decode(), None
    except _COPY_ERRORS:
        return None
    except Exception:  # a model's own serializer raising: not copyable either
        return None
    return None


def rebuild_run_context(copy: RunContextCopy, declared: Any = None) -> Any:
    """The copy of a run context a tool is given: as the type the tool ``declared`` for it,
    else as the class the copy names when its module is already imported, else as JSON's
    own values. Call only when ``copy.value`` is set.

    A class is only ever looked up among modules already imported: a message never makes a
    worker import anything.
    """
    text = copy.value or "null"
    recorded = _recorded_class(copy.type)
    candidates = [declared] if _usable(declared) else []
    if recorded is not None:
        subclass = isinstance(declared, type) and issubclass(recorded, declared)
        candidates.insert(0 if subclass or not candidates else 1, recorded)
    for candidate in candidates:
        try:
            return _adapter(candidate).validate_json(text)
        except Exception:  # not as this type: the next one, then JSON's own values
            continue
    return json.loads(text)


def json_changes(before: Any, after: Any, path: Path = ()) -> list[dict[str, Any]]:
    """The JSON Patch (RFC 6902 operations) that makes ``before`` into ``after``: members of
    objects are compared one by one, any other value (a list too) is replaced whole."""
    if isinstance(before, dict) and isinstance(after, dict):
        ops: list[dict[str, Any]] = []
        for key, value in after.items():
            if key not in before:
                ops.append({"op": "add", "path": _pointer((*path, key)), "value": value})
            else:
                ops.extend(json_changes(before[key], value, (*path, key)))
        ops.extend(
            {"op": "remove", "path": _pointer((*path, key))} for key in before if key not in after
        )
        return ops
    if before == after and type(before) is type(after):
        return []
    return [{"op": "replace", "path": _pointer(path), "value": after}]


def apply_json_changes(document: Any, ops: list[dict[str, Any]]) -> Any:
    """``document`` with the operations ``json_changes`` makes applied (a new document; the
    given one is left as it is). Raises ValueError for an operation it cannot apply."""
    result = json.loads(json.dumps(document))
    for op in ops:
        path = pointer_path(op.get("path"))
        kind = op.get("op")
        if kind not in ("add", "replace", "remove"):
            raise ValueError(f"unsupported JSON Patch operation {kind!r}")
        if not path:
            if kind == "remove":
                raise ValueError("a patch cannot remove the whole document")
            result = op.get("value")
            continue
        parent = result
        for key in path[:-1]:
            if not isinstance(parent, dict) or key not in parent:
                raise ValueError(f"no object member at {op.get('path')!r}")
            parent = parent[key]
        if not isinstance(parent, dict):
            raise ValueError(f"no object at {op.get('path')!r}")
        if kind == "remove":
            parent.pop(path[-1], None)
        else:
            parent[path[-1]] = op.get("value")
    return result


def pointer_path(pointer: Any) -> Path:
    """The keys of a JSON Pointer (RFC 6901) ``/a/b~1c`` -> ``("a", "b/c")``."""
    if not isinstance(pointer, str) or (pointer and not pointer.startswith("/")):
        raise ValueError(f"not a JSON Pointer: {pointer!r}")
    if not pointer:
        return ()
    return tuple(p.replace("~1", "/").replace("~0", "~") for p in pointer[1:].split("/"))


def _pointer(path: Path) -> str:
    return "".join("/" + key.replace("~", "~0").replace("/", "~1") for key in path)


class CarriedRunContext:
    """What of the agent run one call carries (its context, its call item's other fields),
    and the context's copy its tool is given: built once per attempt, shared by the tool's
    body, guardrails, approval policy and failure formatter, as one context object is
    in-process."""

    def __init__(self, carried: RunContextCopy | None, item: dict[str, Any] | None = None) -> None:
        self.carried = carried
        self.item = item
        """The call item's other fields (id, status, ...), when the command carried them."""
        self._built = False
        self._copy: Any = None
        self._baseline: Any = None

    @property
    def available(self) -> bool:
        """Whether a copy travelled (the runtime could copy its context)."""
        return self.carried is not None and self.carried.value is not None

    @property
    def agent(self) -> str | None:
        """The name of the agent whose model made the call, if the runtime said."""
        return self.carried.agent if self.carried is not None else None

    def tool_input(self) -> Any:
        """The run's tool input, as JSON's values (None when none travelled)."""
        raw = self.carried.tool_input if self.carried is not None else None
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return None

    def copy(self, declared: Any = None, default: Any = None) -> Any:
        """The tool's copy of the run context (the same object on every call); ``default``
        when no copy travelled or its JSON does not parse."""
        if not self._built and self.available:
            assert self.carried is not None
            try:
                self._copy = rebuild_run_context(self.carried, declared)
            except ValueError:
                self.carried = None  # not JSON: as if nothing had travelled
                return default
            encoded = encode_run_context(self._copy)
            self._baseline = json.loads(encoded[0]) if encoded is not None else None
            self._built = True
        return self._copy if self._built else default

    def changes(self) -> str | None:
        """What the call changed in its copy, as JSON Patch text; None when it changed
        nothing, never built a copy, or left it in a state JSON cannot hold."""
        if not self._built or self._baseline is None:
            return None
        encoded = encode_run_context(self._copy)
        if encoded is None:
            return None
        ops = json_changes(self._baseline, json.loads(encoded[0]))
        return json.dumps(ops, separators=(",", ":")) if ops else None


_T = TypeVar("_T")


@functools.lru_cache(maxsize=256)
def _adapter(cls: type[_T]) -> TypeAdapter[_T]:
    # Building an adapter builds its schema: once per context class, not once per call.
    return TypeAdapter(cls)


def _usable(declared: Any) -> bool:
    """Whether a declared context type says something a copy can be rebuilt as."""
    return (
        declared is not None
        and declared is not Any
        and declared is not object
        and (not isinstance(declared, TypeVar))
    )


def _recorded_class(name: str | None) -> type | None:
    """The dataclass or pydantic model class ``module:qualname`` names, from a module already
    imported (never importing one), or None."""
    if not name or ":" not in name:
        return None
    module_name, qualname = name.split(":", 1)
    found: Any = sys.modules.get(module_name)
    for part in qualname.split("."):
        found = getattr(found, part, None)
        if found is None:
            return None
    if isinstance(found, type) and (issubclass(found, BaseModel) or is_dataclass(found)):
        return found
    return None
