"""The console's history: every turn, approval decision, human task and cancellation of a
tenant, kept for the retention and found by what an operator asks.

Layout. Every key of one tenant carries the tenant's hash tag (``Keys.history``), so on a
Redis Cluster one script writes an entry and its indexes together, and tenants spread over the
shards. An entry is a hash (``e<US>KIND<US>ID``): its summary as JSON (``doc``), the deciders
of its calls (``by``), a task's resolution (``res``), a turn's outputs as the model saw them
(``out``, cut), its member and the indexes it is in. An index is a sorted set of one score
whose members sort by time: ``<13-digit ms><US><kind code><US><id>``, so a page is a
``ZRANGE BYLEX REV`` from a cursor, and a time range is a pair of bounds. There is one index
per kind (every turn of the tenant, every decision...) and one per value of each facet: run,
call id, tool, tool version (``tool@version``), status, a call's status, effect, decider.

A query walks the index with the fewest members in its time range and asks the other indexes
about each member (``lua/history/search.lua``), at most a budget of members per step; the
entries found are read and checked against the whole query (a turn matches call facets only
when one call has them all). Several tenants (an admin's view) are searched each on its own
and merged by time: a page never returns an entry before another tenant's walk has passed
its time, so nothing is skipped or returned twice. Cursors are opaque: (member, tenant).

Writes come from the console's recorder (``toolfleet.app.console``), from the topics:
a redelivered message rewrites the same entry, and a turn's later result (resumed after its
approvals) replaces the earlier one (``seq``) and moves its member. Who decided a call's
approval reaches its turn either way round: the decision marks the run (``d<US>CALL``) and
links the turn the run names for the call (``c<US>CALL``); a turn written later reads the
marks first, under a guard (``put.lua``).

Retention: every entry and index expires ``retention_s`` after its last write, and each write
trims at most ``TRIM_BUDGET`` members older than the retention from each index it touches.
Entries carry a format version of their own (``HISTORY_FORMAT``): the history is new keys,
read by the console alone, and needs no state version.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, cast, get_args

from redis.asyncio import Redis

from kernel.adapters.redis import BoundedCache, text
from kernel.errors import UnavailableError, UsageError
from kernel.rules.limits import cut_text
from kernel.rules.versions import version_ref
from kernel.stores.keys import Keys
from kernel.stores.scripts import script
from schemas import ApprovalDecision, CancelRequest, HumanTask, TaskResolution, TurnResult

HISTORY_FORMAT = 1
"""The format version of the entries this release writes (field ``v``); an entry of a later
format is left out of what is read, and counted."""

Kind = Literal["turn", "decision", "task", "cancellation"]
KINDS: tuple[Kind, ...] = get_args(Kind)
CODES: dict[Kind, str] = {"turn": "T", "decision": "D", "task": "H", "cancellation": "X"}
"""Each kind's code in members and entry keys."""
_KIND_OF = {code: kind for kind, code in CODES.items()}

MS_DIGITS = 13
"""Members start with the entry's time in ms, zero-padded: lexical order is time order."""
_MAX_MS = 9_999_999_999_999

SCAN_BUDGET = 2_000
"""Index members one search looks at per tenant and page, at most."""
MAX_LIMIT = 500
"""Entries one page returns at most."""
TRIM_BUDGET = 16
"""Members older than the retention that one write trims from each index it touches."""
_TENANT_MARK_S = 60.0
"""How often one process notes a tenant's last write in the tenants index."""
_STALE_TRIES = 8

_US, _RS = "\x1f", "\x1e"
_PUT = script("history/put")
_LINK = script("history/link")
_SEARCH = script("history/search")


class InvalidQueryError(UsageError):
    """A history query that cannot be answered as asked (the message says what to change)."""


class InvalidCursorError(InvalidQueryError):
    """A cursor this store never gave out."""


# --- what an entry holds --------------------------------------------------------------------
@dataclass(frozen=True)
class CallFacts:
    """One call of an entry, with the facets it is found by and what else it shows."""

    call_id: str = ""
    tool: str = ""
    version: str = ""
    """The tool version that ran it ('' unknown)."""
    status: str = ""
    effect: str = ""
    decided_by: str = ""
    """Who decided its approval (a turn's call), the decision or the cancellation."""
    details: Mapping[str, Any] = field(default_factory=dict)

    def doc(self) -> dict[str, Any]:
        """The call as the entry's JSON holds it: what is unknown or none is left out (read
        back as null), its decider is kept beside (``by``)."""
        given = {
            "call_id": self.call_id,
            "tool": self.tool,
            "version": self.version,
            "status": self.status,
            "effect": self.effect,
            **self.details,
        }
        return {k: v for k, v in given.items() if v is not None and v != ""}


