"""Who may run what: the cron bearer and admin identities (JWT) with surface roles."""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from shared.core.errors import Forbidden, Unauthorized, UpstreamUnavailable
from shared.core.settings import Settings
from shared.core.surfaces import SURFACE_ROLES, Surface

SESSION_COOKIE = "__session"


class CrossSiteRequest(Forbidden):
    """A cookie-authenticated write must come from this site's own pages."""

    code = "cross_site_request"


def is_authorized_cron(authorization: str | None, secret: str | None) -> bool:
    """``Authorization: Bearer $CRON_SECRET`` (the scheme in any case, RFC 7235), the
    credential compared in constant time on bytes.

    The length check cannot leak the secret: the expected length is fixed by the
    configured value and does not vary with the input. No secret: nothing passes.
    """
    if not secret or authorization is None:
        return False
    try:
        given = authorization.encode("ascii")
    except UnicodeEncodeError:
        return False
    scheme, _, credential = given.partition(b" ")
    if scheme.lower() != b"bearer":
        return False
    expected = secret.encode("ascii")
    if len(credential) != len(expected):
        return False
    return hmac.compare_digest(credential, expected)


def check_same_origin(origin: str | None, referer: str | None, host: str | None) -> None:
    """A write authenticated by the session cookie must name this host as its ``Origin``
    (or, without one, its ``Referer``): a browser sends the cookie on a request that
    another site started, but the Origin then names that other site."""
    claimed = origin if origin is not None else referer
    if not claimed or not host:
        raise CrossSiteRequest("a cookie-authenticated write needs an Origin header naming "
                               "this site; use Authorization: Bearer from scripts")
    parts = urlsplit(claimed)
    if parts.scheme not in ("http", "https") or parts.netloc.lower() != host.lower():
        raise CrossSiteRequest(f"a cookie-authenticated write from another origin "
                               f"({claimed[:100]!r}) is refused")


class Identity(NamedTuple):
    subject: str
    roles: frozenset[str]
    claims: Mapping[str, Any]

    def may(self, surface: Surface) -> bool:
        return bool(self.roles & SURFACE_ROLES[surface])


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


class AdminVerifier:
    """Verifies admin JWTs: HS256 with a local secret, or RS256/ES256 from a JWKS URL (keys cached)."""

    def __init__(self, settings: Settings) -> None:
        self.secret = settings.admin_jwt_secret
        self.audience = settings.admin_jwt_audience
        self.issuer = settings.admin_jwt_issuer
        self._jwks: Any = None
        if settings.admin_jwks_url:
            import jwt

            self._jwks = jwt.PyJWKClient(settings.admin_jwks_url, cache_keys=True, lifespan=600,
                                         timeout=5)

    @property
    def configured(self) -> bool:
        return bool(self.secret or self._jwks)

    def verify(self, token: str | None) -> Identity:
        import jwt

        if not token:
            raise Unauthorized("an admin identity is required (Authorization: Bearer or __session)")
        if not self.configured:
            raise Unauthorized("no admin identity provider is configured")
        options: Any = {"require": ["exp", "sub"]}
        try:
            if self._jwks is not None and jwt.get_unverified_header(token).get("alg") != "HS256":
                key = self._jwks.get_signing_key_from_jwt(token).key
                claims = jwt.decode(token, key, algorithms=["RS256", "ES256"], options=options,
                                    audience=self.audience, issuer=self.issuer, leeway=5)
            elif self.secret:
                claims = jwt.decode(token, self.secret, algorithms=["HS256"], options=options,
                                    audience=self.audience, issuer=self.issuer, leeway=5)
            else:
                raise Unauthorized("token algorithm not accepted")
        except jwt.PyJWKClientConnectionError as exc:
            raise UpstreamUnavailable(f"the admin JWKS endpoint did not answer: {exc}") from exc
        except jwt.PyJWKClientError as exc:
            raise Unauthorized(f"admin token key not found: {exc}") from exc
        except jwt.InvalidTokenError as exc:
            raise Unauthorized(f"invalid admin token: {exc}") from exc
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject.strip():
            raise Unauthorized("invalid admin token: the sub claim must be a non-empty string")
        roles = claims.get("roles", [])
        if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
            raise Unauthorized("the roles claim must be a list of strings")
        return Identity(subject=subject, roles=frozenset(roles), claims=claims)

    def authorize(self, token: str | None, surface: Surface) -> Identity:
        return self.authorize_identity(self.verify(token), surface)

    @staticmethod
    def authorize_identity(identity: Identity, surface: Surface) -> Identity:
        if not identity.may(surface):
            raise Forbidden(f"the {surface} surface needs one of: "
                            f"{', '.join(sorted(SURFACE_ROLES[surface]))}", subject=identity.subject)
        return identity
