"""Who may see and decide what on a console: the operator's identity, the tenant scope, and
the check that a decision was sent by the console's own page."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from toolfleet.app.operations import NotAllowedError

if TYPE_CHECKING:
    from starlette.requests import Request

CSRF_HEADER = "X-Toolfleet-Console"
"""Sent by the console's script with every decision. A form or link on another site cannot
send a custom header, and a cross-site script cannot either without a CORS preflight, which
the console never answers."""

_NAME_MAX = 200


class NoOperatorError(NotAllowedError):
    """A console decision came with nobody to decide: no identity header from the auth proxy
    and no fixed ``--operator``; the message says what to configure."""


class CrossSiteRequestError(NotAllowedError):
    """A decision that the console's own page did not send (no ``X-Toolfleet-Console``
    header, or not JSON): refused, as a cross-site request could be."""


@dataclass(frozen=True)
class Access:
    """A console's access rules, from its options."""

    tenant: str | None = None
    """The only tenant this console shows and acts for (None: every tenant)."""
    operator: str | None = None
    """A fixed operator name, for a console on one's own machine."""
    operator_header: str | None = "X-Forwarded-User"
    """The request header an authenticating proxy sets to the operator's name."""

    def who(self, request: Request) -> tuple[str | None, str]:
        """The operator of ``request`` (None: unknown) and where that came from."""
        if self.operator is not None:
            return self.operator, "--operator"
        if self.operator_header:
            name = request.headers.get(self.operator_header, "").strip()
            if name and len(name) <= _NAME_MAX and name.isprintable():
                return name, f"header {self.operator_header}"
        return None, "none"

    def operator_of(self, request: Request) -> str:
        """The operator who decides, or NoOperatorError saying what to configure."""
        name, _source = self.who(request)
        if name is None:
            header = self.operator_header
            via = (
                f"the {header} header, which the auth proxy in front of the console sets "
                "(--operator-header names another)"
                if header
                else "an identity header (--operator-header)"
            )
            raise NoOperatorError(
                f"decisions need an operator: this console takes the operator from {via}, or, "
                "on your own machine, start it with --operator NAME"
            )
        return name

    def check_decision(self, request: Request) -> None:
        """Refuse a decision the console's page did not send."""
        if request.headers.get(CSRF_HEADER) != "1":
            raise CrossSiteRequestError(
                f"decisions must come from the console's page (header {CSRF_HEADER}: 1)"
            )
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            raise CrossSiteRequestError("decisions are sent as application/json")

    def scope(self, requested: str | None) -> str | None:
        """The tenant a request may see: this console's own, or what it asked for; asking
        for another tenant on a console for one tenant is refused."""
        requested = requested or None
        if self.tenant is not None and requested is not None and requested != self.tenant:
            raise NotAllowedError(f"this console shows tenant {self.tenant} only")
        return self.tenant or requested
