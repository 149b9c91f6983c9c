"""The MCP door's records: one per call it submitted as a task or with an idempotency key.

A record holds what the call was (tool, arguments, their fingerprint), who asked and when,
whether it was submitted, and a task's cancellation. Everything else about the call (where it
stands, its outcome) is the fleet's ledger: the door reads both. The record lives in its run's
slot group (``Keys.mcp_task``), beside the call's ledger entry, so ``cancel`` checks the entry
in the same script. A tenant's tasks are indexed in one sorted set (``Keys.mcp_tasks``) whose
members sort by creation time, for ``tasks/list``.

Records expire with their time to live (the task's, or the ledger's retention for a keyed
plain call); index members older than the longest time to live are trimmed as tasks are
created, and members whose record expired are dropped as pages are read.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from dataclasses import dataclass
from typing import Literal

from redis.asyncio import Redis

from kernel.adapters.redis import text
from kernel.rules.mcp import call_id_of
from kernel.stores.keys import Keys
from kernel.stores.schema import check_record
from kernel.stores.scripts import script

RECORD_VERSION = "1"
"""The version field of a record this release writes."""

Created = Literal["new", "same", "conflict"]
"""What ``create`` found: nothing (it wrote the record), the same call, or another call."""

Cancelled = Literal["missing", "already", "moved", "cancelled"]
"""What ``cancel`` did (cancel.lua says what each means)."""

_CREATE = script("mcp_tasks/create")
_MARK = script("mcp_tasks/mark")
_CANCEL = script("mcp_tasks/cancel")
_MS_DIGITS = 15


@dataclass(frozen=True)
class DoorRecord:
    """The door's record of one call (call ``c0`` of its own run)."""

    tenant_id: str
    run_id: str
    tool: str
    """The tool's lookup key."""
    name: str
    namespace: str | None
    arguments: str
    """The call's arguments as the JSON text submitted."""
    fingerprint: str
    created_at: float
    ttl_ms: int | None
    task: bool
    created_by: str
    submitted_at: float | None = None
    cancelled_at: float | None = None
    cancel_reason: str | None = None
    resumed_at: float | None = None
    """When a reader last resumed the call's turn after an approval decision."""
    progress_token: str | int | None = None
    """The ``progressToken`` of the request that created a task: its progress goes out
    under it for the task's life (None: the client asked for none)."""
    progress_sent: float | None = None
    """The last ``progress`` sent under ``progress_token`` (by any replica, on any
    ``tasks/result`` stream): the next one must be higher."""

    @classmethod
    def decode(cls, tenant_id: str, run_id: str, h: dict[str, str]) -> DoorRecord:
        """A record from its hash's fields."""
        check_record("MCP door record", h.get("v"))
        ttl = int(h.get("ttl_ms") or 0)
        return cls(
            tenant_id=tenant_id,
            run_id=run_id,
            tool=h.get("tool", ""),
            name=h.get("name", ""),
            namespace=h.get("namespace") or None,
            arguments=h.get("arguments", "{}"),
            fingerprint=h.get("fingerprint", ""),
            created_at=float(h.get("created_at") or 0),
            ttl_ms=ttl or None,
            task=h.get("task") == "1",
            created_by=h.get("created_by", ""),
            submitted_at=float(h["submitted_at"]) if h.get("submitted_at") else None,
            cancelled_at=float(h["cancelled_at"]) if h.get("cancelled_at") else None,
            cancel_reason=h.get("cancel_reason") or None,
            resumed_at=float(h["resumed_at"]) if h.get("resumed_at") else None,
            progress_token=_token_of(h.get("progress_token")),
            progress_sent=float(h["progress_sent"]) if h.get("progress_sent") else None,
        )


def _token_of(raw: str | None) -> str | int | None:
    """A stored progress token (JSON, so a number stays a number); None when there is none."""
    if not raw:
        return None
    token = json.loads(raw)
    return token if isinstance(token, str | int) and not isinstance(token, bool) else None


def _member(created_at: float, run_id: str) -> str:
    """A run's index member: its creation time (ms, zero-padded) sorts members by age."""
    return f"{int(created_at * 1000):0{_MS_DIGITS}d}\x1f{run_id}"


def _cursor_of(member: str) -> str:
    return base64.urlsafe_b64encode(member.encode()).decode()


def _member_of(cursor: str) -> str | None:
    try:
        member = base64.urlsafe_b64decode(cursor.encode()).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    stamp, sep, run = member.partition("\x1f")
    return member if sep and run and stamp.isdigit() and len(stamp) == _MS_DIGITS else None


class InvalidCursorError(ValueError):
    """A ``tasks/list`` cursor this store never gave out."""


