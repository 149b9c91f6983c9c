"""The console's access rules, as pure logic: API tokens as configured, identities from claims
and proxy headers, roles and tenant scopes, CSRF tokens, where a login may lead, and the
session cookie's flags."""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any

import pytest
from pydantic import SecretStr
from starlette.requests import Request
from starlette.testclient import TestClient

from kernel.errors import ConfigurationError
from kernel.settings import Settings
from toolfleet.app.console import (
    CSRF_HEADER,
    ConsoleOptions,
    CrossSiteRequestError,
    Identity,
    NotAuthenticatedError,
    create_app,
)
from toolfleet.app.console._access import Access
from toolfleet.app.console._auth import Authenticator
from toolfleet.app.console._login import Login, id_token_options, safe_next
from toolfleet.app.identity import best_role, claims_identity, parse_tokens, tenant_set
from toolfleet.app.operations import NotAllowedError

PROXY_SECRET = "a-proxy-secret-0123456789"


def _token(name: str, role: str = "operator", tenants: list[str] | None = None) -> dict[str, Any]:
    digest = hashlib.sha256(f"secret-{name}".encode()).hexdigest()
    return {"name": name, "sha256": digest, "role": role, "tenants": tenants or ["acme"]}


@pytest.fixture(autouse=True)
def _no_console_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("TOOLFLEET_CONSOLE_")]:
        monkeypatch.delenv(name)


def _settings(**kw: Any) -> Settings:
    return Settings(**kw)


def _request(
    headers: dict[str, str] | None = None, session: dict[str, Any] | None = None
) -> Request:
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/api/approvals/decide",
        "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
        "session": session if session is not None else {},
    }
    return Request(scope)


# --- API tokens -------------------------------------------------------------------------------
def test_tokens_are_kept_as_their_sha256_with_a_role_and_tenants() -> None:
    [ci, ops] = parse_tokens(
        json.dumps([_token("ci-bot", "viewer", ["*"]), _token("ops", "admin", ["acme", "beta"])])
    )
    assert (ci.name, ci.role, ci.tenants) == ("ci-bot", "viewer", None)
    assert ci.digest == hashlib.sha256(b"secret-ci-bot").digest()
    assert (ops.role, ops.tenants) == ("admin", frozenset({"acme", "beta"}))


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("not json", "TOOLFLEET_CONSOLE_TOKENS is not valid"),
        ('{"name": "x"}', "not a JSON list"),
        (json.dumps([{**_token("x"), "sha256": "abc"}]), "sha256"),
        (json.dumps([_token("x", "root")]), "role"),
        (json.dumps([{**_token("x"), "tenants": []}]), "tenants"),
        (json.dumps([{**_token("x"), "token": "plain"}]), "token"),
        (json.dumps([_token("x"), _token("x")]), "names a token twice"),
        (json.dumps([_token("x", tenants=[" "])]), "lists no tenant"),
    ],
)
def test_a_wrong_token_list_is_refused_saying_what_to_write(raw: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match="TOOLFLEET_CONSOLE_TOKENS") as caught:
        parse_tokens(raw)
    assert says in str(caught.value)


# --- identities from claims -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("claims", "settings", "role", "tenants"),
    [
        ({"toolfleet_roles": ["viewer", "operator"], "toolfleet_tenants": ["acme"]}, {},
         "operator", frozenset({"acme"})),
        ({"toolfleet_roles": "viewer admin", "toolfleet_tenants": "acme, beta"}, {},
         "admin", frozenset({"acme", "beta"})),
        ({"toolfleet_roles": ["Operator", "billing"], "toolfleet_tenants": ["*"]}, {},
         "operator", None),
        ({"realm_access": {"roles": ["viewer"]}, "tenants": ["acme"]},
         {"console_oidc_roles_claim": "realm_access.roles",
          "console_oidc_tenants_claim": "tenants"},
         "viewer", frozenset({"acme"})),
        ({"https://toolfleet.example/roles": ["admin"], "https://toolfleet.example/t": ["*"]},
         {"console_oidc_roles_claim": "https://toolfleet.example/roles",
          "console_oidc_tenants_claim": "https://toolfleet.example/t"},
         "admin", None),
    ],
)  # fmt: skip
def test_the_role_and_tenants_come_from_the_configured_claims(
    claims: dict[str, Any], settings: dict[str, Any], role: str, tenants: frozenset[str] | None
) -> None:
    who = claims_identity({"sub": "u1", "email": "a@corp", **claims}, _settings(**settings))
    assert (who.name, who.role, who.tenants) == ("oidc:a@corp", role, tenants)


