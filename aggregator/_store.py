"""Turn state in Redis: one hash per turn, written field by field.

A turn's plan is one field, written once; every accepted outcome is a field of its own. So
recording the 20th outcome of a turn writes that outcome, not the whole turn again (which
had cost the aggregator, Redis and its append-only file a turn's size per update).

Every write is a compare-and-set on the hash's version field: two aggregator instances that
briefly handle the same run (a rebalance) never lose each other's updates. The loser reads
the turn again and makes its change again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson

from aggregator._turn import TurnState
from kernel.adapters.redis import BoundedCache
from kernel.stores.turns import TurnHashes
from schemas import CallOutcome, TurnPlan

T = TypeVar("T")

_OUTCOME, _EARLY = "o:", "e:"


@dataclass
class StoredTurn:
    """One turn's state as stored: the turn once its plan is known, outcomes that came
    before the plan, and the marker of the result emitted for it."""

    turn: TurnState | None = None
    early: dict[str, CallOutcome] = field(default_factory=dict)
    """Outcomes whose plan has not arrived yet (another topic, another pace), by call_id."""
    emitted: dict[str, Any] | None = None
    """``{"epoch", "by", "at"}`` of the emitted result: which records triggered it."""
    version: str = ""
    """The version this state was read at ('' when the turn had no state)."""

    def fields(self) -> dict[str, object]:
        """The hash's fields (besides the version), as objects: a field is written again
        only when its object is a different one with a different value."""
        out: dict[str, object] = {}
        turn = self.turn
        if turn is not None:
            out["plan"] = turn.plan
            out |= {_OUTCOME + call_id: o for call_id, o in turn.outcomes.items()}
            if turn.cancelled:
                out["cancelled"] = True
        out |= {_EARLY + call_id: o for call_id, o in self.early.items()}
        if self.emitted is not None:
            out["emitted"] = self.emitted
        return out

    @classmethod
    def from_hash(cls, raw: dict[bytes, bytes]) -> StoredTurn:
        """Decode an HGETALL reply (an empty one is a turn without state)."""
        stored = cls(version=raw.pop(b"v", b"").decode())
        plan = raw.pop(b"plan", None)
        if plan is not None:
            stored.turn = TurnState(
                plan=TurnPlan.model_validate_json(plan),
                cancelled=raw.pop(b"cancelled", None) is not None,
            )
        emitted = raw.pop(b"emitted", None)
        stored.emitted = None if emitted is None else orjson.loads(emitted)
        for name, value in raw.items():
            kind, call_id = name[:2].decode(), name[2:].decode()
            outcome = CallOutcome.model_validate_json(value)
            if kind == _OUTCOME and stored.turn is not None:
                stored.turn.outcomes[call_id] = outcome
            elif kind == _EARLY:
                stored.early[call_id] = outcome
        return stored


class TurnStore:
    """Read-modify-write of turn state, with what this process wrote last kept in memory.

    The aggregator instance that owns a run's partition is the only writer of its turns, so
    an update usually neither reads nor parses anything: it changes the cached state and
    writes the fields that changed. The compare-and-set still guards every write.
    """

    def __init__(self, hashes: TurnHashes, *, cached: int) -> None:
        self._hashes = hashes
        self._cache: BoundedCache[str, StoredTurn] = BoundedCache(cached)

    async def update(
        self, key: str, change: Callable[[StoredTurn], T], *, probably_new: bool = False
    ) -> T:
        """Apply ``change`` (it mutates the state it gets and returns a result) and write the
        fields it changed; on a conflict, read the turn again and apply it again.

        ``probably_new`` first assumes the turn has no state, without reading it (a turn
        that has one fails the compare-and-set and is read then).
        """
        guess_absent = probably_new
        while True:
            stored = self._cache.pop(key, None)
            if stored is None:
                stored = StoredTurn() if guess_absent else await self.read(key)
            guess_absent = False
            before = stored.fields()
            result = change(stored)
            after = stored.fields()
            writes: list[Any] = []
            for name, value in after.items():
                old = before.get(name)
                if old is not value and old != value:
                    writes += [name, _encode(value)]
            deletes = [name for name in before if name not in after]
            if not writes and not deletes:
                self._cache[key] = stored
                return result
            version = await self._hashes.write(key, stored.version, deletes=deletes, sets=writes)
            if version:
                stored.version = str(version)
                self._cache[key] = stored
                return result

    async def read(self, key: str) -> StoredTurn:
        """The turn's state as stored (empty when it has none)."""
        return StoredTurn.from_hash(await self._hashes.read(key))

    def forget_all(self) -> None:
        """Read every turn from Redis again: a failover may have taken back what this process
        wrote (a cached field would never be written again)."""
        self._cache.clear()

    def forget(self, key: str) -> None:
        """Drop the cached state (a settled turn: later updates, duplicates, are rare)."""
        self._cache.pop(key, None)


def _encode(value: object) -> bytes:
    if isinstance(value, TurnPlan | CallOutcome):
        # As on the wire: a field left unset is absent, so an aggregator of the previous
        # release (a rolling upgrade) reads what this one wrote unless a new field is set.
        return value.model_dump_json(exclude_none=True).encode()
    if isinstance(value, frozenset):
        return orjson.dumps(sorted(value))
    return orjson.dumps(value)