@dataclass(frozen=True)
class NewEntry:
    """An entry to write (``History.put``)."""

    kind: Kind
    tenant_id: str
    ident: str
    """Its id within its kind and tenant (``turn_ident``, ``decision_ident``, ...)."""
    at: float
    """When it happened (Unix time): its place in every index."""
    status: str
    run_id: str | None = None
    calls: tuple[CallFacts, ...] = ()
    details: Mapping[str, Any] = field(default_factory=dict)
    outputs: Mapping[str, str] | None = None
    """A turn's outputs by call id, as the model saw them (cut)."""
    seq: str = ""
    """Orders writes of one entry: a write with a lower seq than the entry's is ignored ('':
    from ``at``). The recorder gives the Kafka record's timestamp and offset."""

    @property
    def member(self) -> str:
        """Its member in every index."""
        return member_of(self.at, self.kind, self.ident)

    def doc(self) -> dict[str, Any]:
        """Its JSON summary, as stored: its tenant and kind are in its key, what is none is
        left out (``HistoryEntry`` gives them all back)."""
        given = {"run_id": self.run_id, "at": self.at, "status": self.status, **self.details}
        found = {k: v for k, v in given.items() if v is not None}
        return found | {"calls": [c.doc() for c in self.calls]}

    def indexes(self) -> list[tuple[str, str]]:
        """The (facet, value) of every index it belongs to."""
        return facets_of(self.kind, self.run_id, self.status, self.calls)


def facets_of(
    kind: Kind, run_id: str | None, status: str, calls: Iterable[CallFacts]
) -> list[tuple[str, str]]:
    """The (facet, value) of every index an entry with these facts belongs to: its kind, run
    and status, and each call's id, tool, tool version, status, effect and decider."""
    found: list[tuple[str, str]] = [("kind", kind)]
    if run_id:
        found.append(("run", run_id))
    if status:
        found.append(("status", status))
    for c in calls:
        found += [
            (facet, value)
            for facet, value in (
                ("call", c.call_id),
                ("tool", c.tool),
                ("version", version_ref(c.tool, c.version) if c.tool and c.version else ""),
                ("call_status", c.status),
                ("effect", c.effect),
                ("decider", c.decided_by),
            )
            if value
        ]
    return list(dict.fromkeys(found))


def turn_ident(run_id: str, turn_id: int) -> str:
    """A turn's id among the tenant's entries."""
    return f"{run_id}{_US}{turn_id}"


def decision_ident(run_id: str, call_id: str) -> str:
    """An approval decision's id: its call's (the latest decision on a call is kept)."""
    return f"{run_id}{_US}{call_id}"


def cancellation_ident(run_id: str, call_id: str | None) -> str:
    """A cancellation's id: the run's, or one call's."""
    return f"{run_id}{_US}{call_id or ''}"


def member_of(at: float, kind: Kind, ident: str) -> str:
    """An entry's index member: its time in ms, zero-padded, its kind's code, its id."""
    ms = min(max(int(at * 1000), 0), _MAX_MS)
    return f"{ms:0{MS_DIGITS}d}{_US}{CODES[kind]}{_US}{ident}"


def seq_of(timestamp_ms: int, offset: int) -> str:
    """A write's order from its Kafka record (timestamp, then offset), as fixed-width text."""
    return f"{max(timestamp_ms, 0):0{MS_DIGITS}d}{max(offset, 0):020d}"


def _error_json(error: Any, max_bytes: int = 500) -> dict[str, Any] | None:
    if error is None:
        return None
    found = {"type": error.type, "message": cut_text(error.message, max_bytes)}
    call_id = getattr(error, "call_id", None)
    return found | {"call_id": call_id} if call_id is not None else found


def turn_entry(
    result: TurnResult,
    *,
    at: float,
    seq: str = "",
    versions: Mapping[str, str] | None = None,
    traces: Mapping[str, str] | None = None,
    output_max_bytes: int = 1_024,
) -> NewEntry:
    """A turn result as its history entry: each call's status, effect, attempts, times, error,
    tool version and trace (``versions``, ``traces``: from the ledger, by call id), the calls
    waiting for approval (``pending_approval``), and the outputs cut to
    ``output_max_bytes``."""
    versions, traces = versions or {}, traces or {}
    calls = [
        CallFacts(
            call_id=c.call_id,
            tool=c.tool_name,
            version=versions.get(c.call_id, ""),
            status=c.status,
            effect=c.effect,
            details={
                "attempts": c.attempts,
                "started_at": c.started_at,
                "finished_at": c.finished_at,
                "error": _error_json(c.error),
                "trace_id": traces.get(c.call_id),
            },
        )
        for c in result.calls
    ]
    settled = {c.call_id for c in result.calls}
    calls += [
        CallFacts(
            call_id=i.call_id,
            tool=i.tool_name,
            version=versions.get(i.call_id, ""),
            status="pending_approval",
            effect="not_executed",
            details={"attempts": 0, "reason": i.reason, "trace_id": traces.get(i.call_id)},
        )
        for i in result.interruptions
        if i.call_id not in settled
    ]
    started = [c.started_at for c in result.calls if c.started_at is not None]
    finished = [c.finished_at for c in result.calls if c.finished_at is not None]
    outputs = {
        o.call_id: cut_text(o.output, output_max_bytes) if output_max_bytes else ""
        for o in result.outputs
    }
    return NewEntry(
        kind="turn",
        tenant_id=result.tenant_id,
        ident=turn_ident(result.run_id, result.turn_id),
        at=at,
        status=result.status,
        run_id=result.run_id,
        calls=tuple(calls),
        details={
            "turn_id": result.turn_id,
            "started_at": min(started, default=None),
            "finished_at": max(finished, default=None),
            "error": _error_json(result.error),
        },
        outputs=outputs,
        seq=seq,
    )