@pytest.mark.parametrize(
    ("claims", "name"),
    [
        ({"email": "a@corp", "preferred_username": "ann"}, "oidc:a@corp"),
        ({"email": "a@corp", "email_verified": False, "preferred_username": "ann"}, "oidc:ann"),
        ({"email": "a@corp", "email_verified": False}, "oidc:u1"),
        ({}, "oidc:u1"),
    ],
)
def test_a_person_is_named_by_a_verified_email_then_the_username_then_the_subject(
    claims: dict[str, Any], name: str
) -> None:
    full = {"sub": "u1", "toolfleet_roles": ["viewer"], "toolfleet_tenants": ["*"], **claims}
    assert claims_identity(full, _settings()).name == name


def test_an_identity_without_a_role_or_a_tenant_is_refused_never_defaulted() -> None:
    with pytest.raises(NotAllowedError, match="no console role: the claim toolfleet_roles"):
        claims_identity({"sub": "u", "toolfleet_tenants": ["*"]}, _settings())
    with pytest.raises(NotAllowedError, match="no console role"):
        claims_identity({"sub": "u", "toolfleet_roles": ["reader"]}, _settings())
    with pytest.raises(NotAllowedError, match="may see no tenant: the claim toolfleet_tenants"):
        claims_identity({"sub": "u", "toolfleet_roles": ["admin"]}, _settings())


def test_roles_order_and_every_tenant() -> None:
    assert best_role(["viewer", "admin", "operator"]) == "admin"
    assert best_role(["superuser"]) is None
    assert tenant_set(["acme", " ", "beta"]) == frozenset({"acme", "beta"})
    assert tenant_set(["acme", "*"]) is None


# --- scopes and roles -------------------------------------------------------------------------
ANA = Identity("oidc:ana", "operator", frozenset({"acme", "beta"}))
ROOT = Identity("token:root", "admin", None)
VERA = Identity("oidc:vera", "viewer", None)


def test_a_scope_is_the_identitys_tenants_narrowed_by_the_consoles_own() -> None:
    every = Access()
    assert every.tenants(ANA) == frozenset({"acme", "beta"}) and every.tenants(ROOT) is None
    assert every.scope(ANA, "beta") == frozenset({"beta"}) and every.scope(ANA, None) == ANA.tenants
    with pytest.raises(NotAllowedError, match="tenant gamma is not in the scope of oidc:ana"):
        every.scope(ANA, "gamma")
    acme = Access(tenant="acme")
    assert acme.tenants(ROOT) == frozenset({"acme"}) and acme.tenants(ANA) == frozenset({"acme"})
    with pytest.raises(NotAllowedError, match="for tenant acme only"):
        acme.check_tenant(ROOT, "beta")
    assert Access(tenant="gamma").tenants(ANA) == frozenset()  # sees nothing there


def test_each_action_names_the_role_it_needs() -> None:
    every = Access()
    every.require(ANA, "operator", "deciding")
    with pytest.raises(NotAllowedError, match="deciding needs the operator role; oidc:vera has"):
        every.require(VERA, "operator", "deciding")
    every.fleet_wide(ROOT, "pinning quote")
    assert every.may_act_fleet_wide(ROOT) and not every.may_act_fleet_wide(ANA)
    with pytest.raises(NotAllowedError, match="needs the admin role"):
        every.fleet_wide(ANA, "pinning quote")
    some = Identity("token:acme-admin", "admin", frozenset({"acme"}))
    with pytest.raises(NotAllowedError, match="touches every tenant"):
        every.fleet_wide(some, "pinning quote")
    with pytest.raises(NotAllowedError, match="this console shows one tenant"):
        Access(tenant="acme").fleet_wide(ROOT, "pinning quote")


def test_a_browser_decision_carries_its_sessions_csrf_token_and_is_json() -> None:
    who = Identity("oidc:ana", "operator", None, csrf="the-token")
    json_type = {"content-type": "application/json"}
    Access.check_decision(_request({**json_type, CSRF_HEADER: "the-token"}), who)
    for headers in (json_type, {**json_type, CSRF_HEADER: "the-tokeN"}):
        with pytest.raises(CrossSiteRequestError, match=CSRF_HEADER):
            Access.check_decision(_request(headers), who)
    with pytest.raises(CrossSiteRequestError, match="application/json"):
        Access.check_decision(_request({CSRF_HEADER: "the-token"}), who)
    bearer = Identity("token:ci", "operator", None)  # no browser: no CSRF token asked
    Access.check_decision(_request(json_type), bearer)


