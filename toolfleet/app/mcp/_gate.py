"""What an authenticated request may do: the tenant it acts for and the role its method needs.

Runs behind the ``mcp`` package's bearer check (no token, or one that does not check out, got
401 there) and in front of the MCP transport. The tenant comes from the token: the only one
it names, or, for a token of several tenants, the one the tenant header picks among them
(never one outside them). A method that acts (``tools/call``) needs the operator role; a
viewer may list. A refusal is HTTP 403 with ``WWW-Authenticate: Bearer
error="insufficient_scope"``, as the MCP authorization specification asks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp_types import INVALID_REQUEST
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from toolfleet.app.identity import Identity, Role
from toolfleet.app.mcp._tokens import CallerToken

CALLER_KEY = "toolfleet.caller"
"""Where the gate leaves the ``Caller`` in the request's ASGI scope for the handlers."""

ROLE_OF_METHOD: Mapping[str, Role] = {"tools/call": "operator", "tasks/cancel": "operator"}
"""The role each acting method needs; every other method (list, read, ping) needs viewer."""

_TENANT_MAX = 200


@dataclass(frozen=True)
class Caller:
    """Who sent a request and the one tenant it acts for."""

    identity: Identity
    tenant: str


class Refused(Exception):
    """A request the gate answers with 403: the message says why and what to do."""

    def __init__(self, message: str, *, scope: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.scope = scope


def tenant_of(who: Identity, asked: str | None, header: str) -> str:
    """The tenant a request of ``who`` acts for: the one its token names, or the one the
    ``header`` picks (``asked``) among the token's tenants; Refused otherwise."""
    if asked is not None:
        asked = asked.strip()
        if not asked or len(asked) > _TENANT_MAX or not asked.isprintable():
            raise Refused(f"the {header} header names no tenant id")
        if who.tenants is not None and asked not in who.tenants:
            raise Refused(
                f"tenant {asked} is not in the scope of {who.name} (it may act for "
                f"{who.scope_text})"
            )
        return asked
    if who.tenants is not None and len(who.tenants) == 1:
        return next(iter(who.tenants))
    raise Refused(
        f"{who.name} may act for {who.scope_text}: send the {header} header naming the one "
        "tenant this request is for"
    )


def request_of(body: bytes) -> tuple[str | None, Any]:
    """The JSON-RPC method and id of a request body ((None, None): not JSON, a response, a
    notification's id is None)."""
    try:
        message = json.loads(body)
    except ValueError:
        return None, None
    if not isinstance(message, dict):
        return None, None
    method = message.get("method")
    return (method if isinstance(method, str) else None), message.get("id")


def origin_allowed(origin: str, allowed: tuple[str, ...]) -> bool:
    """Whether a browser's ``Origin`` is one of ``allowed`` (``scheme://host:*``: any port)."""
    for pattern in allowed:
        if origin == pattern:
            return True
        if pattern.endswith(":*") and origin.startswith(pattern[:-1]):
            port = origin[len(pattern) - 1 :]
            if port.isdigit():
                return True
    return False


def check_role(who: Identity, method: str | None) -> None:
    """Refused unless ``who``'s role may call ``method``."""
    needed = ROLE_OF_METHOD.get(method or "")
    if needed is not None and not who.may(needed):
        raise Refused(
            f"{method} needs the {needed} role; {who.name} has the {who.role} role (roles come "
            "from the token's entry or the identity provider's roles claim)",
            scope=needed,
        )


class Gate:
    """ASGI middleware: resolves the ``Caller`` of an authenticated request, or answers 403."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        tenant_header: str,
        resource_metadata_url: str | None,
        max_body_bytes: int,
        allowed_origins: tuple[str, ...] = (),
    ) -> None:
        self.app = app
        self.tenant_header = tenant_header
        self.resource_metadata_url = resource_metadata_url
        self.max_body_bytes = max_body_bytes
        self.allowed_origins = allowed_origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        user = scope.get("user")
        token = user.access_token if isinstance(user, AuthenticatedUser) else None
        if not isinstance(token, CallerToken):  # the bearer check lets nothing else through
            await self._refuse(send, "not authenticated", status=401, error="invalid_token")
            return
        headers = Headers(scope=scope)
        replay: list[Message] = []
        method, request_id = None, None
        if scope.get("method") == "POST":
            body, replay = await self._body(receive)
            if body is None:
                await self._refuse(
                    send, "the request body is too large", status=413, error="invalid_request"
                )
                return
            method, request_id = request_of(body)
        try:
            origin = headers.get("origin")
            if origin is not None and not origin_allowed(origin, self.allowed_origins):
                # The MCP transport asks it: a page of another origin never gets through.
                raise Refused(f"origin {origin[:200]} may not call this door")
            if token.identity is None:
                raise Refused(token.refusal or "this token may do nothing here")
            tenant = tenant_of(token.identity, headers.get(self.tenant_header), self.tenant_header)
            check_role(token.identity, method)
        except Refused as refused:
            await self._refuse(send, refused.message, scope=refused.scope, request_id=request_id)
            return
        scope[CALLER_KEY] = Caller(token.identity, tenant)

        async def replayed() -> Message:
            if replay:
                return replay.pop(0)
            return await receive()

        await self.app(scope, replayed, send)

    async def _body(self, receive: Receive) -> tuple[bytes | None, list[Message]]:
        """The whole request body (None past the limit) and the messages to hand on."""
        chunks: list[bytes] = []
        size = 0
        messages: list[Message] = []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None, messages
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        # The transport reads one message with the whole body, then whatever follows.
        rest = [m for m in messages if m["type"] != "http.request"]
        return body, [{"type": "http.request", "body": body, "more_body": False}, *rest]

    async def _refuse(
        self,
        send: Send,
        description: str,
        *,
        status: int = 403,
        error: str = "insufficient_scope",
        scope: str | None = None,
        request_id: Any = None,
    ) -> None:
        """Answer ``status`` with the bearer challenge, and a JSON-RPC error as the body: an
        MCP client shows its message (the reason) instead of a bare status."""
        parts = [f'error="{error}"', f'error_description="{_quoted(description)}"']
        if scope:
            parts.append(f'scope="{scope}"')
        if self.resource_metadata_url:
            parts.append(f'resource_metadata="{self.resource_metadata_url}"')
        data = {"error": error, **({"scope": scope} if scope else {})}
        body = json.dumps(
            {"jsonrpc": "2.0", "id": request_id,
             "error": {"code": INVALID_REQUEST, "message": description, "data": data}}
        ).encode()  # fmt: skip
        headers: list[tuple[bytes, bytes]] = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        if status in (401, 403):
            challenge = f"Bearer {', '.join(parts)}"
            headers.append((b"www-authenticate", challenge.encode("latin-1", "replace")))
        start: dict[str, Any] = {"type": "http.response.start", "status": status,
                                 "headers": headers}  # fmt: skip
        await send(start)
        await send({"type": "http.response.body", "body": body})


def _quoted(text: str) -> str:
    """``text`` as an RFC 7230 quoted-string's content (no quotes or backslashes, one line)."""
    return " ".join(text.replace("\\", "/").replace('"', "'").split())