def decision_entry(decision: ApprovalDecision, *, at: float, seq: str = "") -> NewEntry:
    """An approval decision as its history entry (status ``approved`` or ``rejected``)."""
    return NewEntry(
        kind="decision",
        tenant_id=decision.tenant_id,
        ident=decision_ident(decision.run_id, decision.call_id),
        at=at,
        status="approved" if decision.approve else "rejected",
        run_id=decision.run_id,
        calls=(
            CallFacts(
                call_id=decision.call_id, tool=decision.tool_name, decided_by=decision.decided_by
            ),
        ),
        details={
            "approve": decision.approve,
            "message": None if decision.message is None else cut_text(decision.message, 500),
            "sticky": decision.sticky,
            "by_policy": decision.by_policy,
        },
        seq=seq,
    )


def task_entry(task: HumanTask) -> NewEntry:
    """A human task as its history entry (status ``open`` until its resolution links it)."""
    return NewEntry(
        kind="task",
        tenant_id=task.tenant_id,
        ident=task.task_id,
        at=task.created_at,
        status="open",
        run_id=task.run_id,
        calls=(
            CallFacts(
                call_id=task.call_id or "", tool=task.tool_name, version=task.tool_version or ""
            ),
        ),
        details={
            "task_id": task.task_id,
            "task_kind": task.kind,
            "turn_id": task.turn_id,
            "reason": cut_text(task.reason, 2_000),
            "task_calls": task.calls[:50],
            "task_calls_total": len(task.calls),
        },
    )


def cancellation_entry(cancel: CancelRequest, *, at: float, seq: str = "") -> NewEntry:
    """A cancellation (of a run, or of one call) as its history entry."""
    return NewEntry(
        kind="cancellation",
        tenant_id=cancel.tenant_id,
        ident=cancellation_ident(cancel.run_id, cancel.call_id),
        at=at,
        status="cancelled",
        run_id=cancel.run_id,
        calls=(CallFacts(call_id=cancel.call_id or "", decided_by=cancel.decided_by or ""),),
        details={"reason": cut_text(cancel.reason, 500), "whole_run": cancel.call_id is None},
        seq=seq,
    )


@dataclass(frozen=True)
class HistoryEntry:
    """An entry as read: its summary (``doc``, each call with ``decided_by``), a task's
    resolution, a turn's outputs (when asked for)."""

    tenant_id: str
    kind: Kind
    member: str
    doc: dict[str, Any]
    resolution: dict[str, Any] | None = None
    outputs: dict[str, str] | None = None

    @property
    def at(self) -> float:
        """When it happened (Unix time)."""
        return float(self.doc.get("at") or 0.0)

    @property
    def run_id(self) -> str | None:
        """Its run (None: a task of no run, a circuit's)."""
        run = self.doc.get("run_id")
        return run if isinstance(run, str) else None

    @property
    def status(self) -> str:
        """Its status: a turn's, a decision's verdict, a task's state."""
        return str(self.doc.get("status") or "")

    @property
    def calls(self) -> list[dict[str, Any]]:
        """Its calls, each with its facets and details."""
        calls = self.doc.get("calls")
        return calls if isinstance(calls, list) else []

    @property
    def position(self) -> Cursor:
        """Where a page that ends with it goes on from."""
        return Cursor(self.member, self.tenant_id)


_DEFAULTS: dict[Kind, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "turn": (
        ("turn_id", "started_at", "finished_at", "error"),
        ("version", "attempts", "started_at", "finished_at", "error", "trace_id", "reason"),
    ),
    "decision": (("message", "sticky", "by_policy"), ("version",)),
    "task": (("turn_id", "task_calls"), ("call_id", "version")),
    "cancellation": ((), ()),
}
"""The fields an entry leaves out when they are none, given back as null when read."""
_CALL_KEYS = ("call_id", "tool", "status", "effect")


