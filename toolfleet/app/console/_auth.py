"""Who is asking: a bearer token (``console_tokens``), a trusted proxy's headers (only with
``console_proxy_secret``), or the signed session cookie an OpenID Connect login (or, on one's
own machine, the local login URL) sets. Anything else is nobody: 401."""

from __future__ import annotations

import getpass
import hmac
import secrets
from typing import TYPE_CHECKING, Any

from kernel.errors import ConfigurationError
from kernel.settings import Settings
from toolfleet.app.console._access import NotAuthenticatedError
from toolfleet.app.identity import (
    Identity,
    best_role,
    claim_values,
    identity_of,
    match_token,
    parse_tokens,
)

if TYPE_CHECKING:
    from starlette.requests import Request

SESSION_COOKIE = "toolfleet_console"
"""The session cookie: signed (itsdangerous), HttpOnly, SameSite=Lax, Secure over https."""

_SESSION_KEY = "who"
_SECRET_MIN = 32
_PROXY_SECRET_MIN = 16
_NAME_MAX = 200
_HOW_TO_SECRET = 'python -c "import secrets; print(secrets.token_urlsafe(32))"'


def _secret(value: Any) -> str | None:
    return None if value is None else str(value.get_secret_value())


def configured(settings: Settings) -> bool:
    """Whether ``settings`` configure a way to sign in (OIDC, tokens or a trusted proxy)."""
    return any(
        (settings.console_oidc_issuer, settings.console_tokens, settings.console_proxy_secret)
    )


