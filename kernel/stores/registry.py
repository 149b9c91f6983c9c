"""The tool registry in Redis: worker pools publish their tools, the planner reads them.

Several versions of one tool can be live at once. ``keys.tools`` maps each lookup key to the
spec of its newest live version (what readers that know nothing of versions use);
``keys.tool_versions(key)`` holds the spec of every live version, and ``keys.tool_pins`` the
versions operators pinned new calls to (``toolfleet tools rollback|pin|unpin``).

Clients read no Redis: the workers also announce each version they serve on the compacted
``tools`` topic (``announce_tools``), from which a ``FleetClient`` keeps its own directory.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from kernel.adapters.bus import Bus
from kernel.adapters.redis import HashFields, text
from kernel.rules.versions import newest_version, version_ref
from kernel.stores.keys import Keys
from schemas import ToolSpec


async def publish_tools(redis: Redis, keys: Keys, specs: Iterable[ToolSpec]) -> None:
    """Announce tools: each version joins its tool's live versions (publishing a version
    again replaces its entry), and the main entry becomes the newest live version's spec."""
    served: dict[str, dict[str, str]] = {}
    for spec in specs:
        served.setdefault(spec.lookup_key, {})[spec.version] = spec.model_dump_json()
    if not served:
        return
    version_keys = [keys.tool_versions(key) for key in served]

    async def publish(pipe: Pipeline) -> None:
        # Pools starting together publish at once: the newest is decided from what is live
        # under WATCH, so an older version published last never becomes the main entry.
        live = [await pipe.hgetall(versions_key) for versions_key in version_keys]
        pipe.multi()  # type: ignore[no-untyped-call]
        newest: HashFields = {}
        for (key, mine), versions_key, stored in zip(
            served.items(), version_keys, live, strict=True
        ):
            known = {text(v): text(spec) for v, spec in stored.items()} | mine
            newest[key] = known[newest_version(known)]
            fields: HashFields = {version: spec for version, spec in mine.items()}
            pipe.hset(versions_key, mapping=fields)
        pipe.hset(keys.tools, mapping=newest)

    await redis.transaction(publish, *version_keys)


async def announce_tools(bus: Bus, specs: Iterable[ToolSpec]) -> None:
    """Tell clients which tools the fleet serves: each version's spec, as the registry keeps
    it, on the compacted ``tools`` topic under ``NAME@VERSION`` (a version announced again
    replaces its record); returns once the broker has them all."""
    sent = [
        await bus.publish(
            "tools", version_ref(s.lookup_key, s.version), s.model_dump_json().encode()
        )
        for s in specs
    ]
    await asyncio.gather(*sent)


async def replace_tool(redis: Redis, keys: Keys, spec: ToolSpec) -> None:
    """Make ``spec`` the only live version of its tool (and its main entry), in one
    transaction: the earlier versions are no longer served (a test fleet serving a new object
    under a reused name, ``toolfleet.testing.InProcessFleet``)."""
    versions_key = keys.tool_versions(spec.lookup_key)
    raw = spec.model_dump_json()

    async def replace(pipe: Pipeline) -> None:
        # One hash slot ({tools}): a transaction on a single Redis and on a Cluster alike.
        pipe.multi()  # type: ignore[no-untyped-call]
        pipe.delete(versions_key)
        pipe.hset(versions_key, spec.version, raw)
        pipe.hset(keys.tools, spec.lookup_key, raw)

    await redis.transaction(replace, versions_key)


