"""The key layout: one slot per run's keys, a busy tenant's runs over every shard."""

from __future__ import annotations

from redis.crc import key_slot

from kernel.stores.keys import SLOT_GROUPS, Keys

THREE_MASTERS = [(0, 5460), (5461, 10922), (10923, 16383)]  # how a 3-master cluster splits


def _slot(key: str) -> int:
    return int(key_slot(key.encode()))


def _run_keys(keys: Keys, tenant: str, run: str) -> list[str]:
    return [
        keys.call(tenant, run, "call_0"), keys.audit(tenant, run, "call_0"),
        keys.recon(tenant, run, "call_0"), keys.attached(tenant, run, "call_0"),
        keys.approvals(tenant, run), keys.cancelled(tenant, run), keys.held(tenant, run),
        keys.gate(tenant, run, 0), keys.gates(tenant, run), keys.turn(tenant, run, 0),
        keys.turns(tenant, run), keys.leases(keys.group(tenant, run)),
        keys.due(keys.group(tenant, run)), keys.pending(keys.group(tenant, run)),
        keys.mcp_task(tenant, run),
    ]  # fmt: skip


def test_every_key_of_one_run_is_in_one_hash_slot_with_its_indexes() -> None:
    keys = Keys("tf")
    for run in (f"run-{i}" for i in range(50)):
        assert len({_slot(k) for k in _run_keys(keys, "acme", run)}) == 1


def test_200_runs_of_one_tenant_spread_over_every_shard_of_three() -> None:
    keys = Keys("tf")
    slots = {_slot(keys.call("acme", f"run-{i}", "call_0")) for i in range(200)}
    groups = {keys.group("acme", f"run-{i}") for i in range(200)}
    assert len(groups) > SLOT_GROUPS * 3 // 4
    assert all(any(low <= s <= high for s in slots) for low, high in THREE_MASTERS)


def test_a_call_id_is_scoped_to_its_run_unless_the_scope_is_the_tenant() -> None:
    by_run, by_tenant = Keys("tf"), Keys("tf", identity_scope="tenant")
    assert by_run.call("acme", "run-1", "call_0") != by_run.call("acme", "run-2", "call_0")
    assert by_tenant.call("acme", "run-1", "call_0") == by_tenant.call("acme", "run-2", "call_0")
    # With tenant scope a tenant's keys share one slot, so a script may touch them together.
    assert (
        len(
            {_slot(k) for k in _run_keys(by_tenant, "acme", "run-1")}
            | {_slot(k) for k in _run_keys(by_tenant, "acme", "run-2")}
        )
        == 1
    )


def test_the_keys_of_one_tool_versions_circuit_share_a_slot() -> None:
    keys = Keys("tf")
    parts = ("window", "state", "trial", "calls")
    assert len({_slot(keys.circuit(part, "pay@2")) for part in parts}) == 1


def test_the_registry_and_admission_each_keep_to_one_slot() -> None:
    keys = Keys("tf")
    registry = [keys.tools, keys.tool_pins, keys.tool_versions("add"), keys.tool_versions("x.y")]
    assert len({_slot(k) for k in registry}) == 1
    admission = [keys.admission("waiting"), keys.admission("running"), keys.admission("tools")]
    assert len({_slot(k) for k in admission}) == 1


def test_slot_groups_lie_evenly_over_any_even_split_of_the_slots() -> None:
    for shards in (2, 3, 4, 5, 6, 8, 16):
        per_shard = [0] * shards
        for group in range(SLOT_GROUPS):
            slot = _slot(Keys("tf").leases(group))
            per_shard[min(slot * shards // 16_384, shards - 1)] += 1
        assert max(per_shard) - min(per_shard) <= 1, (shards, per_shard)
