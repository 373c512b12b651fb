"""A JWKS endpoint (RFC 7517) with an RSA and an EC key, as an identity provider publishes it."""

from __future__ import annotations

import json
import time
from typing import Any, Self

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from tests.providers.http import ProviderServer, json_response


class JwksProvider:
    def __init__(self) -> None:
        self.rsa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.ec = ec.generate_private_key(ec.SECP256R1())
        rsa_jwk = json.loads(RSAAlgorithm.to_jwk(self.rsa.public_key()))
        ec_jwk = json.loads(ECAlgorithm.to_jwk(self.ec.public_key()))
        rsa_jwk.update(kid="rsa-1", use="sig", alg="RS256")
        ec_jwk.update(kid="ec-1", use="sig", alg="ES256")
        self.keys = {"keys": [rsa_jwk, ec_jwk]}
        self.server = ProviderServer(self._handle)

    def _handle(self, method: str, path: str, headers: dict[str, str], body: bytes,
                ) -> tuple[int, dict[str, str], bytes]:
        if method == "GET" and path == "/.well-known/jwks.json":
            return json_response(200, self.keys)
        return json_response(404, {"error": "not found"})

    @property
    def url(self) -> str:
        return self.server.url + "/.well-known/jwks.json"

    def token(self, roles: list[str], *, alg: str = "RS256", subject: str = "admin-jwks",
              expires_in: int = 300, **claims: Any) -> str:
        now = int(time.time())
        payload = {"sub": subject, "roles": roles, "iat": now, "exp": now + expires_in, **claims}
        key, kid = (self.rsa, "rsa-1") if alg == "RS256" else (self.ec, "ec-1")
        return jwt.encode(payload, key, algorithm=alg, headers={"kid": kid})

    def __enter__(self) -> Self:
        self.server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.__exit__(*exc)