class McpTasks:
    """The MCP door's records and each tenant's task index."""

    def __init__(self, redis: Redis, keys: Keys, *, max_ttl_ms: int | None) -> None:
        self.redis = redis
        self.keys = keys
        self.max_ttl_ms = max_ttl_ms
        """The longest time to live a record has (None: records are kept for ever); index
        members older than that are trimmed."""
        self._create = _CREATE.register(redis)
        self._mark = _MARK.register(redis)
        self._cancel = _CANCEL.register(redis)

    async def create(
        self,
        tenant_id: str,
        run_id: str,
        *,
        tool: str,
        name: str,
        namespace: str | None,
        arguments: str,
        fingerprint: str,
        created_by: str,
        task: bool,
        ttl_ms: int | None,
        now: float | None = None,
        progress_token: str | int | None = None,
    ) -> tuple[Created, DoorRecord]:
        """Record a call the door is about to submit, or find the record its run has: the same
        call (a retry, or the first call seen again), or another call under the same run (an
        idempotency key used twice). A task is indexed for ``tasks/list`` (again on a retry:
        indexing is idempotent, so a replica that died in between leaves nothing out). A new
        record keeps ``progress_token``, the token its task's progress goes out under."""
        now = time.time() if now is None else now
        fields: dict[str, str | int] = {
            "v": RECORD_VERSION,
            "tool": tool,
            "name": name,
            "namespace": namespace or "",
            "arguments": arguments,
            "created_at": repr(now),
            "ttl_ms": ttl_ms or 0,
            "created_by": created_by,
        }
        if progress_token is not None:
            fields["progress_token"] = json.dumps(progress_token)
        reply = await self._create(
            keys=[self.keys.mcp_task(tenant_id, run_id)],
            args=[fingerprint, ttl_ms or 0, "1" if task else "0",
                  *(x for pair in fields.items() for x in pair)],
        )  # fmt: skip
        verdict = text(reply[0])
        flat = [text(x) for x in reply[1:]]
        record = DoorRecord.decode(tenant_id, run_id, dict(zip(flat[::2], flat[1::2], strict=True)))
        if verdict != "conflict" and record.task:
            await self._index(record)
        return verdict, record  # type: ignore[return-value]

    async def _index(self, record: DoorRecord) -> None:
        key = self.keys.mcp_tasks(record.tenant_id)
        async with self.redis.pipeline(transaction=False) as pipe:  # one key: one slot
            pipe.zadd(key, {_member(record.created_at, record.run_id): 0})
            if self.max_ttl_ms is not None:
                cutoff = int(time.time() * 1000) - self.max_ttl_ms
                pipe.zremrangebylex(key, "-", f"({cutoff:0{_MS_DIGITS}d}")
                pipe.pexpire(key, self.max_ttl_ms)
            await pipe.execute()

    async def get(self, tenant_id: str, run_id: str) -> DoorRecord | None:
        """The record of ``run_id`` under ``tenant_id`` (None: none, or another tenant's)."""
        raw = await self.redis.hgetall(self.keys.mcp_task(tenant_id, run_id))
        if not raw:
            return None
        return DoorRecord.decode(tenant_id, run_id, {text(k): text(v) for k, v in raw.items()})

    async def mark_submitted(self, tenant_id: str, run_id: str, at: float | None = None) -> bool:
        """Note that the call's model response was published (False: the record is gone)."""
        at = time.time() if at is None else at
        key = self.keys.mcp_task(tenant_id, run_id)
        return bool(await self._mark(keys=[key], args=["submitted_at", repr(at)]))

    async def mark_resumed(self, tenant_id: str, run_id: str, at: float) -> bool:
        """Note that a reader resumed the call's turn after its approval was decided."""
        key = self.keys.mcp_task(tenant_id, run_id)
        return bool(await self._mark(keys=[key], args=["resumed_at", repr(at)]))

    async def mark_progress(self, tenant_id: str, run_id: str, progress: float) -> bool:
        """Note the last ``progress`` sent under the record's progress token."""
        key = self.keys.mcp_task(tenant_id, run_id)
        return bool(await self._mark(keys=[key], args=["progress_sent", repr(progress)]))

    async def cancel(
        self, tenant_id: str, run_id: str, *, reason: str, outcome_read: str | None, at: float
    ) -> Cancelled:
        """Mark a task cancelled if its call's ledger outcome is still ``outcome_read`` (the
        raw JSON the door decided on; None: it had none)."""
        reply = await self._cancel(
            keys=[
                self.keys.mcp_task(tenant_id, run_id),
                self.keys.call(tenant_id, run_id, call_id_of(run_id)),
            ],
            args=[repr(at), reason, outcome_read or ""],
        )
        return text(reply)  # type: ignore[return-value]

    async def page(
        self, tenant_id: str, cursor: str | None, limit: int
    ) -> tuple[list[DoorRecord], str | None]:
        """A page of the tenant's tasks, newest first, after ``cursor`` (from the previous
        page); the records and the next page's cursor (None: this was the last).
        InvalidCursorError for a cursor this store never gave."""
        key = self.keys.mcp_tasks(tenant_id)
        start = "+"
        if cursor is not None:
            member = _member_of(cursor)
            if member is None:
                raise InvalidCursorError(f"invalid tasks/list cursor {cursor[:80]!r}")
            start = f"({member}"
        found: list[DoorRecord] = []
        gone: list[str] = []
        last: str | None = None
        more = True
        while len(found) < limit and more:
            want = limit - len(found)
            replied = await self.redis.zrange(
                key, start, "-", desc=True, bylex=True, offset=0, num=want + 1
            )
            members = [text(m) for m in replied if isinstance(m, bytes | str)]
            more = len(members) > want
            members = members[:want]
            if not members:
                break
            runs = [m.partition("\x1f")[2] for m in members]
            async with self.redis.pipeline(transaction=False) as pipe:
                for run in runs:
                    pipe.hgetall(self.keys.mcp_task(tenant_id, run))
                replies = await pipe.execute()
            for member, run, raw in zip(members, runs, replies, strict=True):
                if raw:
                    fields = {text(k): text(v) for k, v in raw.items()}
                    found.append(DoorRecord.decode(tenant_id, run, fields))
                else:
                    gone.append(member)
                last = member
            start = f"({members[-1]}"
        if gone:
            await self.redis.zrem(key, *gone)
        next_cursor = _cursor_of(last) if more and last is not None else None
        return found, next_cursor
