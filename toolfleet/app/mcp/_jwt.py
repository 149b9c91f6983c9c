"""JWT access tokens from the console's OpenID Connect provider, checked as an OAuth 2.1
resource server checks them: signed by a key of the issuer's JWKS (found by OpenID Connect
discovery), issued by that issuer, for this door (``aud`` is the door's public URL, RFC 8707),
not expired.

PyJWT (which the ``mcp`` package requires) verifies; its ``PyJWKClient`` keeps the issuer's
keys, fetches them again when they age or a token names a key not seen yet, and does so at
most once per cool-down, so a flood of tokens with made-up key ids cannot make the door
hammer the issuer. Both fetch over ``urllib``, so they run in a worker thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import urllib.request
from typing import Any

import jwt

log = logging.getLogger(__name__)

ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512",
              "EdDSA")  # fmt: skip
"""Signature algorithms accepted: asymmetric only (a shared-secret HS* token could be made by
anyone who knows the secret, which a resource server must never need)."""

TOKEN_TYPES = (None, "JWT", "at+jwt", "application/at+jwt")
"""``typ`` headers accepted. RFC 9068 access tokens say ``at+jwt``; many providers say
``JWT`` or nothing. Anything else (a logout token, a DPoP proof) is refused; an ID token is
refused by its audience (the client id, not this door)."""

KEYS_MAX_AGE_S = 3600.0
"""How long the issuer's keys are used before they are fetched again."""

REFETCH_MIN_S = 30.0
"""Least time between two fetches of the keys for a token signed by a key not seen yet."""

LEEWAY_S = 60
"""Clock skew allowed on ``exp``, ``nbf`` and ``iat``."""


class OidcAccessTokens:
    """Verifies JWT access tokens of ``issuer`` for ``audience`` (the door's URL)."""

    def __init__(self, issuer: str, audience: str, *, timeout_s: float = 10.0) -> None:
        self.issuer = issuer
        self.audience = audience.rstrip("/")
        self.timeout_s = timeout_s
        self._keys: jwt.PyJWKClient | None = None
        self._discovery = threading.Lock()

    async def claims(self, token: str) -> dict[str, Any] | None:
        """The token's claims when it checks out; None otherwise (logged with the reason,
        never the token)."""
        return await asyncio.to_thread(self._claims, token)

    def _claims(self, token: str) -> dict[str, Any] | None:
        try:
            typ = jwt.get_unverified_header(token).get("typ")
            if typ not in TOKEN_TYPES:
                raise jwt.InvalidTokenError(f"typ {typ!r} is not an access token's")
            key = self._client().get_signing_key_from_jwt(token)
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=list(ALGORITHMS),
                audience=[self.audience, f"{self.audience}/"],
                issuer=self.issuer,
                leeway=LEEWAY_S,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.PyJWKClientConnectionError as exc:
            log.warning(
                "the OpenID Connect issuer's keys could not be read; its access tokens are "
                "refused until they can",
                extra={"issuer": self.issuer, "error": str(exc)[:300]},
            )
            return None
        except (jwt.PyJWTError, _IssuerError) as exc:
            log.info("MCP bearer token refused", extra={"reason": str(exc)[:300]})
            return None
        return claims

    def _client(self) -> jwt.PyJWKClient:
        """The issuer's key client, made on first use from its discovery document."""
        with self._discovery:
            if self._keys is None:
                self._keys = jwt.PyJWKClient(
                    self._jwks_uri(),
                    lifespan=KEYS_MAX_AGE_S,
                    timeout=self.timeout_s,
                    cooldown_duration=REFETCH_MIN_S,
                )
            return self._keys

    def _jwks_uri(self) -> str:
        where = f"{self.issuer.rstrip('/')}/.well-known/openid-configuration"
        try:
            with urllib.request.urlopen(where, timeout=self.timeout_s) as response:
                found = json.load(response)
        except (OSError, ValueError) as exc:
            raise jwt.PyJWKClientConnectionError(f"{where}: {exc}") from exc
        named = found.get("issuer") if isinstance(found, dict) else None
        if named != self.issuer:
            raise _IssuerError(
                f"{where} names issuer {named!r}, not {self.issuer!r} "
                "(TOOLFLEET_CONSOLE_OIDC_ISSUER must be the provider's issuer exactly)"
            )
        uri = found.get("jwks_uri")
        if not isinstance(uri, str) or not uri.startswith(("https://", "http://")):
            raise _IssuerError(f"{where} names no http(s) jwks_uri")
        return uri


class _IssuerError(Exception):
    """The issuer's discovery document is not what it should be."""
