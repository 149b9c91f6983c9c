"""Who may see and decide what on a console: an identity with a role and a set of tenants, the
role each action needs, the tenants a request may touch, and the check that a decision was
sent by the console's own page."""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import TYPE_CHECKING

from toolfleet.app.identity import Identity, Role
from toolfleet.app.operations import NotAllowedError

if TYPE_CHECKING:
    from starlette.requests import Request

CSRF_HEADER = "X-Toolfleet-CSRF"
"""The header that carries a cookie session's CSRF token with every decision. The page reads
the token from ``/api/config``, which another site's script cannot read (the console answers
no CORS request), and a form on another site cannot send a header at all."""


class NotAuthenticatedError(NotAllowedError):
    """No credentials, or credentials that do not check out (HTTP 401): the message says how
    to sign in."""


class CrossSiteRequestError(NotAllowedError):
    """A decision that the console's own page did not send (no CSRF token, a wrong one, or not
    JSON): refused, as a cross-site request could be."""


@dataclass(frozen=True)
class Access:
    """What a request may see and do, from the identity that sent it and the console's own
    tenant (``--tenant``)."""

    tenant: str | None = None
    """The only tenant this console shows and acts for (None: every tenant)."""

    def tenants(self, who: Identity) -> frozenset[str] | None:
        """The tenants ``who`` may see on this console (None: every tenant)."""
        if self.tenant is None:
            return who.tenants
        if who.tenants is None or self.tenant in who.tenants:
            return frozenset((self.tenant,))
        return frozenset()

    def require(self, who: Identity, role: Role, what: str) -> None:
        """Refuse ``what`` unless ``who`` has ``role``; the message names the role."""
        if not who.may(role):
            raise NotAllowedError(
                f"{what} needs the {role} role; {who.name} has the {who.role} role (roles come "
                "from the identity provider, the token's entry or the proxy's roles header)"
            )

    def check_tenant(self, who: Identity, tenant: str) -> None:
        """Refuse anything of ``tenant`` unless ``who`` may see it here; names the tenant."""
        allowed = self.tenants(who)
        if allowed is not None and tenant not in allowed:
            here = f" on this console (for tenant {self.tenant} only)" if self.tenant else ""
            raise NotAllowedError(
                f"tenant {tenant} is not in the scope of {who.name} (it may see "
                f"{who.scope_text}){here}"
            )

    def scope(self, who: Identity, requested: str | None) -> frozenset[str] | None:
        """The tenants a read may return: the requested one if ``who`` may see it (else
        NotAllowedError naming it), or every tenant ``who`` may see here."""
        if requested:
            self.check_tenant(who, requested)
            return frozenset((requested,))
        return self.tenants(who)

    def fleet_wide(self, who: Identity, what: str) -> None:
        """Refuse a fleet-wide action (a circuit, a pin) unless ``who`` is an admin of every
        tenant on a console for every tenant."""
        self.require(who, "admin", what)
        if self.tenants(who) is not None:
            raise NotAllowedError(
                f"{what} touches every tenant; {who.name} may act for {who.scope_text} only"
                + (" and this console shows one tenant" if self.tenant else "")
            )

    def may_act_fleet_wide(self, who: Identity) -> bool:
        """Whether ``fleet_wide`` lets ``who`` through (the page shows the buttons then)."""
        return who.may("admin") and self.tenants(who) is None

    @staticmethod
    def check_decision(request: Request, who: Identity) -> None:
        """Refuse a decision the console's page did not send: a browser's session must carry
        its CSRF token (compared in constant time), and every decision is JSON."""
        if who.csrf is not None:
            sent = request.headers.get(CSRF_HEADER, "")
            if not hmac.compare_digest(sent.encode(), who.csrf.encode()):
                raise CrossSiteRequestError(
                    f"decisions from a browser must carry the session's CSRF token in "
                    f"{CSRF_HEADER} (the console's page sends it; reload the page)"
                )
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            raise CrossSiteRequestError("decisions are sent as application/json")
