"""Who may decide: approvals, cancellations and task resolutions carry a verified signature.

A decision is signed with its tenant's key (HMAC-SHA256 over the canonical JSON of the
message without its signature), so only someone holding that tenant's key can approve, cancel
or resolve anything of that tenant: a decision naming another tenant's run, an unsigned one or
a forged one is refused, and every consumer dead-letters it with the reason. ``FleetClient``,
``FleetRunner`` and the operator CLI sign for you.

Keys come from ``TOOLFLEET_DECISION_KEYS`` (JSON: tenant -> secret; the tenant ``"*"`` is the
key of every tenant without one of its own, for a deployment with a single operator) or
``TOOLFLEET_DECISION_KEYS_FILE`` (the same JSON in a file, e.g. a mounted Kubernetes secret).
``TOOLFLEET_DECISION_AUTH=off`` switches verification off, for local development only.
Pure: no I/O beyond reading the key file once.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TypeVar

from kernel.errors import ConfigurationError, InvalidMessageError
from kernel.settings import Settings
from schemas import ApprovalDecision, CancelRequest, TaskResolution

Decision = ApprovalDecision | CancelRequest | TaskResolution
"""The messages that decide something and must be signed."""

D = TypeVar("D", ApprovalDecision, CancelRequest, TaskResolution)

SCHEME = "hmac-sha256:"
"""How a signature starts (room for other schemes later)."""


def canonical(decision: Decision) -> bytes:
    """The bytes a signature covers: every field but the signature, key-sorted, compact."""
    data = decision.model_dump(mode="json", exclude={"signature"}, exclude_none=True)
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def signature(decision: Decision, key: bytes) -> str:
    """The signature of ``decision`` under ``key``."""
    return SCHEME + hmac.new(key, canonical(decision), hashlib.sha256).hexdigest()


class DecisionAuth:
    """Signs and verifies decisions with per-tenant keys (or does nothing, when off)."""

    def __init__(self, keys: Mapping[str, str], *, enabled: bool = True) -> None:
        self.enabled = enabled
        self._keys = {tenant: secret.encode() for tenant, secret in keys.items()}

    @classmethod
    def of(cls, settings: Settings) -> DecisionAuth:
        """The auth ``settings`` configure."""
        keys = dict(settings.decision_keys)
        if settings.decision_keys_file is not None:
            try:
                keys |= json.loads(settings.decision_keys_file.read_text())
            except (OSError, ValueError) as exc:
                raise ConfigurationError(
                    f"TOOLFLEET_DECISION_KEYS_FILE {settings.decision_keys_file}: {exc}; it "
                    'must hold JSON like {"tenant": "secret"}'
                ) from exc
        return cls(keys, enabled=settings.decision_auth != "off")

    def _key(self, tenant_id: str) -> bytes | None:
        return self._keys.get(tenant_id, self._keys.get("*"))

    def handle_key(self, tenant_id: str) -> bytes:
        """The key a tenant's completion handles are signed with: its decision key (with
        auth off, a fixed local one: a handle is then no credential at all)."""
        key = self._key(tenant_id)
        if key is not None:
            return key
        if not self.enabled:
            return b"toolfleet-local-development"
        raise ConfigurationError(
            f"no decision key for tenant {tenant_id!r}, so no completion handle can be signed: "
            "add it to TOOLFLEET_DECISION_KEYS (or TOOLFLEET_DECISION_KEYS_FILE)"
        )

    def sign(self, decision: D) -> D:
        """``decision`` with its signature (unchanged when auth is off)."""
        if not self.enabled:
            return decision
        key = self._key(decision.tenant_id)
        if key is None:
            raise ConfigurationError(
                f"no decision key for tenant {decision.tenant_id!r}: add it to "
                "TOOLFLEET_DECISION_KEYS (or TOOLFLEET_DECISION_KEYS_FILE), or set "
                "TOOLFLEET_DECISION_AUTH=off for local development"
            )
        return decision.model_copy(update={"signature": signature(decision, key)})

    def verify(self, decision: Decision) -> None:
        """Raise InvalidMessageError (dead-lettered with the reason) unless ``decision`` is
        signed with its own tenant's key; nothing when auth is off."""
        if not self.enabled:
            return
        kind = type(decision).__name__
        if decision.signature is None:
            reason = f"unsigned {kind}: decisions must be signed with the tenant's key"
            raise InvalidMessageError(reason, reason=reason)
        key = self._key(decision.tenant_id)
        if key is None:
            reason = f"{kind} for tenant {decision.tenant_id!r}, which has no decision key"
            raise InvalidMessageError(reason, reason=reason)
        if not hmac.compare_digest(decision.signature, signature(decision, key)):
            reason = f"forged {kind}: its signature is not the tenant's"
            raise InvalidMessageError(reason, reason=reason)


@dataclass(frozen=True)
class CompletionHandle:
    """What a deferred call's completion handle names: the attempt it completes, and the
    pool whose workers take its completion."""

    tenant_id: str
    run_id: str
    call_id: str
    attempt: int
    fencing_token: int
    pool: str

    def encode(self, key: bytes) -> str:
        """The handle: the fields (base64url JSON), a dot, their HMAC-SHA256 under ``key``."""
        body = json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()
        text = base64.urlsafe_b64encode(body).decode().rstrip("=")
        return f"{text}.{_mac(key, text)}"

    @classmethod
    def read(cls, handle: str) -> CompletionHandle:
        """The fields a handle names, unverified (to find its tenant's key);
        InvalidMessageError when it is no handle."""
        text, _, _mac_hex = handle.partition(".")
        try:
            padded = text + "=" * (-len(text) % 4)
            data = json.loads(base64.urlsafe_b64decode(padded.encode()))
            return cls(
                tenant_id=str(data["tenant_id"]), run_id=str(data["run_id"]),
                call_id=str(data["call_id"]), attempt=int(data["attempt"]),
                fencing_token=int(data["fencing_token"]), pool=str(data["pool"]),
            )  # fmt: skip
        except (ValueError, KeyError, TypeError, binascii.Error):
            reason = "not a completion handle: pass the handle the tool gave out, unchanged"
            raise InvalidMessageError(reason, reason=reason) from None

    @classmethod
    def verify(cls, handle: str, key: bytes) -> CompletionHandle:
        """The fields of ``handle`` if ``key`` signed it; InvalidMessageError otherwise."""
        found = cls.read(handle)
        text, _, given = handle.partition(".")
        if not hmac.compare_digest(given, _mac(key, text)):
            reason = "forged completion handle: its signature is not the tenant's"
            raise InvalidMessageError(reason, reason=reason)
        return found


def _mac(key: bytes, text: str) -> str:
    return hmac.new(key, b"completion:" + text.encode(), hashlib.sha256).hexdigest()
