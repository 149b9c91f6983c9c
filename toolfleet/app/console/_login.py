"""Signing in and out: OpenID Connect (authorization code with PKCE S256, through authlib;
the ID token's signature, issuer, audience, nonce and expiry are verified), the login URL of a
console on one's own machine, and the small pages that say what went wrong."""

from __future__ import annotations

import hmac
import html
import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import httpx
from joserfc.errors import JoseError
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from kernel.errors import ConfigurationError
from kernel.settings import Settings
from toolfleet.app.console._access import CSRF_HEADER
from toolfleet.app.console._auth import Authenticator
from toolfleet.app.identity import claims_identity
from toolfleet.app.operations import NotAllowedError

if TYPE_CHECKING:
    from starlette.requests import Request

log = logging.getLogger(__name__)

LOGIN_PATH = "/auth/login"
CALLBACK_PATH = "/auth/callback"
LOGOUT_PATH = "/auth/logout"
SIGNED_OUT_PATH = "/auth/signed-out"
LOCAL_TOKEN_PARAM = "token"
"""The query parameter of the local login URL (``/?token=...``)."""

_NEXT_KEY = "next"
_HTTP_TIMEOUT_S = 10.0


def page(title: str, message: str, *, status: int, link: tuple[str, str] | None = None) -> Response:
    """A small page of the console's style saying ``message`` (escaped), with a link."""
    more = ""
    if link is not None:
        href, text = link
        more = f'<p><a href="{html.escape(href)}">{html.escape(text)}</a></p>'
    body = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)} · toolfleet console</title>"
        '<link rel="stylesheet" href="/static/console.css"></head>'
        '<body><header class="top"><a class="brand" href="/">toolfleet console</a></header>'
        f'<main id="main" class="auth"><h1>{html.escape(title)}</h1>'
        f'<p id="auth-message">{html.escape(message)}</p>{more}</main></body></html>'
    )
    return HTMLResponse(body, status_code=status)


def id_token_options(issuer: str, client_id: str | None) -> dict[str, Any]:
    """How authlib checks an ID token's claims (besides its signature, nonce and times): it
    must name the issuer, and this client among its audiences (authlib alone would accept a
    token for another audience that names this client as its ``azp``)."""
    return {
        "iss": {"essential": True, "values": [issuer]},
        "aud": {"essential": True, "values": [client_id]},
        "exp": {"essential": True},
    }


def safe_next(raw: str | None) -> str:
    """Where to go after signing in: a path of this console only (never another site)."""
    if not raw or not raw.startswith("/") or raw.startswith(("//", "/\\")) or "\\" in raw:
        return "/"
    if not raw.isprintable() or raw.startswith("/auth/"):
        return "/"
    return raw


