"""Who may run what: the cron bearer and admin identities (JWT) with surface roles."""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from sluice.core.errors import Forbidden, Unauthorized, UpstreamUnavailable
from sluice.core.settings import Settings
from sluice.core.surfaces import SURFACE_ROLES, Surface
from sluice.core.validate import actor_name

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

    def __init__(self, settings: Settings,
                 fetch_json: Callable[[str], Any] | None = None) -> None:
        self.secret = settings.admin_jwt_secret
        self.audience = settings.admin_jwt_audience
        self.issuer = settings.admin_jwt_issuer
        self._jwks: JwksKeys | None = None
        if settings.admin_jwks_url:
            self._jwks = JwksKeys(settings.admin_jwks_url, fetch_json or _egress_fetch_json())

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
                key = self._jwks.signing_key(token)
                claims = jwt.decode(token, key, algorithms=["RS256", "ES256"], options=options,
                                    audience=self.audience, issuer=self.issuer, leeway=5)
            elif self.secret:
                claims = jwt.decode(token, self.secret, algorithms=["HS256"], options=options,
                                    audience=self.audience, issuer=self.issuer, leeway=5)
            else:
                raise Unauthorized("token algorithm not accepted")
        except jwt.PyJWKError as exc:
            raise Unauthorized(f"admin token key not usable: {exc}") from exc
        except jwt.InvalidTokenError as exc:
            raise Unauthorized(f"invalid admin token: {exc}") from exc
        subject = claims.get("sub")
        subject = actor_name(subject) if isinstance(subject, str) else ""
        if not subject:
            raise Unauthorized("invalid admin token: the sub claim must be a non-empty string "
                               "with a printable character")
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


class JwksKeys:
    """The identity provider's signing keys, read from its JWKS URL and kept ``lifespan_s``.

    A token naming a key the kept set lacks reads the set again (the provider rotated), at
    most once every ``refresh_s``, so a stream of tokens with unknown key ids cannot make
    Sluice hammer the provider."""

    def __init__(self, url: str, fetch_json: Callable[[str], Any], *, lifespan_s: float = 600,
                 refresh_s: float = 30, clock: Callable[[], float] = time.monotonic) -> None:
        self.url, self.fetch_json = url, fetch_json
        self.lifespan_s, self.refresh_s, self.clock = lifespan_s, refresh_s, clock
        self._keys: Any = None
        self._read_at = float("-inf")

    def signing_key(self, token: str) -> Any:
        import jwt

        kid = jwt.get_unverified_header(token).get("kid")
        now = self.clock()
        if self._keys is None or now - self._read_at > self.lifespan_s:
            self._read(now)
        key = self._find(kid)
        if key is None and now - self._read_at > self.refresh_s:
            self._read(now)
            key = self._find(kid)
        if key is None:
            raise Unauthorized(f"admin token key not found: no key {kid!r} at the JWKS URL")
        return key

    def _find(self, kid: Any) -> Any:
        keys = [k for k in self._keys.keys if kid is None or k.key_id == kid]
        return keys[0].key if keys else None

    def _read(self, now: float) -> None:
        import jwt

        data = self.fetch_json(self.url)
        try:
            self._keys = jwt.PyJWKSet.from_dict(data)
        except jwt.PyJWKError as exc:
            raise UpstreamUnavailable(f"the admin JWKS endpoint sent no usable key set: {exc}"
                                      ) from None
        self._read_at = now


def _egress_fetch_json() -> Callable[[str], Any]:
    """GET a JSON document through the egress layer: a total deadline of 5 s and a 1 MiB cap
    (the JWKS URL is the operator's setting, so it is trusted as configured)."""
    # the one outbound call core makes goes the way every other one does; egress sits
    # above core in the layers, so it is imported when a JWKS URL is configured
    from sluice.egress import Egress, EgressError

    def fetch(url: str) -> Any:
        try:
            # a client per read: one read every ten minutes keeps no connection open between
            with Egress(timeout_s=5.0) as egress:
                answer = egress.request("GET", url, max_bytes=1 << 20, truncate=False)
            if answer.status != 200:
                raise UpstreamUnavailable(
                    f"the admin JWKS endpoint answered HTTP {answer.status}")
            return answer.json()
        except EgressError as exc:
            raise UpstreamUnavailable(f"the admin JWKS endpoint did not answer: {exc.message}"
                                      ) from None
        except ValueError:
            raise UpstreamUnavailable("the admin JWKS endpoint did not answer JSON") from None

    return fetch
