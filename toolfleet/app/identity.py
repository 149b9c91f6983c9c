"""Who is asking, for every surface that authenticates its callers (the console, the MCP door).

An identity has a name (what decisions and audit entries carry), a role (viewer, operator,
admin) and the tenants it may see and act for; both come from a credential, never from a
request field. The credentials shared by the surfaces:

- static bearer tokens: a JSON list of ``{name, sha256, role, tenants}`` (only the token's
  sha256 is configured), read by ``parse_tokens`` and matched by ``match_token``;
- the claims of an OpenID Connect identity provider's tokens (``claims_identity``: the
  role and tenants claims the console's settings name).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kernel.errors import ConfigurationError
from kernel.settings import Settings
from toolfleet.app.operations import NotAllowedError

Role = Literal["viewer", "operator", "admin"]
"""What an identity may do: read (viewer); read and decide for its tenants (operator); that,
and the fleet-wide actions (circuits, pins) when its tenants are every tenant (admin)."""
ROLES: tuple[Role, ...] = ("viewer", "operator", "admin")
"""The roles, weakest first: each may do everything the ones before it may."""

EVERY_TENANT = "*"
"""In a tenants claim, header or token entry: every tenant."""

_NAME_MAX = 200


@dataclass(frozen=True)
class Identity:
    """Someone signed in: who (as the audit chain names them), their role and tenants."""

    name: str
    """``oidc:alice@corp``, ``token:ci-bot``, ``proxy:bob`` or ``local:ana``: what decisions
    carry as ``decided_by`` and the audit chain keeps."""
    role: Role
    tenants: frozenset[str] | None
    """The tenants this identity may see and act for; None: every tenant."""
    csrf: str | None = None
    """The token a decision must carry in the console's CSRF header (a browser's session);
    None: none is needed (a bearer token, which no browser adds on its own)."""

    def may(self, role: Role) -> bool:
        """Whether this identity's role includes ``role``."""
        return ROLES.index(self.role) >= ROLES.index(role)

    @property
    def scope_text(self) -> str:
        """Its tenants, for messages."""
        if self.tenants is None:
            return "every tenant"
        return ", ".join(sorted(self.tenants)) or "no tenant"


def best_role(values: Iterable[str]) -> Role | None:
    """The strongest role among ``values`` (other values are ignored); None: none."""
    found = {v.strip().lower() for v in values}
    for role in reversed(ROLES):
        if role in found:
            return role
    return None


def tenant_set(values: Iterable[str]) -> frozenset[str] | None:
    """The tenants ``values`` name, without blanks; None when one of them is ``*``."""
    names = frozenset(v.strip() for v in values if v.strip())
    return None if EVERY_TENANT in names else names


# --- static tokens ----------------------------------------------------------------------------