def _decode_entry(
    tenant_id: str, kind: Kind, member: str, raw: Sequence[bytes | str | None], *, outputs: bool
) -> HistoryEntry | None:
    """An entry from HMGET v doc by res [out]; None when it expired, or is of a later
    format."""
    version, doc_raw, by_raw, res_raw = raw[:4]
    if doc_raw is None:
        return None
    written_as = text(version) if version is not None else "1"
    if not written_as.isdigit() or int(written_as) > HISTORY_FORMAT:
        return None
    doc = {"kind": kind, "tenant_id": tenant_id, "run_id": None} | json.loads(doc_raw)
    top, per_call = _DEFAULTS[kind]
    for name in top:
        doc.setdefault(name, None)
    deciders = _deciders(text(by_raw) if by_raw else "")
    resolution = json.loads(res_raw) if res_raw else None
    if resolution is not None:
        doc["status"] = "resolved"
        doc["resolution"] = resolution.get("resolution")
        doc["note"] = resolution.get("note")
        doc["resolved_at"] = resolution.get("at")
    for call in doc.get("calls") or []:
        for name in (*_CALL_KEYS, *per_call):
            call.setdefault(name, None)
        if resolution is not None:
            call["decided_by"] = resolution.get("decided_by") or None
        else:
            call["decided_by"] = deciders.get(call.get("call_id") or "")
    out = None
    if outputs and len(raw) > 4:
        out = json.loads(raw[4]) if raw[4] else {}
    return HistoryEntry(tenant_id, kind, member, doc, resolution, out)


def _kind_of(member: str) -> Kind | None:
    parts = member.split(_US, 2)
    return _KIND_OF.get(parts[1]) if len(parts) == 3 else None


def _stored_facets(entry: HistoryEntry) -> list[tuple[str, str]]:
    """The indexes a stored entry is in: what its write and its links put it in."""
    calls = [
        CallFacts(
            call_id=c.get("call_id") or "",
            tool=c.get("tool") or "",
            version=c.get("version") or "",
            status=c.get("status") or "",
            effect=c.get("effect") or "",
            decided_by=c.get("decided_by") or "",
        )
        for c in entry.calls
    ]
    return facets_of(entry.kind, entry.run_id, entry.status, calls)


def _deciders(by: str) -> dict[str, str]:
    lines = (line.partition(_US) for line in by.split(_RS) if line)
    return {call: decider for call, _, decider in lines}


# --- queries --------------------------------------------------------------------------------
@dataclass(frozen=True, order=True)
class Cursor:
    """A position in the merged order of every tenant's entries, newest first: (member,
    tenant), compared as a pair. A page goes on strictly after its cursor."""

    member: str
    tenant: str

    def encode(self) -> str:
        """The opaque text a client sends back."""
        raw = json.dumps([1, self.member, self.tenant], separators=(",", ":"))
        return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")

    @classmethod
    def decode(cls, cursor: str) -> Cursor:
        """The cursor ``encode`` gave; InvalidCursorError for anything else."""
        try:
            raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
            version, member, tenant = json.loads(raw)
        except (binascii.Error, ValueError, TypeError, UnicodeDecodeError):
            raise InvalidCursorError(
                f"invalid history cursor {cursor[:80]!r}: pass the cursor a page returned, "
                "unchanged"
            ) from None
        if version != 1 or not isinstance(member, str) or not isinstance(tenant, str):
            raise InvalidCursorError(f"invalid history cursor {cursor[:80]!r}")
        stamp, _, rest = member.partition(_US)
        if len(stamp) != MS_DIGITS or not stamp.isdigit() or not rest:
            raise InvalidCursorError(f"invalid history cursor {cursor[:80]!r}")
        return cls(member, tenant)

    def upper_bound(self, tenant: str) -> str:
        """Where ``tenant``'s walk starts after this cursor: its members below the cursor's,
        and the cursor's member itself for a tenant that sorts before the cursor's."""
        return ("[" if tenant < self.tenant else "(") + self.member


CALL_FACETS = ("call", "tool", "version", "call_status", "effect", "decider")
"""Facets of a call: a turn matches them when one of its calls has them all."""
_DOC_FIELD = {
    "call": "call_id",
    "tool": "tool",
    "version": "version",
    "call_status": "status",
    "effect": "effect",
    "decider": "decided_by",
}