# --- who is asking ----------------------------------------------------------------------------
def _auth(**kw: Any) -> Authenticator:
    return Authenticator(_settings(**kw))


def test_a_bearer_token_names_its_entry_and_a_wrong_one_is_nobody() -> None:
    auth = _auth(console_tokens=SecretStr(json.dumps([_token("ci"), _token("ops", "admin")])))
    who = auth.identify(_request({"Authorization": "Bearer secret-ops"}))
    assert (who.name, who.role, who.tenants, who.csrf) == (
        "token:ops", "admin", frozenset({"acme"}), None,
    )  # fmt: skip
    for header in ("Bearer secret-nobody", "Bearer", "Basic YTpi", "secret-ops"):
        with pytest.raises(NotAuthenticatedError):
            auth.identify(_request({"Authorization": header}))
    with pytest.raises(NotAuthenticatedError, match="not signed in: send Authorization: Bearer"):
        auth.identify(_request({"X-Forwarded-User": "boss@corp"}))


def test_proxy_headers_count_only_with_the_proxy_secret() -> None:
    person = {
        "X-Forwarded-User": "bob",
        "X-Forwarded-Roles": "operator",
        "X-Forwarded-Tenants": "acme,beta",
    }
    # Not configured: the headers mean nothing, the secret header included.
    unconfigured = _auth(console_tokens=SecretStr(json.dumps([_token("ci")])))
    with pytest.raises(NotAuthenticatedError):
        unconfigured.identify(_request({**person, "X-Toolfleet-Proxy-Secret": PROXY_SECRET}))
    auth = _auth(console_proxy_secret=SecretStr(PROXY_SECRET))
    with pytest.raises(NotAuthenticatedError, match="not signed in"):
        auth.identify(_request(person))
    with pytest.raises(NotAuthenticatedError, match="proxy secret"):
        auth.identify(_request({**person, "X-Toolfleet-Proxy-Secret": PROXY_SECRET[:-1]}))
    who = auth.identify(_request({**person, "X-Toolfleet-Proxy-Secret": PROXY_SECRET}))
    assert (who.name, who.role, who.tenants) == (
        "proxy:bob",
        "operator",
        frozenset({"acme", "beta"}),
    )
    assert who.csrf and len(who.csrf) == 64  # the same on every replica: derived from the secret
    again = auth.identify(_request({**person, "X-Toolfleet-Proxy-Secret": PROXY_SECRET}))
    assert again.csrf == who.csrf
    with pytest.raises(NotAuthenticatedError, match="no person in X-Forwarded-User"):
        auth.identify(_request({"X-Toolfleet-Proxy-Secret": PROXY_SECRET}))
    with pytest.raises(NotAllowedError, match="X-Forwarded-Roles header"):
        auth.identify(
            _request({**person, "X-Forwarded-Roles": "", "X-Toolfleet-Proxy-Secret": PROXY_SECRET})
        )


def test_a_session_holds_the_identity_with_a_fresh_csrf_token() -> None:
    auth = _auth(console_tokens=SecretStr(json.dumps([_token("ci")])))
    request = _request()
    signed = auth.start_session(request, Identity("oidc:ana", "operator", frozenset({"acme"})))
    assert signed.csrf and len(signed.csrf) >= 40
    assert auth.identify(_request(session=dict(request.session))) == signed
    other = auth.start_session(_request(), Identity("oidc:ana", "operator", None))
    assert other.csrf != signed.csrf
    for broken in ({"who": {"name": "x"}}, {"who": {"name": "x", "role": "god", "tenants": None,
                                                     "csrf": "c"}}, {"who": "x"}):  # fmt: skip
        assert auth.session_identity(_request(session=broken)) is None


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({}, "no way to sign anyone in"),
        ({"console_oidc_issuer": "https://idp"},
         "also needs TOOLFLEET_CONSOLE_OIDC_CLIENT_ID, TOOLFLEET_CONSOLE_PUBLIC_URL, "
         "TOOLFLEET_CONSOLE_SESSION_SECRET"),
        ({"console_oidc_issuer": "https://idp", "console_oidc_client_id": "c",
          "console_public_url": "https://c", "console_session_secret": SecretStr("short")},
         "TOOLFLEET_CONSOLE_SESSION_SECRET is too short"),
        ({"console_oidc_issuer": "https://idp", "console_oidc_client_id": "c",
          "console_public_url": "https://c", "console_session_secret": SecretStr("s" * 32),
          "console_oidc_scopes": "email profile"}, "must include openid"),
        ({"console_proxy_secret": SecretStr("short")},
         "TOOLFLEET_CONSOLE_PROXY_SECRET is too short"),
        ({"console_proxy_secret": SecretStr(PROXY_SECRET), "console_public_url": "console.example"},
         "must start with https://"),
    ],
)  # fmt: skip
def test_an_incomplete_sign_in_configuration_is_refused_naming_the_setting(
    settings: dict[str, Any], says: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        _auth(**settings)
    assert says in str(caught.value)


# --- where a login leads, and its cookie ------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "goes"),
    [
        ("/tasks?x=1", "/tasks?x=1"),
        (None, "/"),
        ("https://evil.example/", "/"),
        ("//evil.example/", "/"),
        ("/\\evil.example", "/"),
        ("/auth/logout", "/"),
        ("tasks", "/"),
    ],
)
def test_after_signing_in_the_browser_goes_to_a_page_of_this_console_only(
    raw: str | None, goes: str
) -> None:
    assert safe_next(raw) == goes