class Authenticator:
    """Tells who sent a request, from the console's settings (and, on one's own machine, the
    process's local login token)."""

    def __init__(self, settings: Settings, *, local_token: str | None = None) -> None:
        self.settings = settings
        self.local_token = local_token
        self.local_name = f"local:{getpass.getuser()}"
        self.oidc = settings.console_oidc_issuer is not None
        raw_tokens = _secret(settings.console_tokens)
        self.tokens = parse_tokens(raw_tokens) if raw_tokens else []
        self.proxy_secret = _secret(settings.console_proxy_secret)
        session_secret = _secret(settings.console_session_secret)
        self._check(session_secret)
        # Without a configured secret (tokens or proxy only, or local), sessions are this
        # process's own: a restart signs every browser out.
        self.session_secret = session_secret or secrets.token_urlsafe(32)
        public = settings.console_public_url or ""
        self.secure_cookie = public.startswith("https://")

    def _check(self, session_secret: str | None) -> None:
        s = self.settings
        if not (configured(s) or self.local_token):
            raise ConfigurationError(
                "the console has no way to sign anyone in: set TOOLFLEET_CONSOLE_OIDC_ISSUER "
                "(OpenID Connect), TOOLFLEET_CONSOLE_TOKENS (API tokens) or "
                "TOOLFLEET_CONSOLE_PROXY_SECRET (a trusted proxy), or run `toolfleet console` "
                "on 127.0.0.1 for a local login URL (docs/console-access.md)"
            )
        if self.oidc:
            missing = [
                name
                for name, value in (
                    ("TOOLFLEET_CONSOLE_OIDC_CLIENT_ID", s.console_oidc_client_id),
                    ("TOOLFLEET_CONSOLE_PUBLIC_URL", s.console_public_url),
                    ("TOOLFLEET_CONSOLE_SESSION_SECRET", session_secret),
                )
                if not value
            ]
            if missing:
                raise ConfigurationError(
                    f"OpenID Connect login (TOOLFLEET_CONSOLE_OIDC_ISSUER) also needs "
                    f"{', '.join(missing)}"
                )
            if "openid" not in s.console_oidc_scopes.split():
                raise ConfigurationError(
                    "TOOLFLEET_CONSOLE_OIDC_SCOPES must include openid (the console signs in "
                    "with the ID token)"
                )
        if session_secret is not None and len(session_secret) < _SECRET_MIN:
            raise ConfigurationError(
                f"TOOLFLEET_CONSOLE_SESSION_SECRET is too short: at least {_SECRET_MIN} "
                f"characters, e.g. from {_HOW_TO_SECRET}"
            )
        if self.proxy_secret is not None and len(self.proxy_secret) < _PROXY_SECRET_MIN:
            raise ConfigurationError(
                f"TOOLFLEET_CONSOLE_PROXY_SECRET is too short: at least {_PROXY_SECRET_MIN} "
                f"characters, e.g. from {_HOW_TO_SECRET}"
            )
        if s.console_public_url and not s.console_public_url.startswith(("http://", "https://")):
            raise ConfigurationError(
                f"TOOLFLEET_CONSOLE_PUBLIC_URL {s.console_public_url!r} must start with "
                "https:// (or http:// on a private network)"
            )

    # --- who is asking ------------------------------------------------------------------------
    def identify(self, request: Request) -> Identity:
        """The identity of ``request``, or NotAuthenticatedError saying how to sign in (or
        NotAllowedError when the credentials are right but carry no role or tenant)."""
        authorization = request.headers.get("authorization")
        if authorization is not None:
            scheme, _, value = authorization.partition(" ")
            if scheme.lower() != "bearer" or not value.strip():
                raise NotAuthenticatedError(
                    "the Authorization header must be 'Bearer <token>' (a console API token)"
                )
            return self._bearer(value.strip())
        if self.proxy_secret is not None:
            sent = request.headers.get(self.settings.console_proxy_secret_header)
            if sent is not None:
                return self._proxied(request, sent)
        who = self.session_identity(request)
        if who is None:
            raise NotAuthenticatedError(self.how_to_sign_in())
        return who

    def how_to_sign_in(self) -> str:
        """What to do without credentials, for this console's configuration."""
        ways = []
        if self.oidc:
            ways.append("sign in at /auth/login")
        if self.local_token:
            ways.append("open the login URL `toolfleet console` printed")
        if self.tokens or self.local_token:
            ways.append("send Authorization: Bearer <token>")
        if self.proxy_secret is not None:
            ways.append("come through the console's authenticating proxy")
        return "not signed in: " + ", or ".join(ways)

    def _bearer(self, token: str) -> Identity:
        if self.local_token is not None and hmac.compare_digest(
            token.encode(), self.local_token.encode()
        ):
            return self.local_identity()
        match = match_token(self.tokens, token)
        if match is None:
            raise NotAuthenticatedError(
                "this bearer token is not one of the console's (TOOLFLEET_CONSOLE_TOKENS)"
            )
        return match.identity()

    def _proxied(self, request: Request, sent: str) -> Identity:
        assert self.proxy_secret is not None
        s = self.settings
        if not hmac.compare_digest(sent.encode(), self.proxy_secret.encode()):
            raise NotAuthenticatedError(
                f"the {s.console_proxy_secret_header} header does not carry the proxy secret "
                "(TOOLFLEET_CONSOLE_PROXY_SECRET)"
            )
        user = request.headers.get(s.console_proxy_user_header, "").strip()
        if not user or len(user) > _NAME_MAX or not user.isprintable():
            raise NotAuthenticatedError(
                f"the proxy sent no person in {s.console_proxy_user_header}"
            )
        # Browsers reach the console through the proxy with the proxy's own cookie, so their
        # decisions carry a CSRF token too: derived from the proxy secret, so that every
        # replica of the console expects the same one.
        csrf = hmac.new(self.proxy_secret.encode(), f"csrf:{user}".encode(), "sha256")
        return identity_of(
            "proxy",
            user,
            claim_values(request.headers.get(s.console_proxy_roles_header)),
            claim_values(request.headers.get(s.console_proxy_tenants_header)),
            roles_from=f"the proxy's {s.console_proxy_roles_header} header",
            tenants_from=f"the proxy's {s.console_proxy_tenants_header} header",
            csrf=csrf.hexdigest(),
        )

    def local_identity(self, csrf: str | None = None) -> Identity:
        """Whoever holds this process's local login token: an admin of every tenant, named
        after the user who started the console."""
        return Identity(self.local_name, "admin", None, csrf)

    # --- sessions -----------------------------------------------------------------------------
    def session_identity(self, request: Request) -> Identity | None:
        """The identity of the request's session cookie, if it holds one."""
        data = request.session.get(_SESSION_KEY)
        if not isinstance(data, dict):
            return None
        try:
            role = best_role([data["role"]])
            tenants = data["tenants"]
            scope = None if tenants is None else frozenset(str(t) for t in tenants)
            name, csrf = str(data["name"]), str(data["csrf"])
        except (KeyError, TypeError, AttributeError):  # written by another version: signed out
            return None
        return None if role is None else Identity(name, role, scope, csrf)

    @staticmethod
    def start_session(request: Request, who: Identity) -> Identity:
        """Sign ``who`` in on this browser: a fresh session with its own CSRF token."""
        request.session.clear()
        csrf = secrets.token_urlsafe(32)
        request.session[_SESSION_KEY] = {
            "name": who.name,
            "role": who.role,
            "tenants": None if who.tenants is None else sorted(who.tenants),
            "csrf": csrf,
        }
        return Identity(who.name, who.role, who.tenants, csrf)

    @staticmethod
    def end_session(request: Request) -> None:
        """Sign this browser out."""
        request.session.clear()