class Login:
    """The console's sign-in and sign-out routes."""

    def __init__(self, settings: Settings, auth: Authenticator) -> None:
        self.settings = settings
        self.auth = auth
        self._client: Any = self._register() if auth.oidc else None
        self._checked = False

    def _register(self) -> Any:
        from authlib.integrations.starlette_client import OAuth  # type: ignore[import-untyped]

        s = self.settings
        assert s.console_oidc_issuer is not None
        kwargs: dict[str, Any] = {
            "scope": s.console_oidc_scopes,
            "code_challenge_method": "S256",
            "timeout": _HTTP_TIMEOUT_S,
        }
        secret = s.console_oidc_client_secret
        if secret is None:  # a public client: PKCE is what protects the code
            kwargs["token_endpoint_auth_method"] = "none"
        oauth = OAuth()
        return oauth.register(
            "console",
            client_id=s.console_oidc_client_id,
            client_secret=None if secret is None else secret.get_secret_value(),
            server_metadata_url=(
                s.console_oidc_issuer.rstrip("/") + "/.well-known/openid-configuration"
            ),
            client_kwargs=kwargs,
        )

    @property
    def _issuer(self) -> str:
        assert self.settings.console_oidc_issuer is not None
        return self.settings.console_oidc_issuer

    @property
    def _redirect_uri(self) -> str:
        assert self.settings.console_public_url is not None
        return self.settings.console_public_url.rstrip("/") + CALLBACK_PATH

    async def _metadata(self) -> dict[str, Any]:
        """The provider's discovery document, checked once: it must name the configured
        issuer and offer PKCE with S256."""
        metadata: dict[str, Any] = await self._client.load_server_metadata()
        if not self._checked:
            named = str(metadata.get("issuer", ""))
            if named.rstrip("/") != self._issuer.rstrip("/"):
                raise ConfigurationError(
                    f"the identity provider's discovery document names issuer {named!r}, not "
                    f"TOOLFLEET_CONSOLE_OIDC_ISSUER {self._issuer!r}: set it to the issuer "
                    "exactly as the provider names it"
                )
            methods = metadata.get("code_challenge_methods_supported")
            if methods is not None and "S256" not in methods:
                raise ConfigurationError(
                    "the identity provider does not offer PKCE with S256 "
                    "(code_challenge_methods_supported), which the console requires"
                )
            self._checked = True
        return metadata

    def _unavailable(self, exc: Exception) -> Response:
        log.warning("console login: identity provider unreachable", extra={"error": repr(exc)})
        return page(
            "Sign-in unavailable",
            f"The identity provider at {self._issuer} does not answer ({type(exc).__name__}); "
            "retry in a moment.",
            status=503,
            link=(LOGIN_PATH, "Retry"),
        )

    # --- routes -------------------------------------------------------------------------------
    async def login(self, request: Request) -> Response:
        """Send the browser to the identity provider (with state, nonce and a PKCE S256
        challenge, kept in the session until the callback)."""
        if self._client is None:
            return page(
                "No sign-in page",
                f"This console has no OpenID Connect login. {self.auth.how_to_sign_in()}.",
                status=404,
            )
        try:
            await self._metadata()
        except ConfigurationError as exc:
            return page("Sign-in misconfigured", str(exc), status=500)
        except httpx.HTTPError as exc:
            return self._unavailable(exc)
        request.session[_NEXT_KEY] = safe_next(request.query_params.get("next"))
        response: Response = await self._client.authorize_redirect(request, self._redirect_uri)
        return response

    async def callback(self, request: Request) -> Response:
        """The provider sends the browser back here with a code: exchange it (with the PKCE
        verifier), verify the ID token, and sign the person in with their role and tenants."""
        from authlib.common.errors import AuthlibBaseError  # type: ignore[import-untyped]

        if self._client is None:
            return page("No sign-in page", "This console has no OpenID Connect login.", status=404)
        retry = (LOGIN_PATH, "Sign in again")
        try:
            metadata = await self._metadata()
            options = id_token_options(metadata["issuer"], self.settings.console_oidc_client_id)
            token = await self._client.authorize_access_token(request, claims_options=options)
            claims = token.get("userinfo")
            if claims is None:
                return page(
                    "Sign-in failed",
                    "The identity provider returned no ID token: "
                    "TOOLFLEET_CONSOLE_OIDC_SCOPES must include openid.",
                    status=401,
                    link=retry,
                )
            claims = dict(claims)
            if self._lacks_console_claims(claims) and metadata.get("userinfo_endpoint"):
                claims = await self._with_userinfo(token, claims)
        except (AuthlibBaseError, JoseError) as exc:
            log.info("console login refused", extra={"error": repr(exc)})
            message = f"The sign-in did not check out: {exc}."
            return page("Sign-in failed", message, status=401, link=retry)
        except ConfigurationError as exc:
            return page("Sign-in misconfigured", str(exc), status=500)
        except httpx.HTTPError as exc:
            return self._unavailable(exc)
        next_path = safe_next(request.session.get(_NEXT_KEY))
        try:
            who = claims_identity(claims, self.settings)
        except NotAllowedError as exc:
            self.auth.end_session(request)
            log.info("console login without a role", extra={"error": str(exc)})
            return page("Not allowed", f"{exc}.", status=403)
        self.auth.start_session(request, who)
        log.info("console login", extra={"operator": who.name, "role": who.role})
        return RedirectResponse(next_path, status_code=303)

    def _lacks_console_claims(self, claims: dict[str, Any]) -> bool:
        s = self.settings
        return not all(
            c in claims or c.split(".")[0] in claims
            for c in (s.console_oidc_roles_claim, s.console_oidc_tenants_claim)
        )

    async def _with_userinfo(self, token: dict[str, Any], claims: dict[str, Any]) -> dict[str, Any]:
        """The ID token's claims, with the userinfo endpoint's where the ID token has none
        (many providers put scope claims there only); the subject must be the same."""
        info = dict(await self._client.userinfo(token=token))
        if info.get("sub") != claims.get("sub"):
            return claims
        return {**info, **claims}

    async def logout(self, request: Request) -> Response:
        """Sign this browser out: a POST from the console's page with the session's CSRF
        token in ``X-Toolfleet-CSRF``. Answers where to go next (JSON ``redirect``): the
        identity provider's logout, when it offers RP-initiated logout, then back to the
        signed-out page."""
        who = self.auth.session_identity(request)
        if who is not None:
            sent = request.headers.get(CSRF_HEADER, "")
            if not hmac.compare_digest(sent.encode(), (who.csrf or "").encode()):
                return JSONResponse(
                    {"error": f"signing out needs the session's CSRF token in {CSRF_HEADER}"},
                    status_code=403,
                )
            log.info("console logout", extra={"operator": who.name})
        self.auth.end_session(request)
        return JSONResponse({"redirect": await self._after_logout()})

    async def _after_logout(self) -> str:
        if self._client is None:
            return SIGNED_OUT_PATH
        try:
            metadata = await self._metadata()
        except (ConfigurationError, httpx.HTTPError):
            return SIGNED_OUT_PATH
        end_session = metadata.get("end_session_endpoint")
        if not end_session:
            return SIGNED_OUT_PATH
        assert self.settings.console_public_url is not None
        back = self.settings.console_public_url.rstrip("/") + SIGNED_OUT_PATH
        query = urlencode(
            {"client_id": self.settings.console_oidc_client_id, "post_logout_redirect_uri": back}
        )
        return f"{end_session}{'&' if '?' in end_session else '?'}{query}"

    async def signed_out(self, _request: Request) -> Response:
        """Where a signed-out browser lands."""
        link = (LOGIN_PATH, "Sign in again") if self._client is not None else ("/", "Console")
        return page(
            "Signed out", "You are signed out of the toolfleet console.", status=200, link=link
        )

    def local(self, request: Request) -> Response | None:
        """The local login URL (``/?token=...``): with this process's token, sign the browser
        in and go to the same page without the token; None when the request has no token."""
        token = request.query_params.get(LOCAL_TOKEN_PARAM)
        if token is None:
            return None
        local = self.auth.local_token
        if local is None or not hmac.compare_digest(token.encode(), local.encode()):
            return page(
                "Not signed in",
                "This login URL is not this console's: use the one `toolfleet console` printed "
                "when it started (a restart prints a new one).",
                status=401,
            )
        self.auth.start_session(request, self.auth.local_identity())
        query = [(k, v) for k, v in request.query_params.multi_items() if k != LOCAL_TOKEN_PARAM]
        path = request.url.path + (f"?{urlencode(query)}" if query else "")
        return RedirectResponse(safe_next(path), status_code=303)
