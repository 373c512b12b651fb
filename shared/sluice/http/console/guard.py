"""Who may see a console page, why not, and the CSRF token of a session."""

from __future__ import annotations

import hashlib
import hmac
from typing import NamedTuple
from urllib.parse import urlsplit

from fastapi import Request

from sluice.core.auth import Identity
from sluice.core.errors import Forbidden, RequestError, Unauthorized
from sluice.core.surfaces import SURFACE_ROLES, Surface
from sluice.http.app import admin_token, begin_audit, services_of

CSRF_FIELD = "csrf"
_CSRF_CONTEXT = b"sluice-console-csrf:v1"

# The restricted page's heading and text per surface.
RESTRICTED: dict[str, tuple[str, str]] = {
    "queues": ("Queue monitoring access is restricted",
               ("This operations surface is limited to platform users with queue monitoring "
                "access.")),
    "flags": ("Flag management access is restricted",
              "Feature flags can only be changed by super admins."),
}


class Denied(NamedTuple):
    status: int  # 401 or 403
    reason: str  # missing | expired | invalid | role | unavailable
    detail: str
    title: str
    text: str


def _restricted(surface: Surface) -> tuple[str, str]:
    return RESTRICTED.get(surface, (
        f"{surface.capitalize()} access is restricted",
        f"This operations surface is limited to platform users with {surface} access."))


def check(request: Request, surface: Surface) -> Identity | Denied:
    """The identity allowed on ``surface``, or why it was refused (missing, expired, role)."""
    import jwt

    title, text = _restricted(surface)
    token = admin_token(request)
    verifier = services_of(request).admin
    if not token:
        return Denied(401, "missing", "You have no session. Open the login link that "
                      "`sluice dev` prints, or send an admin token.", title, text)
    try:
        identity = verifier.verify(token)
    except Unauthorized as exc:
        if isinstance(exc.__cause__, jwt.ExpiredSignatureError):
            return Denied(401, "expired", "Your session has expired. Get a new login link "
                          "(restart `sluice dev`) or a new token (`sluice token`).", title, text)
        return Denied(401, "invalid", f"Your session is not valid: {exc.message}", title, text)
    request.state.actor = identity.subject
    try:
        allowed = verifier.authorize_identity(identity, surface)
    except Forbidden:
        roles = ", ".join(sorted(identity.roles)) or "none"
        need = ", ".join(sorted(SURFACE_ROLES[surface]))
        return Denied(403, "role", f"Your session ({identity.subject}) lacks the role: this page "
                      f"needs one of {need}; you have {roles}.", title, text)
    begin_audit(request, allowed)
    return allowed


def landing(request: Request, pages: list[tuple[str, Surface]]) -> str:
    """The first of ``pages`` the session may open (``pages[0]`` without one, or when it may
    open none: that page's refusal says which roles it needs). Reads the session only, so
    the redirect is not audited; the page it leads to is."""
    token = admin_token(request)
    if token:
        try:
            identity = services_of(request).admin.verify(token)
        except Unauthorized:
            return pages[0][0]
        for path, surface in pages:
            if identity.may(surface):
                return path
    return pages[0][0]


def csrf_token(request: Request) -> str:
    """Bound to the session: an HMAC of the session token, so another site cannot know it."""
    token = admin_token(request) or ""
    return hmac.new(token.encode(), _CSRF_CONTEXT, hashlib.sha256).hexdigest()


def check_csrf(request: Request, given: str | None) -> None:
    origin = request.headers.get("origin")
    if origin and origin != "null":
        host = urlsplit(origin).netloc
        if host != request.headers.get("host"):
            raise Forbidden("cross-origin form post refused")
    if not given or not hmac.compare_digest(given, csrf_token(request)):
        raise RequestError("the form's CSRF token is missing or wrong; reload the page")


def is_https(request: Request) -> bool:
    proto = request.headers.get("x-forwarded-proto", request.url.scheme)
    return proto.split(",")[0].strip() == "https"
