"""Every Redis key toolfleet uses, under one namespace per deployment.

The namespace follows the topic prefix, so two deployments (or two test sessions) that share
a Redis never see each other's ledger, registry, admission state or circuits.

Slot groups: every key of one run (its calls' ledger entries and audit chains, approvals,
concurrency gates, turn state, cancellation marker) carries the hash tag of the run's slot
group, one of ``SLOT_GROUPS`` chosen from (tenant, run). A Redis Cluster keeps each group in
one hash slot, so every script's keys share a slot, while one busy tenant's runs spread over
every shard. The indexes a service scans (leases, the reconciler's due set) are split by
group (human tasks by their id), and scanned group by group.

Identity scope: a call's ledger key names its run (``identity_scope="run"``, as the Agents SDK
scopes call ids), so two runs may both use call id ``call_0``. With ``"tenant"`` the run is
left out of call keys and the group comes from the tenant alone: a call id is then unique per
tenant, which also stops a model response replayed under a new run id.
"""

from __future__ import annotations

import binascii
import itertools
import zlib
from dataclasses import dataclass
from typing import Literal

from kernel.settings import Settings

SLOT_GROUPS = 64
"""How many slot groups a deployment's run keys are spread over (fixed: keys name it)."""

_SLOTS = 16_384


def _evenly_spaced_tag(group: int) -> str:
    """The first tag ``g<group>.<n>`` whose hash slot (CRC16 mod 16384, as Redis Cluster
    computes it) lies in the group's own 1/SLOT_GROUPS of the slot space."""
    width = _SLOTS // SLOT_GROUPS
    for n in itertools.count():
        tag = f"g{group}.{n}"
        if binascii.crc_hqx(tag.encode(), 0) % _SLOTS // width == group:
            return tag
    raise AssertionError("unreachable")


GROUP_TAGS = tuple(_evenly_spaced_tag(g) for g in range(SLOT_GROUPS))
"""The hash tag of each slot group. Plain ``g0`` … ``g63`` hash unevenly (23/21/20 groups on
3 even shards, so one shard did 8% more than its share); these lie one per 256 slots, so an
even split of the slots over 2-6, 8 or 16 shards gives each its share of groups within one."""

IdentityScope = Literal["run", "tenant"]


