"""The application's run context on the fleet: a copy travels with each batch of calls, and
each call's changes come back and apply to the application's own context object.

In-process a tool is handed the run's context object itself (``RunContextWrapper.context``)
and changes it in place. On the fleet the tool runs in another process: FleetRunner sends a
copy (JSON, ``RunContextCopy``) with the calls it submits together, the worker rebuilds it for
the tool, and sends back what the tool changed (a JSON Patch of the copy). When a call is
answered, its changes are applied to the application's object member by member — a dataclass
or pydantic model field, a dict key, down to the members that changed — so a member no call
changed keeps the application's own value (and its identity). Two calls that change the same
member end as in model order: the later call's value stays, whichever answered first (in-process
whichever wrote last, which concurrent calls on different workers cannot reproduce).

Copied: None, JSON values (str, numbers, bools, lists, dicts) and dataclass or pydantic model
instances whose fields pydantic can write as JSON, up to ``Settings.max_argument_bytes``. A
context that cannot be copied stays with the runner: the tool sees the worker's own
``ToolContext`` instead, and nothing comes back. The run never fails for it.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
from contextvars import ContextVar
from dataclasses import fields, is_dataclass
from typing import Any

from agents.run_internal import tool_execution
from pydantic import BaseModel

from kernel.tools.run_context import (
    apply_json_changes,
    encode_run_context,
    pointer_path,
    rebuild_run_context,
)
from schemas import RunContextCopy

logger = logging.getLogger("toolfleet.agents")

Path = tuple[str, ...]

Order = tuple[int, int]
"""Where a call stands in model order: (its SDK batch of calls, numbered in the order the
batches began in this process; its index among the batch's calls, which are a response's
function calls in model order)."""

_MISSING = object()
_ORDER: ContextVar[Order | None] = ContextVar("toolfleet_call_order", default=None)
_BATCHES = itertools.count(1)


def call_order() -> Order:
    """The model order of the tool call running in this task (set by the SDK's batch of
    function tool calls, see ``install``); a batch of its own when no SDK batch says."""
    return _ORDER.get() or (next(_BATCHES), 0)


def install() -> None:
    """Make each function tool call's task know its index in model order.

    The SDK creates one task per call of a response, in model order, but a call may reach
    the invocation after a later sibling (its approval policy, its hooks awaited): the order
    calls reach the fleet is not model order. The index the SDK's batch executor gives each
    task travels in a context variable its task (and the invocation's task) inherits.
    """
    executor: Any = tool_execution._FunctionToolBatchExecutor
    original = executor._create_tool_task
    if getattr(original, "_toolfleet_order", False):
        return

    @functools.wraps(original)
    def _create_tool_task(self: Any, tool_run: Any, order: int) -> None:
        batch = getattr(self, "_toolfleet_batch", None)
        if batch is None:
            batch = next(_BATCHES)
            self._toolfleet_batch = batch
        token = _ORDER.set((batch, order))
        try:
            original(self, tool_run, order)
        finally:
            _ORDER.reset(token)

    _create_tool_task._toolfleet_order = True  # type: ignore[attr-defined]
    executor._create_tool_task = _create_tool_task


class RunContextSync:
    """One run context object of a run: the copies its calls carry, and each call's changes
    applied to the object when that call is answered, in model order (``call_order``).

    One object serves every batch of the run's calls (and of its nested agent-tool runs,
    which share the context): the calls of one response may reach the fleet in more than one
    batch, and a later response's calls always come later in model order.
    """

    def __init__(self, target: Any, *, limit: int) -> None:
        self.target = target
        self.limit = limit
        self._open: set[Order] = set()
        """Calls sent and not yet settled."""
        self._applied: dict[Order, tuple[list[Path], Any]] = {}
        """Per answered call: the members it changed, and the changed context they are read
        from, kept while an earlier call may still be answered."""

    def batch(self, *, agent: str, tool_input: Any) -> BatchContext:
        """A copy of the context as it is now, for a batch of calls about to be sent."""
        encoded = encode_run_context(self.target)
        if encoded is not None and len(encoded[0].encode()) > self.limit:
            logger.warning(
                "the run context (%s) is %d bytes of JSON, more than max_argument_bytes=%d: "
                "its tools get the worker's ToolContext instead of a copy",
                type(self.target).__name__,
                len(encoded[0].encode()),
                self.limit,
            )
            encoded = None
        value, type_name = encoded if encoded is not None else (None, None)
        copy = RunContextCopy(
            agent=agent,
            value=value,
            type=type_name,
            tool_input=_json_or_none(tool_input, self.limit),
        )
        return BatchContext(self, copy, json.loads(value) if value is not None else _MISSING)

    def _join(self, order: Order) -> None:
        self._open.add(order)

    def _apply(self, order: Order, sent: Any, changes: str) -> None:
        """Apply what the call at ``order`` changed in the copy ``sent``.

        A member a call later in model order already changed keeps that call's value: the
        result is the one applying every call's changes in model order gives.
        """
        if sent is _MISSING or order in self._applied:
            return
        try:
            ops = json.loads(changes)
            if not isinstance(ops, list):
                raise ValueError("a JSON Patch is a list of operations")
            paths = [pointer_path(op.get("path")) for op in ops]
            rebuilt = self._rebuilt(apply_json_changes(sent, ops))
        except (ValueError, TypeError, AttributeError) as exc:
            logger.warning(
                "the run context changes of a call could not be applied (%s): the "
                "application's context keeps its values",
                exc,
            )
            return
        self._applied[order] = (paths, rebuilt)
        for path in paths:
            apply_change(self.target, rebuilt, path)
        for later in sorted(i for i in self._applied if i > order):
            later_paths, later_rebuilt = self._applied[later]
            for path in later_paths:
                if any(overlaps(path, mine) for mine in paths):
                    apply_change(self.target, later_rebuilt, path)

    def _settled(self, orders: list[Order]) -> None:
        """These calls will not be answered any more: forget what no earlier call needs."""
        self._open.difference_update(orders)
        oldest = min(self._open, default=None)
        for done in [i for i in self._applied if oldest is None or i < oldest]:
            del self._applied[done]

    def _rebuilt(self, document: Any) -> Any:
        """The document as the application's context type (its values, for JSON contexts)."""
        target = self.target
        if not (isinstance(target, BaseModel) or is_dataclass(target)):
            return document
        rebuilt = rebuild_run_context(
            RunContextCopy(value=json.dumps(document)), declared=type(target)
        )
        if not isinstance(rebuilt, type(target)):
            raise ValueError(f"the changed context is no longer a valid {type(target).__name__}")
        return rebuilt


