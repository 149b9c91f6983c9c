"""Every Redis key toolfleet uses, under one namespace per deployment.

The namespace follows the topic prefix, so two deployments (or two test sessions) that share
a Redis never see each other's ledger, registry, semaphores or circuits. Per-tenant keys put
the tenant in a hash tag, so a Redis Cluster keeps a tenant's keys together.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernel.settings import Settings


@dataclass(frozen=True)
class Keys:
    """Key names under ``namespace``."""

    namespace: str = "tf"

    @classmethod
    def of(cls, settings: Settings) -> Keys:
        """The keys of the deployment ``settings`` describe."""
        prefix = settings.topic_prefix.rstrip(".")
        return cls("tf" if prefix == "toolfleet" else f"tf:{prefix}")

    def _tenant(self, tenant_id: str, kind: str, rest: str) -> str:
        return f"{self.namespace}:{{{tenant_id}}}:{kind}:{rest}"

    # ledger
    def call(self, tenant_id: str, call_id: str) -> str:
        """Hash: one call's ledger entry."""
        return self._tenant(tenant_id, "call", call_id)

    def audit(self, tenant_id: str, call_id: str) -> str:
        """List: one call's audit chain, only ever appended to."""
        return self._tenant(tenant_id, "audit", call_id)

    @property
    def leases(self) -> str:
        """Sorted set: started calls by lease expiry."""
        return f"{self.namespace}:leases"

    # planner
    def approvals(self, tenant_id: str, run_id: str) -> str:
        """Hash: a run's approval decisions (per call and sticky per tool)."""
        return self._tenant(tenant_id, "approvals", run_id)

    def cancelled(self, tenant_id: str, run_id: str) -> str:
        """String: set when a run is cancelled."""
        return self._tenant(tenant_id, "cancelled", run_id)

    def gate(self, tenant_id: str, run_id: str, turn_id: int) -> str:
        """String (JSON): the concurrency gate of one capped turn."""
        return self._tenant(tenant_id, "gate", f"{run_id}:{turn_id}")

    def gates(self, tenant_id: str, run_id: str) -> str:
        """Set: the capped turns of a run."""
        return self._tenant(tenant_id, "gates", run_id)

    def held(self, tenant_id: str, run_id: str) -> str:
        """Set: the run's calls with a wrong effect not yet compensated; while it has members,
        the run's later side-effecting calls wait for a human."""
        return self._tenant(tenant_id, "held", run_id)

    # aggregator
    def turn(self, tenant_id: str, run_id: str, turn_id: int) -> str:
        """Hash: one turn's aggregation state, a field per outcome (aggregator/_store.py)."""
        return self._tenant(tenant_id, "turn", f"{run_id}:{turn_id}")

    def turns(self, tenant_id: str, run_id: str) -> str:
        """Set: the turns of a run the aggregator has seen."""
        return self._tenant(tenant_id, "turns", run_id)

    def attached(self, tenant_id: str, call_id: str) -> str:
        """Set: other turns waiting on a call that runs for its first turn."""
        return self._tenant(tenant_id, "attached", call_id)

    # reconciler and operators
    def recon(self, tenant_id: str, call_id: str) -> str:
        """Hash: the reconciler's state for one call."""
        return self._tenant(tenant_id, "recon", call_id)

    @property
    def due(self) -> str:
        """Sorted set: the reconciler's delayed actions by due time."""
        return f"{self.namespace}:recon:due"

    @property
    def tasks(self) -> str:
        """Hash: human tasks by id."""
        return f"{self.namespace}:tasks"

    # fleet-wide
    @property
    def tools(self) -> str:
        """Hash: the tool registry, lookup key -> ToolSpec of its newest live version."""
        return f"{self.namespace}:tools"

    def tool_versions(self, lookup_key: str) -> str:
        """Hash: the live (served) versions of one tool, version -> ToolSpec."""
        return f"{self.namespace}:tools:versions:{lookup_key}"

    @property
    def tool_pins(self) -> str:
        """Hash: lookup key -> the version an operator pinned new calls to."""
        return f"{self.namespace}:tools:pins"

    def semaphore(self, scope: str, name: str) -> str:
        """Sorted set: holders of one fleet-wide semaphore."""
        return f"{self.namespace}:sem:{scope}:{name}"

    def circuit(self, part: str, ref: str) -> str:
        """A circuit's ``window``, ``state`` or ``trial`` key."""
        return f"{self.namespace}:circuit:{part}:{ref}"
