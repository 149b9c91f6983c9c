"""The deployment's state version marker: read at every service's start, and by the services
that write what only a newer state version's readers accept (``kernel.rules.state_versions``
decides; this store only reads and writes the marker).

One hash (``Keys.schema``): ``version`` (the state version in force), ``by`` and ``at``.
"""

from __future__ import annotations

import time

from redis.asyncio import Redis

from kernel.adapters.redis import HashFields, text
from kernel.errors import ConfigurationError
from kernel.rules.state_versions import Marker, newer_record, on_start, record_version, refusal
from kernel.stores.keys import Keys


class StateVersionError(ConfigurationError):
    """The deployment's state is of a version this release does not read: the message says
    which release to run, or what to run first."""


def check_record(kind: str, raw_version: str | int | None) -> None:
    """Raise StateVersionError when a stored record's version field (None: it has none)
    says a newer release wrote it: a last guard behind the marker, for a process that did
    not check it (an operator's command of an earlier release, say)."""
    why = newer_record(kind, record_version(raw_version))
    if why is not None:
        raise StateVersionError(why)


class StateSchema:
    """The version marker of one deployment, over the connection it is given."""

    def __init__(self, redis: Redis, keys: Keys, *, refresh_s: float = 10.0) -> None:
        self.redis = redis
        self.keys = keys
        self.refresh_s = refresh_s
        """How long ``in_force`` trusts what it read (``toolfleet migrate --finish`` raises
        the version while services run)."""
        self._in_force = 1
        self._read_at = float("-inf")

    async def marker(self) -> Marker | None:
        """The marker as it is now (None: there is none)."""
        raw = await self.redis.hgetall(self.keys.schema)
        try:
            return Marker.decode({text(k): text(v) for k, v in raw.items()})
        except ValueError as exc:
            raise StateVersionError(str(exc)) from None

    async def used(self) -> bool:
        """Whether the deployment has run: its tool registry exists (every worker publishes
        its pool's tools when it starts)."""
        return bool(await self.redis.exists(self.keys.tools))

    async def write(self, marker: Marker) -> None:
        """Set the marker."""
        fields: HashFields = {name: value for name, value in marker.fields().items()}
        await self.redis.hset(self.keys.schema, mapping=fields)

    async def check_start(self, service: str) -> int:
        """The version in force, for a service about to start; raises StateVersionError
        when this release must not run against the deployment's state. On fresh state it
        records this release's version first (nothing older can be running)."""
        marker = await self.marker()
        decision = on_start(marker, used=marker is None and await self.used())
        if decision.refuse is not None:
            raise StateVersionError(decision.refuse)
        if decision.record is not None:
            fresh = Marker(decision.record, by=f"{service} on fresh state", at=time.time())
            # Only if no marker appeared meanwhile (another service starting on it).
            if await self.redis.hsetnx(self.keys.schema, "version", str(fresh.version)):
                await self.write(fresh)
            return await self.in_force(fresh_read=True)
        self._in_force, self._read_at = decision.in_force, time.monotonic()
        return decision.in_force

    async def check_readable(self) -> None:
        """Raise StateVersionError when the marker says this release must not read the state
        (for an operator's command: it writes no marker)."""
        marker = await self.marker()
        why = None if marker is None else refusal(marker.version)
        if why is not None:
            raise StateVersionError(why)

    async def in_force(self, *, fresh_read: bool = False) -> int:
        """The version in force, as read within ``refresh_s``."""
        if fresh_read or time.monotonic() - self._read_at > self.refresh_s:
            marker = await self.marker()
            self._in_force = 1 if marker is None else marker.version
            self._read_at = time.monotonic()
        return self._in_force