@pytest.mark.parametrize(
    ("public_url", "secure"), [("https://console.example", True), (None, False)]
)
def test_the_session_cookie_is_httponly_lax_and_secure_over_https(
    public_url: str | None, secure: bool
) -> None:
    settings = _settings(console_public_url=public_url)
    app = create_app(settings, ConsoleOptions(local_token="local-token-0123456789"))
    browser = TestClient(app, base_url="https://console.example", follow_redirects=False)
    login = browser.get("/circuits", params={"token": "local-token-0123456789"})
    assert login.status_code == 303 and login.headers["location"] == "/circuits"
    cookie = [part.strip().lower() for part in login.headers["set-cookie"].split(";")]
    assert cookie[0].startswith("toolfleet_console=")
    assert "httponly" in cookie and "samesite=lax" in cookie and "path=/" in cookie
    assert ("secure" in cookie) is secure
    assert f"max-age={settings.console_session_max_age_s}" in cookie


# --- the ID token's claims --------------------------------------------------------------------
def _id_token(**claims: Any) -> None:
    from authlib.oidc.core import CodeIDToken  # type: ignore[import-untyped]

    now = int(time.time())
    base = {"iss": "https://idp", "sub": "u1", "aud": "console", "exp": now + 60, "iat": now,
            "nonce": "n-1"}  # fmt: skip
    token = CodeIDToken(
        {**base, **claims}, {"alg": "RS256"}, id_token_options("https://idp", "console"),
        {"nonce": "n-1", "client_id": "console"},
    )  # fmt: skip
    token.validate(leeway=0)


def test_an_id_token_must_name_the_issuer_this_client_the_nonce_and_be_unexpired() -> None:
    from joserfc.errors import JoseError

    _id_token()
    _id_token(aud=["console", "other"], azp="console")
    refused = [
        {"iss": "https://elsewhere"},
        {"aud": "other"},
        {"aud": ["other"], "azp": "console"},  # for another client, which names us as azp
        {"nonce": "n-2"},
        {"exp": int(time.time()) - 5},
    ]
    for claims in refused:
        with pytest.raises(JoseError):
            _id_token(**claims)


class _Discovery:
    """What authlib's client answers for the provider's discovery document."""

    def __init__(self, metadata: dict[str, Any]) -> None:
        self.metadata = metadata

    async def load_server_metadata(self) -> dict[str, Any]:
        return self.metadata


@pytest.mark.parametrize(
    ("metadata", "says"),
    [
        ({"issuer": "https://idp.example/other"}, "names issuer 'https://idp.example/other'"),
        ({"issuer": "https://idp.example/", "code_challenge_methods_supported": ["plain"]},
         "PKCE with S256"),
    ],
)  # fmt: skip
async def test_a_provider_whose_discovery_document_does_not_match_is_refused(
    metadata: dict[str, Any], says: str
) -> None:
    settings = _settings(
        console_oidc_issuer="https://idp.example",
        console_oidc_client_id="console",
        console_public_url="https://console.example",
        console_session_secret=SecretStr("s" * 32),
    )
    login = Login(settings, Authenticator(settings))
    login._client = _Discovery(metadata)
    with pytest.raises(ConfigurationError) as caught:
        await login._metadata()
    assert says in str(caught.value)
    login._client = _Discovery({"issuer": "https://idp.example/"})  # a trailing slash is the same
    assert (await login._metadata())["issuer"] == "https://idp.example/"