@dataclass(frozen=True)
class Query:
    """What to find: entries of one kind, every given facet matching, in a time range."""

    kind: Kind = "turn"
    run: str | None = None
    call: str | None = None
    tool: str | None = None
    version: str | None = None
    """The tool's version: with ``tool``, or as ``tool@version``."""
    status: str | None = None
    """A turn's status, a decision's ``approved`` / ``rejected``, a task's ``open`` /
    ``resolved``, ``cancelled``."""
    call_status: str | None = None
    effect: str | None = None
    decider: str | None = None
    since: float | None = None
    until: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidQueryError(f"kind must be one of {', '.join(KINDS)}, not {self.kind!r}")
        if self.version and not self.tool:
            tool, sep, version = self.version.rpartition("@")
            if not sep or not tool or not version:
                raise InvalidQueryError(
                    "a tool version is searched with its tool: give tool=NAME too, or "
                    "version=NAME@VERSION"
                )
            object.__setattr__(self, "tool", tool)
            object.__setattr__(self, "version", version)
        if self.since is not None and self.until is not None and self.since > self.until:
            raise InvalidQueryError("since is after until: swap them")

    def facets(self) -> list[tuple[str, str]]:
        """The (facet, value) of every index the query asks (its kind's first)."""
        version = version_ref(self.tool, self.version) if self.tool and self.version else None
        asked = [
            ("kind", self.kind),
            ("run", self.run),
            ("status", self.status),
            ("call", self.call),
            ("tool", self.tool),
            ("version", version),
            ("call_status", self.call_status),
            ("effect", self.effect),
            ("decider", self.decider),
        ]
        return [(facet, value) for facet, value in asked if value]

    def call_facets(self) -> dict[str, str]:
        """The call facets asked, by their field in an entry's calls."""
        given = {
            "call": self.call,
            "tool": self.tool,
            "version": self.version,
            "call_status": self.call_status,
            "effect": self.effect,
            "decider": self.decider,
        }
        return {_DOC_FIELD[facet]: value for facet, value in given.items() if value}

    def matches(self, entry: HistoryEntry) -> bool:
        """Whether ``entry`` is one the query asks for (the indexes only narrow the search:
        this is the answer)."""
        if entry.kind != self.kind:
            return False
        if self.run is not None and entry.run_id != self.run:
            return False
        if self.status is not None and entry.status != self.status:
            return False
        ms = int(entry.member[:MS_DIGITS])
        if self.since is not None and ms < _ms(self.since):
            return False
        if self.until is not None and ms > _ms(self.until):
            return False
        wanted = self.call_facets()
        if not wanted:
            return True
        return any(all(call.get(k) == v for k, v in wanted.items()) for call in entry.calls)

    def upper(self, cursor: Cursor | None, tenant: str) -> str:
        """The upper bound of ``tenant``'s walk: after the cursor, at most ``until``."""
        bounds = []
        if self.until is not None:
            bounds.append("(" + f"{_ms(self.until) + 1:0{MS_DIGITS}d}")
        if cursor is not None:
            bounds.append(cursor.upper_bound(tenant))
        if not bounds:
            return "+"
        return min(bounds, key=lambda b: (b[1:], b[0] == "["))

    def lower(self) -> str:
        """The lower bound of every walk: ``since``, or the first member."""
        return "-" if self.since is None else "[" + f"{_ms(self.since):0{MS_DIGITS}d}"


def _ms(at: float) -> int:
    return min(max(int(at * 1000), 0), _MAX_MS)


@dataclass(frozen=True)
class TenantScan:
    """What one tenant's walk found: its matches (newest first), the last member it looked
    at, whether it reached the end of its range."""

    tenant: str
    hits: list[HistoryEntry]
    last: str | None
    done: bool
    looked: int = 0


@dataclass(frozen=True)
class Page:
    """One page of a query: entries newest first, the cursor of the next page (None: there is
    none), how many index members were looked at, entries left out for a later format."""

    entries: list[HistoryEntry]
    cursor: Cursor | None
    looked: int = 0
    unreadable: int = 0


def merge(scans: Sequence[TenantScan], limit: int) -> tuple[list[HistoryEntry], Cursor | None]:
    """The page of ``limit`` entries that several tenants' walks give, and its cursor.

    A walk that has not reached its end (its budget or ``limit`` stopped it) may hold entries
    newer than another walk's last ones: only entries at or above the lowest point every such
    walk has passed (the horizon: the highest of their last positions) are sure to be in
    order. The page is those, newest first; its cursor is its last entry when more are
    sure, else the horizon, where every walk goes on next time."""
    open_walks = [Cursor(s.last, s.tenant) for s in scans if not s.done and s.last is not None]
    horizon = max(open_walks, default=None)
    found = sorted((e for s in scans for e in s.hits), key=lambda e: e.position, reverse=True)
    sure = [e for e in found if horizon is None or e.position >= horizon]
    if len(sure) > limit:
        return sure[:limit], sure[limit - 1].position
    return sure, horizon


# --- the store ------------------------------------------------------------------------------
Written = Literal["written", "older"]


@dataclass(frozen=True)
class RunPage:
    """A run's entries oldest first (its turns, decisions, tasks, cancellations), and where
    the next page starts (None: this was the last)."""

    entries: list[HistoryEntry]
    cursor: Cursor | None


