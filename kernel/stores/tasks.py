"""Human tasks: kept in Redis for ``toolfleet tasks list``, announced on ``human-tasks``."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from redis.asyncio import Redis

from kernel.adapters.redis import text
from kernel.stores.keys import SLOT_GROUPS, Keys
from kernel.stores.schema import check_record
from schemas import HumanTask, TaskResolution


@dataclass(frozen=True)
class StoredTask:
    """A task and where it stands."""

    task: HumanTask
    status: Literal["open", "resolved"]
    resolution: dict[str, Any] | None
    assignee: dict[str, Any] | None = None
    """Who it is assigned to (``to``), by whom (``by``) and when (``at``); None: nobody."""


def new_task_id() -> str:
    """A short, unique, typeable task id."""
    return f"task-{uuid.uuid4().hex[:12]}"


class TaskStore:
    """Open and resolved human tasks."""

    def __init__(self, redis: Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys
        """Hashes, one per slot group: task_id -> {"task": HumanTask, "status": open|resolved,
        "resolution": ...}."""

    def _key(self, task_id: str) -> str:
        return self.keys.tasks(self.keys.task_group(task_id))

    async def add(self, task: HumanTask) -> None:
        """Record a new open task."""
        record = {"task": task.model_dump(mode="json"), "status": "open", "resolution": None}
        await self.redis.hset(self._key(task.task_id), task.task_id, json.dumps(record))

    def _assignees(self, task_id: str) -> str:
        return self.keys.task_assignees(self.keys.task_group(task_id))

    async def get(self, task_id: str) -> StoredTask | None:
        """One task, or None."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hget(self._key(task_id), task_id)
            pipe.hget(self._assignees(task_id), task_id)
            raw, assignee = await pipe.execute()
        return _decode(raw, assignee) if raw else None

    async def assign(self, task_id: str, to: str, *, by: str, at: float) -> None:
        """Assign a task to ``to`` (an identity; empty: nobody). Kept apart from the task's
        record, so it never races the reconciler closing the task."""
        if to:
            entry = json.dumps({"to": to, "by": by, "at": at})
            await self.redis.hset(self._assignees(task_id), task_id, entry)
        else:
            await self.redis.hdel(self._assignees(task_id), task_id)

    async def all(self) -> list[StoredTask]:
        """Every task, oldest first (every group's index, read at once)."""
        groups = [self.keys.tasks(g) for g in range(SLOT_GROUPS)]
        owners = [self.keys.task_assignees(g) for g in range(SLOT_GROUPS)]
        indexes = await asyncio.gather(*(self.redis.hgetall(key) for key in groups))
        assigned: dict[bytes | str, bytes | str] = {}
        for found in await asyncio.gather(*(self.redis.hgetall(key) for key in owners)):
            assigned.update(found)
        tasks = (_decode(v, assigned.get(k)) for raw in indexes for k, v in raw.items())
        return sorted(tasks, key=lambda t: t.task.created_at)

    async def open_by_kind(self) -> dict[str, int]:
        """How many tasks wait for an operator, per kind (every group's index, read at once).

        Resolved tasks are kept, so this reads them too: tasks are filed at a human's pace,
        and a reconciler asks every few seconds, not per call.
        """
        groups = [self.keys.tasks(g) for g in range(SLOT_GROUPS)]
        indexes = await asyncio.gather(*(self.redis.hvals(key) for key in groups))
        counts: dict[str, int] = {}
        for raw in (value for values in indexes for value in values):
            record = json.loads(text(raw))
            if record["status"] == "open":
                kind = str(record["task"]["kind"])
                counts[kind] = counts.get(kind, 0) + 1
        return counts

    async def close(self, task_id: str, resolution: TaskResolution) -> bool:
        """Mark a task resolved; False when it was already resolved (a redelivery)."""
        stored = await self.get(task_id)
        if stored is None or stored.status == "resolved":
            return False
        record = {
            "task": stored.task.model_dump(mode="json"),
            "status": "resolved",
            "resolution": resolution.model_dump(mode="json") | {"at": time.time()},
        }
        await self.redis.hset(self._key(task_id), task_id, json.dumps(record))
        return True


def _decode(raw: bytes | str, assignee: bytes | str | None = None) -> StoredTask:
    record = json.loads(text(raw))
    check_record("human task", record.get("v"))
    return StoredTask(
        task=HumanTask.model_validate(record["task"]),
        status=record["status"],
        resolution=record.get("resolution"),
        assignee=json.loads(text(assignee)) if assignee else None,
    )
