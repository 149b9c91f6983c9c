"""Optimistic JSON updates on the real Redis: concurrent writers never lose an update."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from redis.asyncio import Redis

from toolfleet.redis import JsonState, update_json

pytestmark = pytest.mark.integration


async def test_concurrent_read_modify_writes_lose_no_update(redis: Redis) -> None:
    key = f"test:cas:{uuid.uuid4().hex}"

    def bump(state: JsonState | None) -> tuple[JsonState, int]:
        count = (state or {"n": 0})["n"] + 1
        return {"n": count}, count

    results = await asyncio.gather(*(update_json(redis, key, bump, ttl_s=60) for _ in range(50)))
    assert sorted(r for _, r in results) == list(range(1, 51))
    state, _ = await update_json(redis, key, lambda s: (None, s), ttl_s=60)
    assert state is None  # returning None leaves the key as it is
    assert await redis.get(key) == b'{"n":50}'
    assert 0 < await redis.ttl(key) <= 60
