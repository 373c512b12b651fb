"""Who may run what: the cron bearer and admin identities (JWT) with surface roles."""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Any, NamedTuple

from shared.core.errors import Forbidden, Unauthorized, UpstreamUnavailable
from shared.core.settings import Settings
from shared.core.surfaces import SURFACE_ROLES, Surface

SESSION_COOKIE = "__session"


def is_authorized_cron(authorization: str | None, secret: str | None) -> bool:
    """``Authorization: Bearer $CRON_SECRET``, compared in constant time on bytes.

    The length check cannot leak the secret: the expected length is fixed by the
    configured value and does not vary with the input. No secret: nothing passes.
    """
    if not secret or authorization is None:
        return False
    try:
        given = authorization.encode("ascii")
    except UnicodeEncodeError:
        return False
    expected = b"Bearer " + secret.encode("ascii")
    if len(given) != len(expected):
        return False
    return hmac.compare_digest(given, expected)


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
        roles = claims.get("roles", [])
        if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
            raise Unauthorized("the roles claim must be a list of strings")
        return Identity(subject=str(claims["sub"]), roles=frozenset(roles), claims=claims)

    def authorize(self, token: str | None, surface: Surface) -> Identity:
        return self.authorize_identity(self.verify(token), surface)

    @staticmethod
    def authorize_identity(identity: Identity, surface: Surface) -> Identity:
        if not identity.may(surface):
            raise Forbidden(f"the {surface} surface needs one of: "
                            f"{', '.join(sorted(SURFACE_ROLES[surface]))}", subject=identity.subject)
        return identity