async def live_versions(redis: Redis, keys: Keys, lookup_key: str) -> dict[str, ToolSpec]:
    """The live versions of one tool, version -> spec, read now (empty: no such tool)."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.hgetall(keys.tool_versions(lookup_key))
        pipe.hget(keys.tools, lookup_key)
        raw_versions, raw_main = await pipe.execute()
    main = ToolSpec.model_validate_json(raw_main) if raw_main else None
    return _live(raw_versions, main)


async def pinned_version(redis: Redis, keys: Keys, lookup_key: str) -> str | None:
    """The version an operator pinned ``lookup_key`` to, if any."""
    raw = await redis.hget(keys.tool_pins, lookup_key)
    return text(raw) if raw else None


async def pin_version(redis: Redis, keys: Keys, lookup_key: str, version: str) -> None:
    """Route new calls of ``lookup_key`` to ``version`` (the caller checks that it is live)."""
    await redis.hset(keys.tool_pins, lookup_key, version)


async def unpin_version(redis: Redis, keys: Keys, lookup_key: str) -> bool:
    """Drop the pin of ``lookup_key``: routing is automatic again. False: it had none."""
    return bool(await redis.hdel(keys.tool_pins, lookup_key))


def _live(raw: Mapping[bytes | str, bytes | str], main: ToolSpec | None) -> dict[str, ToolSpec]:
    """Decode a versions hash; a tool published before versions were kept has its main
    entry as its only live version."""
    live = {text(v): ToolSpec.model_validate_json(spec) for v, spec in raw.items()}
    if not live and main is not None:
        live[main.version] = main
    return live


@dataclass(frozen=True)
class ToolCatalog:
    """One read of the registry: the newest spec of every tool, its live versions, the pins."""

    specs: dict[str, ToolSpec] = field(default_factory=dict)
    """Lookup key -> spec of the newest live version."""
    versions: dict[str, dict[str, ToolSpec]] = field(default_factory=dict)
    """Lookup key -> version -> spec, for every live version."""
    pins: dict[str, str] = field(default_factory=dict)
    """Lookup key -> the version an operator pinned new calls to."""


class ToolDirectory:
    """The planner's cached view of the registry, refreshed when stale or on a miss.

    Live versions and pins are cached with the specs: a pin or a newly published version
    takes effect within ``max_age_s``.
    """

    def __init__(self, redis: Redis, keys: Keys, max_age_s: float = 5.0) -> None:
        self.redis = redis
        self.keys = keys
        self.max_age_s = max_age_s
        self._catalog = ToolCatalog()
        self._loaded_at = float("-inf")
        self._epoch = 0
        """Bumped by ``forget``: a load begun before it is not kept."""

    def forget(self) -> None:
        """Drop the cache: the next read loads the registry again, and a read under way now
        is not kept (a tool was just replaced under its name by a test fleet)."""
        self._loaded_at = float("-inf")
        self._epoch += 1

    async def specs(self, needed: Iterable[str] = ()) -> dict[str, ToolSpec]:
        """All known tools (newest version); reloads when the cache is old or lacks one of
        ``needed``."""
        return (await self.catalog(needed)).specs

    async def catalog(self, needed: Iterable[str] = ()) -> ToolCatalog:
        """Specs, live versions and pins; reloaded as ``specs`` is."""
        stale = time.monotonic() - self._loaded_at > self.max_age_s
        if stale or any(name not in self._catalog.specs for name in needed):
            epoch = self._epoch
            catalog = await self._load(every_version=stale)
            if epoch == self._epoch:
                self._catalog, self._loaded_at = catalog, time.monotonic()
            return catalog
        return self._catalog

    async def _load(self, *, every_version: bool) -> ToolCatalog:
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(self.keys.tools)
            pipe.hgetall(self.keys.tool_pins)
            raw_specs, raw_pins = await pipe.execute()
        specs = {text(k): ToolSpec.model_validate_json(v) for k, v in raw_specs.items()}
        known = self._catalog.versions
        # A miss (a model calling a tool nobody serves) reloads on every such turn: only
        # tools new since the last load have their versions read then.
        refresh = [k for k in specs if every_version or k not in known]
        versions = {k: v for k, v in known.items() if k in specs and k not in refresh}
        if refresh:
            async with self.redis.pipeline(transaction=False) as pipe:
                for key in refresh:
                    pipe.hgetall(self.keys.tool_versions(key))
                replies = await pipe.execute()
            for key, raw in zip(refresh, replies, strict=True):
                versions[key] = _live(raw, specs[key])
        pins = {text(k): text(v) for k, v in raw_pins.items()}
        return ToolCatalog(specs, versions, pins)