class _TokenEntry(BaseModel):
    """One entry of a static token list."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.@-]+$")
    sha256: str = Field(pattern=r"^[0-9a-fA-F]{64}$")
    role: Role
    tenants: list[str] = Field(min_length=1)


@dataclass(frozen=True)
class StaticToken:
    """A static bearer token: its name, the sha256 of its value, its role and tenants."""

    name: str
    digest: bytes
    role: Role
    tenants: frozenset[str] | None

    def identity(self) -> Identity:
        """The identity whoever sends this token is: ``token:<name>``."""
        return Identity(f"token:{self.name}", self.role, self.tenants)


def parse_tokens(raw: str, *, variable: str = "TOOLFLEET_CONSOLE_TOKENS") -> list[StaticToken]:
    """The tokens of a static token list (JSON, read from ``variable``), or
    ConfigurationError saying what is wrong with it."""
    example = (
        '[{"name": "ci-bot", "sha256": "<sha256 of the token, hex>", "role": "operator", '
        '"tenants": ["acme"]}]'
    )
    try:
        data = json.loads(raw)
        if not isinstance(data, list):
            raise ValueError("it is not a JSON list")
        entries = [_TokenEntry.model_validate(item) for item in data]
    except (ValueError, ValidationError) as exc:
        problem = str(exc).splitlines()[0] if not isinstance(exc, ValidationError) else exc
        raise ConfigurationError(
            f"{variable} is not valid: {problem}; it must be JSON like {example} "
            f"(roles: {', '.join(ROLES)}; tenants '*' for every tenant)"
        ) from None
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise ConfigurationError(f"{variable} names a token twice: names are unique")
    found = []
    for entry in entries:
        tenants = tenant_set(entry.tenants)
        if tenants == frozenset():
            raise ConfigurationError(
                f"{variable}: token {entry.name} lists no tenant ('*': every one)"
            )
        digest = bytes.fromhex(entry.sha256)
        found.append(StaticToken(entry.name, digest, entry.role, tenants))
    return found


def match_token(tokens: Sequence[StaticToken], value: str) -> StaticToken | None:
    """The token of ``tokens`` whose value ``value`` is, or None. Every entry is compared in
    constant time, so how long it takes says nothing of which one matched."""
    digest = hashlib.sha256(value.encode()).digest()
    match = None
    for entry in tokens:
        if hmac.compare_digest(digest, entry.digest):
            match = entry
    return match


# --- OpenID Connect claims --------------------------------------------------------------------


def claim(claims: Mapping[str, Any], name: str) -> Any:
    """A claim by name, or by a dotted path into nested claims (``realm_access.roles``); a
    name with dots that is itself a claim (``https://example.com/roles``) wins."""
    if name in claims:
        return claims[name]
    value: Any = claims
    for part in name.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def claim_values(value: Any) -> list[str]:
    """A claim's or header's values: a list of strings, or one string split on commas and
    spaces."""
    if value is None:
        return []
    if isinstance(value, str):
        return [v for v in value.replace(",", " ").split() if v]
    if isinstance(value, list | tuple):
        return [v for v in value if isinstance(v, str)]
    return []


def identity_of(
    kind: str,
    name: str,
    roles: Iterable[str],
    tenants: Iterable[str],
    *,
    roles_from: str,
    tenants_from: str,
    csrf: str | None = None,
) -> Identity:
    """An identity named ``kind:name`` with the strongest of ``roles`` and ``tenants``; an
    identity with no role, or no tenant, is refused (NotAllowedError saying where the role
    or tenants come from), never given a default."""
    role = best_role(roles)
    label = f"{kind}:{name}"
    if role is None:
        raise NotAllowedError(
            f"{label} has no console role: {roles_from} must name one of {', '.join(ROLES)}"
        )
    scope = tenant_set(tenants)
    if scope == frozenset():
        raise NotAllowedError(
            f"{label} may see no tenant: {tenants_from} must list tenant ids ('*': every tenant)"
        )
    return Identity(label, role, scope, csrf)


def claims_identity(claims: Mapping[str, Any], settings: Settings) -> Identity:
    """The identity an OpenID Connect token gives: named by the verified email, the preferred
    username or the subject, with the role and tenants of the configured claims."""
    email = claims.get("email")
    verified = claims.get("email_verified", True) is not False
    for candidate in (email if verified else None, claims.get("preferred_username")):
        if isinstance(candidate, str) and candidate.strip():
            name = candidate.strip()
            break
    else:
        name = str(claims.get("sub", ""))
    roles_claim = settings.console_oidc_roles_claim
    tenants_claim = settings.console_oidc_tenants_claim
    return identity_of(
        "oidc",
        name[:_NAME_MAX],
        claim_values(claim(claims, roles_claim)),
        claim_values(claim(claims, tenants_claim)),
        roles_from=f"the claim {roles_claim} (TOOLFLEET_CONSOLE_OIDC_ROLES_CLAIM)",
        tenants_from=f"the claim {tenants_claim} (TOOLFLEET_CONSOLE_OIDC_TENANTS_CLAIM)",
    )
