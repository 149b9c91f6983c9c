"""kernel.rules.auth: decisions signed with their tenant's key, and nothing else accepted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernel.errors import ConfigurationError, InvalidMessageError
from kernel.rules.auth import DecisionAuth, signature
from kernel.settings import Settings
from schemas import ApprovalDecision, CancelRequest, TaskResolution

APPROVE = ApprovalDecision(
    tenant_id="acme", run_id="r1", call_id="c1", tool_name="refund", approve=True,
    decided_by="alice",
)  # fmt: skip
AUTH = DecisionAuth({"acme": "acme-secret", "beta": "beta-secret"})


def test_a_signed_decision_verifies_and_survives_the_wire() -> None:
    signed = AUTH.sign(APPROVE)
    assert signed.signature is not None and signed.signature.startswith("hmac-sha256:")
    AUTH.verify(ApprovalDecision.decode(signed.encode()))


@pytest.mark.parametrize(
    ("decision", "reason"),
    [
        (APPROVE, "unsigned ApprovalDecision"),
        # Changed after signing: approve flipped, another run named.
        (AUTH.sign(APPROVE).model_copy(update={"approve": False}), "forged"),
        (AUTH.sign(APPROVE).model_copy(update={"run_id": "r2"}), "forged"),
        # Signed with another tenant's key: beta cannot decide for acme.
        (APPROVE.model_copy(update={"signature": signature(APPROVE, b"beta-secret")}), "forged"),
        (AUTH.sign(APPROVE.model_copy(update={"tenant_id": "beta"})).model_copy(
            update={"tenant_id": "acme"}), "forged"),
        (APPROVE.model_copy(update={"tenant_id": "gamma", "signature": "hmac-sha256:00"}),
         "no decision key"),
    ],
)  # fmt: skip
def test_unsigned_forged_and_cross_tenant_decisions_are_refused(
    decision: ApprovalDecision, reason: str
) -> None:
    with pytest.raises(InvalidMessageError, match=reason):
        AUTH.verify(decision)


def test_every_kind_of_decision_is_covered() -> None:
    cancel = CancelRequest(tenant_id="beta", run_id="r1", reason="stop")
    resolution = TaskResolution(tenant_id="acme", task_id="t1", resolution="applied",
                                decided_by="ops")  # fmt: skip
    for decision in (cancel, resolution):
        AUTH.verify(AUTH.sign(decision))
        with pytest.raises(InvalidMessageError, match="unsigned"):
            AUTH.verify(decision)


def test_a_default_key_serves_tenants_without_their_own_and_off_accepts_anything(
    tmp_path: Path,
) -> None:
    shared = DecisionAuth({"*": "one-operator"})
    shared.verify(shared.sign(APPROVE.model_copy(update={"tenant_id": "anyone"})))
    with pytest.raises(ConfigurationError, match="no decision key for tenant 'acme'"):
        DecisionAuth({}).sign(APPROVE)
    off = DecisionAuth({}, enabled=False)
    off.verify(APPROVE)
    assert off.sign(APPROVE) == APPROVE
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"acme": "from-file"}))
    from_file = DecisionAuth.of(Settings(decision_keys_file=keys))
    from_file.verify(DecisionAuth({"acme": "from-file"}).sign(APPROVE))
