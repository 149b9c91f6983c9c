"""Who sends a request to the door: a bearer token, checked as the MCP authorization
specification asks of a resource server.

Two kinds of token are accepted: the door's own static tokens (``TOOLFLEET_MCP_TOKENS``, the
console's JSON shape, kept apart from the console's list so an agent's token never opens the
console), and JWT access tokens from the console's OpenID Connect issuer, issued for this
door (their audience is ``TOOLFLEET_MCP_PUBLIC_URL``). Nothing else: the door has no
anonymous caller.
"""

from __future__ import annotations

import logging
from typing import Any

from mcp.server.auth.provider import AccessToken
from pydantic import ConfigDict

from kernel.errors import ConfigurationError
from kernel.settings import Settings
from toolfleet.app.identity import (
    Identity,
    StaticToken,
    claims_identity,
    match_token,
    parse_tokens,
)
from toolfleet.app.mcp._jwt import OidcAccessTokens
from toolfleet.app.operations import NotAllowedError

log = logging.getLogger(__name__)

TOKENS_VARIABLE = "TOOLFLEET_MCP_TOKENS"


class CallerToken(AccessToken):
    """A verified bearer token with the identity it stands for, or, for a valid token whose
    claims give no role or no tenant, why it may do nothing (answered 403, not 401)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    identity: Identity | None = None
    refusal: str | None = None


class Verifier:
    """The door's ``TokenVerifier`` (the ``mcp`` package's protocol): static tokens first,
    then a JWT access token of the OpenID Connect issuer, when one is configured."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        raw = settings.mcp_tokens.get_secret_value() if settings.mcp_tokens else None
        self.tokens: list[StaticToken] = parse_tokens(raw, variable=TOKENS_VARIABLE) if raw else []
        self.oidc: OidcAccessTokens | None = None
        issuer, public = settings.console_oidc_issuer, settings.mcp_public_url
        if issuer:
            if not issuer.startswith(("https://", "http://")):
                raise ConfigurationError(
                    f"TOOLFLEET_CONSOLE_OIDC_ISSUER {issuer!r} must be the provider's https:// "
                    "issuer URL"
                )
            if not public:
                raise ConfigurationError(
                    "TOOLFLEET_CONSOLE_OIDC_ISSUER is set, so the MCP door accepts that "
                    "provider's access tokens, and needs TOOLFLEET_MCP_PUBLIC_URL (the URL "
                    "clients reach the door at, e.g. https://mcp.example/mcp): the audience "
                    "those tokens must be issued for"
                )
            self.oidc = OidcAccessTokens(issuer, public)
        if not self.tokens and self.oidc is None:
            raise ConfigurationError(
                "the MCP door has no way to authenticate its callers: set "
                f"{TOKENS_VARIABLE} (static tokens, the JSON shape of TOOLFLEET_CONSOLE_TOKENS) "
                "or TOOLFLEET_CONSOLE_OIDC_ISSUER with TOOLFLEET_MCP_PUBLIC_URL (access tokens "
                "of the console's identity provider); see docs/mcp.md"
            )
        if public and not public.startswith(("https://", "http://")):
            raise ConfigurationError(
                f"TOOLFLEET_MCP_PUBLIC_URL {public!r} must start with https:// (or http:// on "
                "a private network)"
            )

    async def verify_token(self, token: str) -> AccessToken | None:
        """The verified token, or None (the door answers 401 with ``WWW-Authenticate``)."""
        static = match_token(self.tokens, token)
        if static is not None:
            return CallerToken(
                token=token,
                client_id=f"token:{static.name}",
                scopes=[static.role],
                identity=static.identity(),
            )
        if self.oidc is None or token.count(".") != 2:
            return None
        claims = await self.oidc.claims(token)
        if claims is None:
            return None
        return self._of_claims(token, claims)

    def _of_claims(self, token: str, claims: dict[str, Any]) -> CallerToken:
        exp = claims.get("exp")
        expires = int(exp) if isinstance(exp, int | float) else None
        sub = claims.get("sub")
        try:
            who = claims_identity(claims, self.settings)
        except NotAllowedError as exc:
            return CallerToken(
                token=token,
                client_id=str(sub or "?"),
                scopes=[],
                expires_at=expires,
                claims={"iss": claims.get("iss")},
                refusal=str(exc),
            )
        return CallerToken(
            token=token,
            client_id=who.name,
            scopes=[who.role],
            expires_at=expires,
            resource=self.oidc.audience if self.oidc else None,
            subject=str(sub) if sub is not None else None,
            claims={"iss": claims.get("iss")},
            identity=who,
        )