@dataclass(frozen=True)
class Keys:
    """Key names under ``namespace``."""

    namespace: str = "tf"
    identity_scope: IdentityScope = "run"

    @classmethod
    def of(cls, settings: Settings) -> Keys:
        """The keys of the deployment ``settings`` describe."""
        prefix = settings.topic_prefix.rstrip(".")
        namespace = "tf" if prefix == "toolfleet" else f"tf:{prefix}"
        return cls(namespace, settings.identity_scope)

    def group(self, tenant_id: str, run_id: str) -> int:
        """The slot group of a run's keys."""
        scoped = run_id if self.identity_scope == "run" else ""
        return zlib.crc32(f"{tenant_id}\x1f{scoped}".encode()) % SLOT_GROUPS

    def _run(self, tenant_id: str, run_id: str, kind: str, rest: str = "") -> str:
        tag = self.group(tenant_id, run_id)
        return f"{self.namespace}:{{{GROUP_TAGS[tag]}}}:{kind}:{tenant_id}\x1f{run_id}{rest}"

    def _call(self, tenant_id: str, run_id: str, kind: str, call_id: str) -> str:
        tag = self.group(tenant_id, run_id)
        scoped = run_id if self.identity_scope == "run" else ""
        return f"{self.namespace}:{{{GROUP_TAGS[tag]}}}:{kind}:{tenant_id}\x1f{scoped}\x1f{call_id}"

    # ledger
    def call(self, tenant_id: str, run_id: str, call_id: str) -> str:
        """Hash: one call's ledger entry."""
        return self._call(tenant_id, run_id, "call", call_id)

    def audit(self, tenant_id: str, run_id: str, call_id: str) -> str:
        """List: one call's audit chain, only ever appended to."""
        return self._call(tenant_id, run_id, "audit", call_id)

    def leases(self, group: int) -> str:
        """Sorted set: started calls of one slot group by lease expiry."""
        return f"{self.namespace}:{{{GROUP_TAGS[group]}}}:leases"

    def pending(self, group: int) -> str:
        """Sorted set: calls of one slot group waiting for an approval decision, by when
        they were asked (an index for operators: ``Ledger.pending_approvals``)."""
        return f"{self.namespace}:{{{GROUP_TAGS[group]}}}:pending"

    # planner
    def approvals(self, tenant_id: str, run_id: str) -> str:
        """Hash: a run's approval decisions (per call and sticky per tool)."""
        return self._run(tenant_id, run_id, "approvals")

    def cancelled(self, tenant_id: str, run_id: str) -> str:
        """String: set when a run is cancelled."""
        return self._run(tenant_id, run_id, "cancelled")

    def gate(self, tenant_id: str, run_id: str, turn_id: int) -> str:
        """String (JSON): the concurrency gate of one capped turn."""
        return self._run(tenant_id, run_id, "gate", f"\x1f{turn_id}")

    def gates(self, tenant_id: str, run_id: str) -> str:
        """Set: the capped turns of a run."""
        return self._run(tenant_id, run_id, "gates")

    def held(self, tenant_id: str, run_id: str) -> str:
        """Set: the run's calls with a wrong effect not yet compensated; while it has members,
        the run's later side-effecting calls wait for a human."""
        return self._run(tenant_id, run_id, "held")

    # aggregator
    def turn(self, tenant_id: str, run_id: str, turn_id: int) -> str:
        """Hash: one turn's aggregation state, a field per outcome (aggregator/_store.py)."""
        return self._run(tenant_id, run_id, "turn", f"\x1f{turn_id}")

    def turns(self, tenant_id: str, run_id: str) -> str:
        """Set: the turns of a run the aggregator has seen."""
        return self._run(tenant_id, run_id, "turns")

    def attached(self, tenant_id: str, run_id: str, call_id: str) -> str:
        """Set: other turns waiting on a call that runs for its first turn."""
        return self._call(tenant_id, run_id, "attached", call_id)

    # reconciler and operators
    def recon(self, tenant_id: str, run_id: str, call_id: str) -> str:
        """Hash: the reconciler's state for one call."""
        return self._call(tenant_id, run_id, "recon", call_id)

    def due(self, group: int) -> str:
        """Sorted set: the reconciler's delayed actions of one slot group, by due time."""
        return f"{self.namespace}:{{{GROUP_TAGS[group]}}}:recon:due"

    def unknowns(self, group: int) -> str:
        """Sorted set: one slot group's calls whose effect is unknown and unresolved, by when
        the reconciler first saw them (``kernel/stores/unknowns.py``)."""
        return f"{self.namespace}:{{{GROUP_TAGS[group]}}}:recon:unknown"

    def task_group(self, task_id: str) -> int:
        """The slot group of a human task's index, from its id alone."""
        return zlib.crc32(task_id.encode()) % SLOT_GROUPS

    def tasks(self, group: int) -> str:
        """Hash: the human tasks of one slot group, by id."""
        return f"{self.namespace}:{{{GROUP_TAGS[group]}}}:tasks"

    def task_assignees(self, group: int) -> str:
        """Hash: who each human task of one slot group is assigned to, by id (apart from the
        task's record, which the reconciler rewrites when it closes it)."""
        return f"{self.namespace}:{{{GROUP_TAGS[group]}}}:task-assignees"

    # the MCP door
    def mcp_task(self, tenant_id: str, run_id: str) -> str:
        """Hash: the MCP door's record of a call it submitted (a task, or a plain call with
        an idempotency key), in its run's slot group beside the call's ledger entry."""
        return self._run(tenant_id, run_id, "mcptask")

    def mcp_tasks(self, tenant_id: str) -> str:
        """Sorted set (one score, ordered by member): a tenant's MCP tasks, newest last;
        ``tasks/list`` pages through it."""
        return f"{self.namespace}:{{mcp:{tenant_id}}}:tasks"

    # the console's history (kernel/stores/history.py): every key of one tenant in one slot
    def history(self, tenant_id: str, part: str) -> str:
        """One of a tenant's history keys (an entry, an index, a run's marks): they share
        the tenant's hash tag, so one script writes an entry and its indexes together on a
        Redis Cluster too, and tenants spread over the shards."""
        return f"{self.namespace}:{{h.{tenant_id}}}:{part}"

    # the console's overview (kernel/stores/overview.py): one hash per time bucket
    def overview(self, width: int, start: int) -> str:
        """The overview's counts of one ``width``-second bucket starting at ``start``: a
        slot of its own (the buckets of a day spread over a cluster's shards)."""
        return f"{self.namespace}:ov:{{{width}.{start}}}"

    @property
    def history_tenants(self) -> str:
        """Sorted set: the tenants that have history, by when they last wrote (ms)."""
        return f"{self.namespace}:hist:tenants"

    @property
    def schema(self) -> str:
        """Hash: the deployment's state version marker (``kernel/stores/schema.py``)."""
        return f"{self.namespace}:schema"

    # fleet-wide: the registry is one hash slot (publishing updates its keys in one
    # transaction), and so is admission (one script decides over all of its structures)
    @property
    def tools(self) -> str:
        """Hash: the tool registry, lookup key -> ToolSpec of its newest live version."""
        return f"{self.namespace}:{{tools}}"

    def tool_versions(self, lookup_key: str) -> str:
        """Hash: the live (served) versions of one tool, version -> ToolSpec."""
        return f"{self.namespace}:{{tools}}:versions:{lookup_key}"

    @property
    def tool_pins(self) -> str:
        """Hash: lookup key -> the version an operator pinned new calls to."""
        return f"{self.namespace}:{{tools}}:pins"

    def admission(self, name: str) -> str:
        """One structure of admission (queues, quotas, buckets, worker slots): all in one
        hash slot, since every admission decision reads and writes them together."""
        return f"{self.namespace}:{{adm}}:{name}"

    def circuit(self, part: str, ref: str) -> str:
        """A circuit's ``window``, ``state``, ``trial`` or ``calls`` key: the keys of one tool
        version share a hash slot (its scripts take them together)."""
        return f"{self.namespace}:circuit:{{{ref}}}:{part}"
