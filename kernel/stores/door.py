"""The one door to toolfleet's state: a service's stores, over the Redis connection it is given.

The application connects to Redis (``toolfleet/app/service.py``, a test fleet) and hands each
service a ``Stores``; the service builds the stores it needs from it and sends no Redis
command of its own (``make lint``: services never import ``redis``). Every key and script
belongs to one store (``kernel.stores``); this class only builds them, configured by the
deployment's ``Settings``, so a service never needs the connection itself.
"""

from __future__ import annotations

from collections.abc import Iterable

from redis.asyncio import Redis

from kernel.adapters.redis import OutputGate
from kernel.settings import LEDGER_RETENTION_S, Settings
from kernel.stores.admission import Admission
from kernel.stores.circuit import CircuitBreaker
from kernel.stores.gates import GateStore
from kernel.stores.history import History
from kernel.stores.keys import Keys
from kernel.stores.ledger import Ledger
from kernel.stores.mcp_tasks import McpTasks
from kernel.stores.overview import Overview
from kernel.stores.reconciling import ReconcileState
from kernel.stores.registry import ToolDirectory, publish_tools
from kernel.stores.schema import StateSchema
from kernel.stores.tasks import TaskStore
from kernel.stores.turns import RunTurns, TurnHashes
from kernel.stores.unknowns import UnknownEffects
from schemas import ToolSpec


class Stores:
    """Builds the stores of one deployment (``settings``) over one Redis connection.

    Each call builds a new store (a store may cache what it read: the planner's tool
    directory, the circuit states), so two services never share one by accident.
    """

    def __init__(self, redis: Redis, settings: Settings) -> None:
        self._redis = redis
        self.settings = settings
        self.keys = Keys.of(settings)
        """The deployment's key names (a run's slot group, say, for a log line or a test)."""

    def output_gate(self) -> OutputGate:
        """What the service's Kafka output waits for: its Redis writes replicated, and no
        connection lost with the work in hand (a service sets it as its bus's ``gate``)."""
        return OutputGate(self._redis)

    def ledger(self) -> Ledger:
        """The call ledger, a plain run kept ``ledger_retention_s`` after its commit."""
        return Ledger(self._redis, self.keys, self.settings.ledger_retention_s)

    def admission(self) -> Admission:
        """Admission's queues, quotas and worker slots, with the configured tenant defaults."""
        return Admission.of(self._redis, self.keys, self.settings)

    def circuits(self) -> CircuitBreaker:
        """The circuit breakers of tool versions."""
        return CircuitBreaker(self._redis, self.settings)

    def tasks(self) -> TaskStore:
        """The human task queue."""
        return TaskStore(self._redis, self.keys)

    def tool_directory(self, max_age_s: float = 5.0) -> ToolDirectory:
        """A cached view of the tool registry, read again when older than ``max_age_s``."""
        return ToolDirectory(self._redis, self.keys, max_age_s=max_age_s)

    async def publish_tools(self, specs: Iterable[ToolSpec]) -> None:
        """Announce a pool's tools in the registry (``registry.publish_tools``)."""
        await publish_tools(self._redis, self.keys, specs)

    def gates(self) -> GateStore:
        """The concurrency gates of capped turns, each living as long as its ledger entries."""
        return GateStore(self._redis, self.keys, ttl_s=self.settings.ledger_retention_s)

    def turn_hashes(self) -> TurnHashes:
        """The aggregator's turn hashes, each living as long as its ledger entries."""
        return TurnHashes(self._redis, ttl_s=self.settings.ledger_retention_s)

    def run_turns(self) -> RunTurns:
        """Each run's turns and the turns attached to a call, living as long as its ledger
        entries."""
        return RunTurns(self._redis, self.keys, ttl_s=self.settings.ledger_retention_s)

    def reconciling(self) -> ReconcileState:
        """The reconciler's state per call and its schedule."""
        return ReconcileState(self._redis, self.keys)

    def schema(self) -> StateSchema:
        """The deployment's state version marker, the version in force re-read every
        ``state_version_refresh_s``."""
        return StateSchema(self._redis, self.keys, refresh_s=self.settings.state_version_refresh_s)

    def mcp_tasks(self) -> McpTasks:
        """The MCP door's records of its calls and each tenant's task index; no record
        outlives the ledger entries of its run."""
        retention = self.settings.ledger_retention_s
        return McpTasks(self._redis, self.keys, max_ttl_ms=retention * 1000 if retention else None)

    def history(self) -> History:
        """The console's history of turns, decisions, tasks and cancellations, kept
        ``history_retention_s`` (the ledger's retention unless set; 7 days when the ledger
        keeps calls forever)."""
        s = self.settings
        retention = s.history_retention_s or s.ledger_retention_s or LEDGER_RETENTION_S
        return History(self._redis, self.keys, retention_s=retention)

    def overview(self) -> Overview:
        """The console's overview: windowed counts and sampled gauges."""
        return Overview(self._redis, self.keys)

    def unknowns(self, ledger: Ledger) -> UnknownEffects:
        """The index of calls whose effect is unknown (entries read through ``ledger``)."""
        return UnknownEffects(self._redis, self.keys, ledger)
