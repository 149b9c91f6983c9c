"""The MCP door's record scripts (kernel/stores/lua/mcp_tasks/), each on its own: create finds
a retry or a conflict, mark never recreates an expired record, cancel decides on the call's
outcome as the door read it."""

from __future__ import annotations

import redis

from tests.unit.lua.conftest import Lua

RECORD, ENTRY = "mcptask", "call"


def create(lua: Lua, fingerprint: str, *, task: bool = False, ttl_ms: int = 0) -> list[str]:
    """create.lua as McpTasks.create runs it: the verdict, then the record's fields."""
    args = [fingerprint, ttl_ms, "1" if task else "0", "v", "1", "tool", "weather"]
    return [x.decode() for x in lua("mcp_tasks/create", [RECORD], args)]


def test_a_new_record_is_written_and_a_retry_finds_it(lua: Lua, r: redis.Redis) -> None:
    first = create(lua, "fp-1", ttl_ms=60_000)
    assert first[0] == "new"
    fields = dict(zip(first[1::2], first[2::2], strict=True))
    assert fields == {"fingerprint": "fp-1", "task": "0", "v": "1", "tool": "weather"}
    assert 0 < r.pttl(RECORD) <= 60_000
    again = create(lua, "fp-1", task=True)
    assert again[0] == "same"
    assert dict(zip(again[1::2], again[2::2], strict=True))["task"] == "1"  # now a task too


def test_another_call_under_the_same_run_is_a_conflict_and_changes_nothing(
    lua: Lua, r: redis.Redis
) -> None:
    create(lua, "fp-1")
    other = create(lua, "fp-2", task=True)
    assert other[0] == "conflict"
    assert r.hgetall(RECORD) == {b"fingerprint": b"fp-1", b"task": b"0", b"v": b"1",
                                 b"tool": b"weather"}  # fmt: skip


def test_a_record_kept_for_ever_has_no_expiry(lua: Lua, r: redis.Redis) -> None:
    create(lua, "fp-1", ttl_ms=0)
    assert r.pttl(RECORD) == -1


def test_mark_sets_fields_of_a_record_and_never_recreates_one(lua: Lua, r: redis.Redis) -> None:
    assert lua("mcp_tasks/mark", [RECORD], ["submitted_at", "5"]) == 0
    assert r.exists(RECORD) == 0
    create(lua, "fp-1")
    assert lua("mcp_tasks/mark", [RECORD], ["submitted_at", "5"]) == 1
    assert r.hget(RECORD, "submitted_at") == b"5"


def cancel(lua: Lua, outcome_read: str, reason: str = "stop") -> str:
    """cancel.lua as McpTasks.cancel runs it."""
    reply: bytes = lua("mcp_tasks/cancel", [RECORD, ENTRY], ["7.5", reason, outcome_read])
    return reply.decode()


def test_cancel_marks_a_task_whose_call_did_not_move(lua: Lua, r: redis.Redis) -> None:
    assert cancel(lua, "") == "missing"
    create(lua, "fp-1", task=True)
    r.hset(ENTRY, mapping={"state": "started"})
    assert cancel(lua, "") == "cancelled"
    assert r.hget(RECORD, "cancelled_at") == b"7.5"
    assert r.hget(RECORD, "cancel_reason") == b"stop"
    assert cancel(lua, "", reason="again") == "already"
    assert r.hget(RECORD, "cancel_reason") == b"stop"  # the first reason stays


def test_cancel_refuses_when_the_call_has_an_outcome_the_door_did_not_read(
    lua: Lua, r: redis.Redis
) -> None:
    create(lua, "fp-1", task=True)
    r.hset(ENTRY, mapping={"state": "finished", "outcome": '{"status":"succeeded"}'})
    assert cancel(lua, "") == "moved"
    assert r.hget(RECORD, "cancelled_at") is None
    assert cancel(lua, '{"status":"succeeded"}') == "cancelled"  # decided on what it is now
