from __future__ import annotations

import time
from collections.abc import Callable

import jwt
import pytest

from sluice.core.auth import AdminVerifier, JwksKeys, bearer_token, is_authorized_cron
from sluice.core.errors import Forbidden, Unauthorized, UpstreamUnavailable
from sluice.core.settings import Settings
from tests.conftest import JWT_SECRET, admin_token
from tests.providers.jwks import JwksProvider

SECRET = "a-cron-secret-of-enough-length"


@pytest.mark.parametrize(
    ("header", "secret", "expected"),
    [
        (f"Bearer {SECRET}", SECRET, True),
        (f"Bearer {SECRET}", None, False),
        (f"Bearer {SECRET}", "", False),
        (None, SECRET, False),
        ("", SECRET, False),
        (f"bearer {SECRET}", SECRET, True),
        (f"BEARER {SECRET}", SECRET, True),
        (f"Bearer  {SECRET}", SECRET, False),
        (f"Bearer {SECRET} ", SECRET, False),
        (f"Bearer {SECRET[:-1]}x", SECRET, False),
        (f"Basic {SECRET}", SECRET, False),
        ("Bearer " + "é" * len(SECRET), SECRET, False),
        (SECRET, SECRET, False),
    ],
)
def test_cron_bearer(header: str | None, secret: str | None, expected: bool) -> None:
    assert is_authorized_cron(header, secret) is expected


def test_bearer_token_parsing() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer abc") == "abc"
    assert bearer_token("Basic abc") is None
    assert bearer_token("Bearer ") is None
    assert bearer_token(None) is None


def _verifier(**env: str) -> AdminVerifier:
    return AdminVerifier(Settings.from_env({"SLUICE_ADMIN_JWT_SECRET": JWT_SECRET, **env}))


def test_hs256_identity_and_roles() -> None:
    identity = _verifier().authorize(admin_token(["billing"], subject="u1"), "metering")
    assert identity.subject == "u1"
    assert identity.roles == {"billing"}


@pytest.mark.parametrize(
    ("roles", "surface", "allowed"),
    [
        (["super_admin"], "erasure", True),
        (["super_admin"], "flags", True),
        (["ops"], "state", True),
        (["ops"], "queues", True),
        (["ops"], "metering", False),
        (["billing"], "ledger", True),
        (["billing"], "state", False),
        (["privacy"], "erasure", True),
        (["privacy"], "queues", False),
        ([], "state", False),
    ],
)
def test_surface_roles(roles: list[str], surface: str, allowed: bool) -> None:
    token = admin_token(roles)
    if allowed:
        assert _verifier().authorize(token, surface).roles == set(roles)  # type: ignore[arg-type]
    else:
        with pytest.raises(Forbidden):
            _verifier().authorize(token, surface)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "make_token",  # factories: each token is minted when its case runs, never at import
    [
        lambda: None,
        lambda: "",
        lambda: "not-a-jwt",
        lambda: admin_token(["ops"], secret="another-secret-of-sufficient-length-000"),
        lambda: admin_token(["ops"], expires_in=-60),
        lambda: admin_token(["ops"], nbf=int(time.time()) + 600),
        lambda: admin_token("ops"),  # type: ignore[arg-type]
        lambda: jwt.encode({"sub": "x", "roles": ["ops"]}, JWT_SECRET,
                           algorithm="HS256"),  # no exp
        lambda: jwt.encode({"sub": "x", "roles": ["ops"], "exp": int(time.time()) + 60}, None,
                           algorithm="none"),
        lambda: admin_token(["ops"], subject=""),
        lambda: admin_token(["ops"], subject="  "),
        lambda: jwt.encode({"sub": 7, "roles": ["ops"], "exp": int(time.time()) + 60},
                           JWT_SECRET, algorithm="HS256"),
    ],
)
def test_bad_tokens_are_unauthorized(make_token: Callable[[], str | None]) -> None:
    with pytest.raises(Unauthorized):
        _verifier().authorize(make_token(), "state")


def test_no_provider_configured_authorises_nobody() -> None:
    with pytest.raises(Unauthorized):
        AdminVerifier(Settings.from_env({})).authorize(admin_token(["super_admin"]), "state")


def test_jwks_rs256_and_es256_from_a_real_endpoint() -> None:
    with JwksProvider() as idp:
        verifier = AdminVerifier(Settings.from_env({"SLUICE_ADMIN_JWKS_URL": idp.url}))
        assert verifier.authorize(idp.token(["ops"]), "state").subject == "admin-jwks"
        assert verifier.authorize(idp.token(["privacy"], alg="ES256"), "erasure").roles == {
            "privacy"}
        fetches = len(idp.server.requests)
        verifier.authorize(idp.token(["ops"]), "state")
        assert len(idp.server.requests) == fetches, "keys are cached, not fetched per token"
        with pytest.raises(Unauthorized):
            verifier.authorize(idp.token(["ops"], expires_in=-30), "state")
        with pytest.raises(Unauthorized):  # an HS256 token is refused when only JWKS is configured
            verifier.authorize(admin_token(["ops"]), "state")


def test_an_unreachable_jwks_endpoint_is_a_503_not_a_401() -> None:
    from sluice.core.errors import UpstreamUnavailable
    from tests.conftest import free_port

    url = f"http://127.0.0.1:{free_port()}/.well-known/jwks.json"  # nothing listens there
    verifier = AdminVerifier(Settings.from_env({"SLUICE_ADMIN_JWKS_URL": url}))
    with JwksProvider() as idp:
        token = idp.token(["ops"])
    with pytest.raises(UpstreamUnavailable):
        verifier.authorize(token, "state")


def test_a_jwks_endpoint_trickling_its_headers_is_cut_at_five_seconds() -> None:
    from tests.providers.hostile import HostilePeer

    with HostilePeer(drip_s=0.05) as peer, JwksProvider() as idp:
        verifier = AdminVerifier(Settings.from_env(
            {"SLUICE_ADMIN_JWKS_URL": peer.url + "/trickle-headers"}))
        started = time.monotonic()
        with pytest.raises(UpstreamUnavailable):
            verifier.authorize(idp.token(["ops"]), "state")
        assert time.monotonic() - started < 5 + 3, "a total deadline, headers included"


def test_a_token_naming_a_new_key_reads_the_set_again_at_most_every_refresh() -> None:
    reads: list[str] = []
    now = [100.0]
    with JwksProvider() as idp:  # its keys only: the fetch is injected
        keys = JwksKeys("https://idp.example/jwks", lambda url: reads.append(url) or idp.keys,
                        refresh_s=30, clock=lambda: now[0])
        assert keys.signing_key(idp.token(["ops"])) is not None
        rotated = jwt.encode({"sub": "x", "exp": int(time.time()) + 60}, idp.rsa,
                             algorithm="RS256", headers={"kid": "rotated-away"})
        with pytest.raises(Unauthorized):
            keys.signing_key(rotated)
        assert len(reads) == 1, "an unknown kid within 30 s of a read reads nothing"
        now[0] += 31
        with pytest.raises(Unauthorized):
            keys.signing_key(rotated)
        assert len(reads) == 2, "after 30 s an unknown kid reads the set again, once"