class BatchContext:
    """The run context of one batch of calls: the copy they carry, and their changes."""

    def __init__(self, sync: RunContextSync, copy: RunContextCopy, sent: Any) -> None:
        self.sync = sync
        self.copy = copy
        self._sent = sent
        self._calls: dict[str, Order] = {}

    def join(self, call_id: str, order: Order) -> None:
        """A call at ``order`` (``call_order()`` of its task) joins the batch."""
        if call_id not in self._calls:
            self._calls[call_id] = order
            self.sync._join(order)

    def apply(self, call_id: str, changes: str | None) -> None:
        """Apply what the call changed in its copy, as it is answered."""
        order = self._calls.get(call_id)
        if order is not None and changes:
            self.sync._apply(order, self._sent, changes)

    def settled(self) -> None:
        """The batch ended: none of its calls will be answered any more."""
        self.sync._settled(list(self._calls.values()))


def context_sync(syncs: dict[int, RunContextSync], target: Any, *, limit: int) -> RunContextSync:
    """The run's ``RunContextSync`` of the context object ``target`` (kept in ``syncs``, the
    run's, by object identity: the sync holds the object, so its id stays its own)."""
    sync = syncs.get(id(target))
    if sync is None or sync.target is not target:
        sync = syncs[id(target)] = RunContextSync(target, limit=limit)
    return sync


def overlaps(a: Path, b: Path) -> bool:
    """Whether one member path contains the other (or they are the same)."""
    shorter = min(len(a), len(b))
    return a[:shorter] == b[:shorter]


def apply_change(target: Any, source: Any, path: Path) -> None:
    """Make the member of ``target`` at ``path`` what it is in ``source`` (the changed
    context, of the same type), descending as far as both can be walked member by member
    and setting the member whole below that."""
    try:
        if path:
            _apply(target, source, path)
        elif isinstance(target, list) and isinstance(source, list):
            target[:] = source
        elif isinstance(target, dict) and isinstance(source, dict):
            target.clear()
            target.update(source)
        # Any other value (a str, a number) cannot be changed in place: nor in-process.
    except Exception as exc:  # a frozen dataclass, a validating model refusing the value
        logger.warning(
            "a change of the run context at /%s could not be applied (%s: %s)",
            "/".join(path),
            type(exc).__name__,
            exc,
        )


def _apply(node: Any, source: Any, path: Path) -> bool:
    """True once the member at ``path`` is set; False when ``node`` has no such member."""
    key = path[0]
    member = _member(node, key)
    source_member = _member(source, key)
    if member is None or source_member is None:
        return False
    value = _get(source, source_member)
    if value is _MISSING:
        if len(path) == 1 and member[0] == "item":
            node.pop(member[1], None)  # the tool removed the key
        return True
    if len(path) > 1:
        current = _get(node, member)
        if current is not _MISSING and _apply(current, value, path[1:]):
            return True
    if member[0] == "attr":
        setattr(node, member[1], value)
    else:
        node[member[1]] = value
    return True


def _member(node: Any, key: str) -> tuple[str, Any] | None:
    """How ``key`` of the context's JSON is reached in ``node``: an attribute or an item."""
    if isinstance(node, BaseModel):
        for name, info in type(node).model_fields.items():
            if key in (name, info.alias, info.serialization_alias):
                return ("attr", name)
        return None
    if is_dataclass(node) and not isinstance(node, type):
        return ("attr", key) if key in {f.name for f in fields(node)} else None
    if isinstance(node, dict):
        if key not in node:
            # JSON wrote a non-str key (an int, say) as text: the application's own key.
            key = next((k for k in node if not isinstance(k, str) and str(k) == key), key)
        return ("item", key)
    return None


def _get(node: Any, member: tuple[str, Any]) -> Any:
    kind, name = member
    if kind == "attr":
        return getattr(node, name, _MISSING)
    return node.get(name, _MISSING)


def _json_or_none(value: Any, limit: int) -> str | None:
    if value is None:
        return None
    encoded = encode_run_context(value)
    if encoded is None or len(encoded[0].encode()) > limit:
        return None
    return encoded[0]
