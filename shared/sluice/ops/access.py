"""Getting into the console locally: admin tokens minted with the HS256 secret, one-time login links.

Only a locally configured ``SLUICE_ADMIN_JWT_SECRET`` can mint; production identities come from
the JWKS provider. A login link carries a random nonce whose hash is kept in the state store for a
few minutes; redeeming it deletes the row, so a link works once.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import time
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from sluice.core.errors import ConfigurationError, RequestError, Unauthorized
from sluice.core.settings import Settings
from sluice.core.surfaces import SURFACE_ROLES
from sluice.store.state import StateStore

ROLES: frozenset[str] = frozenset().union(*SURFACE_ROLES.values())
DEFAULT_TTL = timedelta(hours=12)
MAX_TTL = timedelta(days=30)
LOGIN_LINK_TTL = timedelta(minutes=15)
LOGIN_PREFIX = "console:login:"
DEV_SUBJECT = "local-dev"


class NoLocalSecret(ConfigurationError):
    """Tokens can only be minted with a local HS256 secret."""

    code = "no_admin_secret"


def on_lambda() -> bool:
    return bool(os.environ.get("AWS_LAMBDA_FUNCTION_NAME"))


def check_roles(roles: Iterable[str]) -> list[str]:
    chosen = sorted({r.strip() for r in roles if r.strip()})
    if not chosen:
        raise RequestError(f"give at least one role; known: {', '.join(sorted(ROLES))}")
    unknown = [r for r in chosen if r not in ROLES]
    if unknown:
        raise RequestError(f"unknown role(s) {', '.join(unknown)}; known: {', '.join(sorted(ROLES))}")
    return chosen


def parse_ttl(text: str) -> timedelta:
    """``90s``, ``30m``, ``12h``, ``7d`` (or plain seconds), at most 30 days."""
    text = text.strip().lower()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    number, unit = (text[:-1], text[-1]) if text[-1:] in units else (text, "s")
    if not number.isdigit() or int(number) == 0:
        raise RequestError(f"--ttl must be a positive number with s, m, h or d, got {text!r}")
    ttl = timedelta(seconds=int(number) * units[unit])
    if ttl > MAX_TTL:
        raise RequestError("--ttl is at most 30d")
    return ttl


def mint_token(settings: Settings, roles: Iterable[str], *, subject: str = DEV_SUBJECT,
               ttl: timedelta = DEFAULT_TTL, now: float | None = None) -> str:
    import jwt

    if not settings.admin_jwt_secret:
        raise NoLocalSecret(
            "no local admin secret: set SLUICE_ADMIN_JWT_SECRET (at least 32 characters), e.g. "
            "export SLUICE_ADMIN_JWT_SECRET=$(python3 -c 'import secrets; "
            "print(secrets.token_urlsafe(32))'); production tokens come from your identity "
            "provider (SLUICE_ADMIN_JWKS_URL)")
    issued = int(time.time() if now is None else now)
    claims: dict[str, Any] = {"sub": subject, "roles": check_roles(roles), "iat": issued,
                              "exp": issued + int(ttl.total_seconds())}
    if settings.admin_jwt_audience:
        claims["aud"] = settings.admin_jwt_audience
    if settings.admin_jwt_issuer:
        claims["iss"] = settings.admin_jwt_issuer
    return jwt.encode(claims, settings.admin_jwt_secret, algorithm="HS256")


def _nonce_key(nonce: str) -> str:
    return LOGIN_PREFIX + hashlib.sha256(nonce.encode()).hexdigest()


def login_links_allowed(settings: Settings) -> bool:
    return bool(settings.admin_jwt_secret) and not on_lambda()


def create_login_nonce(settings: Settings, state: StateStore, roles: Iterable[str],
                       *, ttl: timedelta = LOGIN_LINK_TTL) -> str:
    """A fresh single-use nonce for ``/admin/login``; its roles are fixed now."""
    if not login_links_allowed(settings):
        raise NoLocalSecret("login links need SLUICE_ADMIN_JWT_SECRET and are never made on Lambda")
    nonce = secrets.token_urlsafe(32)
    state.put(_nonce_key(nonce), {"roles": check_roles(roles)}, ttl=ttl)
    return nonce


def redeem_login_nonce(settings: Settings, state: StateStore, nonce: str) -> str:
    """The session token for a valid, unused nonce; the nonce is gone afterwards."""
    if not login_links_allowed(settings):
        raise Unauthorized("login links are not available here")
    key = _nonce_key(nonce)
    grant = state.get(key)
    # Deleting is the claim: of two concurrent redeems only one deletes the row.
    if not isinstance(grant, dict) or not state.delete(key):
        raise Unauthorized("this login link is unknown, used or expired; "
                           "restart sluice dev or run sluice token")
    return mint_token(settings, grant.get("roles") or [], subject=DEV_SUBJECT)
