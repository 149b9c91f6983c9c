"""The tool registry in Redis: worker pools publish their tools, the planner reads them."""

from __future__ import annotations

import time
from collections.abc import Iterable

from redis.asyncio import Redis

from schemas import ToolSpec
from toolfleet.keys import Keys
from toolfleet.redis import text


async def publish_tools(redis: Redis, keys: Keys, specs: Iterable[ToolSpec]) -> None:
    """Announce tools; a later publish of the same name (a new version) replaces the entry."""
    mapping = {spec.lookup_key: spec.model_dump_json() for spec in specs}
    if mapping:
        await redis.hset(keys.tools, mapping=mapping)  # type: ignore[arg-type]


class ToolDirectory:
    """The planner's cached view of the registry, refreshed when stale or on a miss."""

    def __init__(self, redis: Redis, keys: Keys, max_age_s: float = 5.0) -> None:
        self.redis = redis
        self.keys = keys
        self.max_age_s = max_age_s
        self._specs: dict[str, ToolSpec] = {}
        self._loaded_at = float("-inf")

    async def specs(self, needed: Iterable[str] = ()) -> dict[str, ToolSpec]:
        """All known tools; reloads when the cache is old or lacks one of ``needed``."""
        stale = time.monotonic() - self._loaded_at > self.max_age_s
        if stale or any(name not in self._specs for name in needed):
            raw = await self.redis.hgetall(self.keys.tools)
            self._specs = {text(k): ToolSpec.model_validate_json(v) for k, v in raw.items()}
            self._loaded_at = time.monotonic()
        return self._specs