@dataclass(frozen=True)
class _Prior:
    """An entry as a write read it: what the write checks is unchanged (its seq, deciders and
    resolution), and the indexes it is in."""

    seq: str = ""
    by: str = ""
    res: str = ""
    facets: tuple[tuple[str, str], ...] = ()


_PRIOR_FIELDS = ("v", "doc", "by", "res", "seq", "m")
_FACET_CODES = {
    "kind": "k",
    "run": "r",
    "status": "s",
    "call": "c",
    "tool": "t",
    "version": "v",
    "call_status": "cs",
    "effect": "e",
    "decider": "d",
}
"""Each facet's code in its indexes' keys (keys are stored once per index; short is cheap)."""


class History:
    """The history of every tenant, over one Redis connection."""

    def __init__(self, redis: Redis, keys: Keys, *, retention_s: int) -> None:
        if retention_s <= 0:
            raise UsageError("the history's retention must be positive (history_retention_s)")
        self.redis = redis
        self.keys = keys
        self.retention_s = retention_s
        self._put = _PUT.register(redis)
        self._link = _LINK.register(redis)
        self._search = _SEARCH.register(redis)
        self._marked: BoundedCache[str, float] = BoundedCache(10_000)

    # --- keys -------------------------------------------------------------------------------
    def _entry_key(self, tenant_id: str, kind: Kind, ident: str) -> str:
        return self.keys.history(tenant_id, f"e{_US}{CODES[kind]}{_US}{ident}")

    def _entry_key_of(self, tenant_id: str, member: str) -> str:
        # member: <ms> US <code> US <ident>; the entry's key: e US <code> US <ident>
        return self.keys.history(tenant_id, "e" + member[MS_DIGITS:])

    def _index(self, tenant_id: str, facet: str, value: str) -> str:
        return self.keys.history(tenant_id, f"i{_US}{_FACET_CODES[facet]}{_US}{value}")

    def _marks(self, tenant_id: str, run_id: str) -> str:
        return self.keys.history(tenant_id, f"r{_US}{run_id}")

    def _cutoff(self) -> str:
        return f"{_ms(time.time() - self.retention_s):0{MS_DIGITS}d}"

    # --- writing ----------------------------------------------------------------------------
    async def put(self, entry: NewEntry) -> Written:
        """Write ``entry`` and index it (again, the same, for a redelivered message; a later
        ``seq`` replaces it). A turn takes its calls' deciders from its run's marks; a
        decision marks its run and links its call's turn; a task takes the resolution that
        came before it, if any."""
        for _ in range(_STALE_TRIES):
            if entry.kind == "turn" and entry.run_id:
                verdict = await self._put_turn(entry)
            elif entry.kind == "task":
                verdict = await self._put_task(entry)
            elif entry.kind == "decision" and entry.run_id and entry.calls:
                verdict = await self._put_decision(entry)
            else:
                key = self._entry_key_for(entry)
                verdict = await self._write(entry, key, await self._prior(entry, key), [], [])
            if verdict != "stale":
                await self._mark_tenant(entry.tenant_id)
                return verdict
        raise UnavailableError(
            f"history: {entry.kind} {entry.ident!r} of {entry.tenant_id} kept changing while "
            "it was written; retry"
        )

    def _entry_key_for(self, entry: NewEntry) -> str:
        return self._entry_key(entry.tenant_id, entry.kind, entry.ident)

    async def _prior(self, entry: NewEntry, key: str) -> _Prior:
        return self._prior_of(entry, await self.redis.hmget(key, _PRIOR_FIELDS))

    def _prior_of(self, entry: NewEntry, raw: Sequence[bytes | str | None]) -> _Prior:
        values = [text(v) if v is not None else "" for v in raw]
        if not values[1]:  # no entry yet (or fields a link keeps for it)
            return _Prior(by=values[2], res=values[3])
        stored = _decode_entry(entry.tenant_id, entry.kind, values[5], raw[:4], outputs=False)
        facets = tuple(_stored_facets(stored)) if stored is not None else ()
        return _Prior(values[4], values[2], values[3], facets)

    async def _put_turn(self, entry: NewEntry) -> Written | Literal["stale"]:
        assert entry.run_id is not None
        marks = self._marks(entry.tenant_id, entry.run_id)
        key = self._entry_key_for(entry)
        calls = list(dict.fromkeys(c.call_id for c in entry.calls if c.call_id))
        async with self.redis.pipeline(transaction=False) as pipe:  # one tenant: one slot
            pipe.hmget(key, _PRIOR_FIELDS)
            if calls:
                pipe.hmget(marks, [f"d{_US}{c}" for c in calls])
            replies = await pipe.execute()
        prior = self._prior_of(entry, replies[0])
        read = replies[1] if calls else []
        deciders = {c: text(v) for c, v in zip(calls, read, strict=True) if v}
        facts = tuple(replace(c, decided_by=deciders.get(c.call_id, "")) for c in entry.calls)
        guards = [(f"d{_US}{c}", deciders.get(c, "")) for c in calls]
        linked = [(f"c{_US}{c}", entry.ident) for c in calls]
        return await self._write(replace(entry, calls=facts), marks, prior, guards, linked)

    async def _put_decision(self, entry: NewEntry) -> Written | Literal["stale"]:
        assert entry.run_id is not None
        call = entry.calls[0]
        marks = self._marks(entry.tenant_id, entry.run_id)
        prior = await self._prior(entry, self._entry_key_for(entry))
        mark = [(f"d{_US}{call.call_id}", call.decided_by)]
        verdict = await self._write(entry, marks, prior, [], mark)
        if verdict != "written":
            return verdict
        turn = await self.redis.hget(marks, f"c{_US}{call.call_id}")
        if turn is not None and call.decided_by:
            await self.link(
                entry.tenant_id,
                "turn",
                text(turn),
                add=[("decider", call.decided_by)],
                decider=(call.call_id, call.decided_by),
            )
        return verdict

    async def _put_task(self, entry: NewEntry) -> Written | Literal["stale"]:
        key = self._entry_key_for(entry)
        prior = await self._prior(entry, key)
        shown = entry
        if prior.res:
            by = str(json.loads(prior.res).get("decided_by") or "")
            calls = tuple(replace(c, decided_by=by) for c in entry.calls)
            shown = replace(entry, status="resolved", calls=calls)
        return await self._write(shown, key, prior, [], [])

    async def resolve_task(self, resolution: TaskResolution, *, at: float) -> str:
        """Note a human task's resolution on its entry (kept for the task's entry if it has
        not been written yet): 'linked' or 'missing'."""
        fields = {
            "resolution": resolution.resolution,
            "decided_by": resolution.decided_by,
            "note": None if resolution.note is None else cut_text(resolution.note, 500),
            "at": at,
        }
        verdict = await self.link(
            resolution.tenant_id,
            "task",
            resolution.task_id,
            add=[("decider", resolution.decided_by), ("status", "resolved")],
            remove=[("status", "open")],
            fields={"res": json.dumps(fields, separators=(",", ":"))},
        )
        await self._mark_tenant(resolution.tenant_id)
        return verdict

    async def link(
        self,
        tenant_id: str,
        kind: Kind,
        ident: str,
        *,
        add: Iterable[tuple[str, str]] = (),
        remove: Iterable[tuple[str, str]] = (),
        decider: tuple[str, str] | None = None,
        fields: Mapping[str, str] | None = None,
    ) -> str:
        """Add an entry to the indexes ``add``, take it out of ``remove``, note a call's
        ``decider`` (call id, name) and set ``fields``: 'linked', or 'missing' when the entry
        has not been written (the fields are kept for it)."""
        added = [self._index(tenant_id, f, v) for f, v in add]
        removed = [self._index(tenant_id, f, v) for f, v in remove]
        call, by = decider or ("", "")
        args: list[str | int] = [
            self.retention_s * 1000, self._cutoff(), TRIM_BUDGET, len(added), call, by
        ]  # fmt: skip
        for name, value in (fields or {}).items():
            args += [name, value]
        reply = await self._link(
            keys=[self._entry_key(tenant_id, kind, ident), *added, *removed], args=args
        )
        return text(reply)

    async def _write(
        self,
        entry: NewEntry,
        marks_on: str,
        prior: _Prior,
        guards: Sequence[tuple[str, str]],
        marks: Sequence[tuple[str, str]],
    ) -> Written | Literal["stale"]:
        indexes = [self._index(entry.tenant_id, f, v) for f, v in entry.indexes()]
        before = [self._index(entry.tenant_id, f, v) for f, v in prior.facets]
        by = _RS.join(f"{c.call_id}{_US}{c.decided_by}" for c in entry.calls if c.decided_by)
        fields: list[str | int] = [
            "v", HISTORY_FORMAT,
            "doc", json.dumps(entry.doc(), separators=(",", ":"), ensure_ascii=False),
            "by", by,
        ]  # fmt: skip
        if entry.outputs is not None:
            fields += ["out", json.dumps(dict(entry.outputs), separators=(",", ":"))]
        seq = entry.seq or seq_of(_ms(entry.at), 0)
        args: list[str | int] = [
            seq, entry.member, self.retention_s * 1000, self._cutoff(), TRIM_BUDGET,
            len(indexes), prior.seq, prior.by, prior.res, len(guards),
        ]  # fmt: skip
        for name, value in guards:
            args += [name, value]
        args.append(len(fields) // 2)
        args += fields
        args.append(len(marks))
        for name, value in marks:
            args += [name, value]
        keys = [self._entry_key_for(entry), marks_on, *indexes, *before]
        return cast(Written | Literal["stale"], text(await self._put(keys=keys, args=args)))

    async def _mark_tenant(self, tenant_id: str) -> None:
        now = time.monotonic()
        if now - self._marked.get(tenant_id, -_TENANT_MARK_S) < _TENANT_MARK_S:
            return
        self._marked[tenant_id] = now
        ms = _ms(time.time())
        async with self.redis.pipeline(transaction=False) as pipe:  # one key: one slot
            pipe.zadd(self.keys.history_tenants, {tenant_id: ms})
            pipe.zremrangebyscore(self.keys.history_tenants, "-inf", f"({int(self._cutoff())}")
            await pipe.execute()

    # --- reading ----------------------------------------------------------------------------
    async def tenants(self, since: float | None = None) -> list[str]:
        """The tenants with history written since ``since`` (default: within the
        retention), sorted."""
        # A process notes a tenant once a minute at most: its mark may be that much older
        # than its newest entry.
        floor = _ms(since - _TENANT_MARK_S) if since is not None else int(self._cutoff())
        found = await self.redis.zrangebyscore(self.keys.history_tenants, floor, "+inf")
        return sorted(text(t) for t in found if isinstance(t, bytes | str))

    async def search(
        self,
        tenants: Iterable[str],
        query: Query,
        *,
        cursor: Cursor | None = None,
        limit: int = 50,
        budget: int = SCAN_BUDGET,
    ) -> Page:
        """A page of the entries of ``tenants`` that ``query`` asks for, newest first, after
        ``cursor``. Each tenant's walk looks at ``budget`` index members at most: a page may
        be short (even empty) with a cursor to go on from."""
        if not 1 <= limit <= MAX_LIMIT:
            raise InvalidQueryError(f"limit must be 1 to {MAX_LIMIT}, not {limit}")
        budget = max(budget, limit)
        scans = await asyncio.gather(
            *(self._scan(t, query, cursor, limit, budget) for t in sorted(set(tenants)))
        )
        entries, after = merge(scans, limit)
        return Page(entries, after, sum(s.looked for s in scans))

    async def _scan(
        self, tenant: str, query: Query, cursor: Cursor | None, limit: int, budget: int
    ) -> TenantScan:
        keys = [self._index(tenant, f, v) for f, v in query.facets()]
        upper, lower = query.upper(cursor, tenant), query.lower()
        hits: list[HistoryEntry] = []
        looked, last, done = 0, None, False
        while len(hits) < limit and looked < budget and not done:
            reply = await self._search(
                keys=keys, args=[upper, lower, limit - len(hits), budget - looked]
            )
            stopped, count, reached = text(reply[0]), int(reply[1]), int(reply[2])
            looked += count
            done = reached == 1
            if stopped:
                last, upper = stopped, "(" + stopped
            entries = await self._read(tenant, [text(m) for m in reply[3:]])
            hits += [e for e in entries if e is not None and query.matches(e)]
            if count == 0:
                break
        return TenantScan(tenant, hits, last, done, looked)

    async def _read(
        self, tenant: str, members: Sequence[str], *, outputs: bool = False
    ) -> list[HistoryEntry | None]:
        if not members:
            return []
        names = ["v", "doc", "by", "res", *(["out"] if outputs else [])]
        async with self.redis.pipeline(transaction=False) as pipe:  # one tenant: one slot
            for member in members:
                pipe.hmget(self._entry_key_of(tenant, member), names)
            replies = await pipe.execute()
        found: list[HistoryEntry | None] = []
        for member, raw in zip(members, replies, strict=True):
            kind = _kind_of(member)
            found.append(
                None if kind is None else _decode_entry(tenant, kind, member, raw, outputs=outputs)
            )
        return found

    async def run(
        self, tenant_id: str, run_id: str, *, cursor: Cursor | None = None, limit: int = 500
    ) -> RunPage:
        """A run's entries oldest first, with their outputs, after ``cursor``."""
        if not 1 <= limit <= 2_000:
            raise InvalidQueryError(f"limit must be 1 to 2000, not {limit}")
        start = "-" if cursor is None else "(" + cursor.member
        found = await self.redis.zrange(
            self._index(tenant_id, "run", run_id), start, "+", bylex=True, offset=0, num=limit + 1
        )
        members = [text(m) for m in found if isinstance(m, bytes | str)]
        more = len(members) > limit
        members = members[:limit]
        read = await self._read(tenant_id, members, outputs=True)
        entries = [e for e in read if e is not None and e.run_id == run_id]
        after = Cursor(members[-1], tenant_id) if more else None
        return RunPage(entries, after)
