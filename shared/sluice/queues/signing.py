"""Signed push-queue messages, byte-compatible with a JavaScript producer.

The signing input is every field except ``signature`` as the list of
``[key, value]`` pairs that ``Object.entries(msg).sort()`` yields, serialised
exactly as ``JSON.stringify`` would: compact, non-ASCII kept raw, only ``"``,
``\\``, control characters and lone surrogates escaped, numbers in
ECMAScript's shortest form (``1.0`` is ``1``, ``1e21`` is ``1e+21``, ``-0`` is
``0``), nested objects in their own order (integer-like keys first, as a JS
engine orders them). HMAC-SHA256 over the UTF-8 bytes, hex digest.

Several secrets may be configured: sign with the first, accept any, so a secret
can be rotated without dropping messages in flight. No secret: nothing signs
and nothing verifies (fail closed).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import operator
import re
from collections.abc import Mapping, Sequence
from typing import Any

from sluice.core.errors import ConfigurationError, RequestError

SIGNATURE_FIELD = "signature"
SIGNATURE_HEX_LEN = 64
_MAX_SAFE = 2**53
_INDEX_KEY = re.compile(r"0|[1-9][0-9]*")
_SURROGATE = re.compile("[\ud800-\udfff]")
_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")
_SIMPLE_KEYS = re.compile(r"[\x2d-\x7e]*")
_first = operator.itemgetter(0)
_escape = json.encoder.encode_basestring


def _unencodable(value: Any) -> Any:
    raise TypeError(f"not a JSON value: {type(value).__name__}")


# The C encoder behind json.dumps, built once (json.dumps builds it on every call): compact,
# non-ASCII raw. Used only for values _plain() accepts, where it writes what JS writes.
_make = json.encoder.c_make_encoder  # type: ignore[attr-defined]
_c_encode = _make(None, _unencodable, _escape, None, ":", ",", False, False, False) if _make else None


def _compact(value: Any) -> str:
    if _c_encode is None:  # pragma: no cover - CPython always has the C encoder
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return "".join(_c_encode(value, 0))


class SignatureError(RequestError):
    """The message signature is missing or wrong."""

    code = "bad_signature"


class MissingSecret(ConfigurationError):
    """SLUICE_QUEUE_SIGNING_SECRET is not set, so no message can be signed or verified."""


# --- JavaScript's JSON.stringify, in Python -----------------------------------


def js_number(value: float) -> str:
    """``String(value)`` / ``JSON.stringify(value)`` of a JS number (non-finite -> ``null``)."""
    if isinstance(value, int) and -_MAX_SAFE < value < _MAX_SAFE:
        return str(value)
    try:
        number = float(value)
    except OverflowError:  # an integer beyond the double range is Infinity to JS
        return "null"
    if math.isnan(number) or math.isinf(number):
        return "null"
    if number == 0:
        return "0"
    sign = "-" if number < 0 else ""
    # repr() gives the shortest round-trip digits, as ECMAScript's Number::toString does.
    mantissa, _, exp = repr(abs(number)).partition("e")
    whole, _, frac = mantissa.partition(".")
    frac = "" if frac == "0" else frac
    significant = (whole + frac).lstrip("0")
    digits = significant.rstrip("0")
    # value = digits * 10**(n - k): ECMAScript's s, k and n
    n = len(significant) + (int(exp) if exp else 0) - len(frac)
    k = len(digits)
    if k <= n <= 21:
        out = digits + "0" * (n - k)
    elif 0 < n <= 21:
        out = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        out = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        out = digits[0] + ("." + digits[1:] if k > 1 else "") + ("e+" if e >= 0 else "e-") + str(
            abs(e))
    return sign + out


def _js_str(value: str) -> str:
    """A JSON string literal as JS writes it: well-formed (lone surrogates as ``\\udXXX``)."""
    if _SURROGATE.search(value) is None:
        return _escape(value)
    # A high+low pair held as two code points is one character to JS.
    value = _PAIR.sub(lambda m: m.group().encode("utf-16", "surrogatepass").decode("utf-16"),
                      value)
    parts = _SURROGATE.split(value)
    lone = _SURROGATE.findall(value)
    out = [_escape(parts[0])[:-1]]
    for ch, part in zip(lone, parts[1:], strict=True):
        out.append(f"\\u{ord(ch):04x}")
        out.append(_escape(part)[1:-1])
    out.append('"')
    return "".join(out)


def _js_keys(obj: Mapping[str, Any]) -> list[str]:
    """Own-property order of a JS object: array-index keys ascending, then insertion order."""
    keys = list(obj)
    index = [k for k in keys if _INDEX_KEY.fullmatch(k) and int(k) < 2**32 - 1]
    if not index:
        return keys
    rest = [k for k in keys if not (_INDEX_KEY.fullmatch(k) and int(k) < 2**32 - 1)]
    return sorted(index, key=int) + rest


def js_stringify(value: Any) -> str:
    """``JSON.stringify(value)`` for JSON-shaped Python values (slow path, exact)."""
    if value is None or value is True or value is False:
        return "null" if value is None else ("true" if value else "false")
    if isinstance(value, str):
        return _js_str(value)
    if isinstance(value, int | float):
        return js_number(value)
    if isinstance(value, Mapping):
        return "{" + ",".join(_js_str(str(k)) + ":" + js_stringify(value[k])
                              for k in _js_keys(value)) + "}"
    if isinstance(value, Sequence):
        return "[" + ",".join(js_stringify(v) for v in value) + "]"
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def _js_string(value: Any) -> str:
    """``String(value)`` in JS for a JSON value (what ``Array.prototype.sort`` compares)."""
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return js_number(value)
    if isinstance(value, Mapping):
        return "[object Object]"
    # Array.prototype.join: null/undefined elements become "".
    return ",".join("" if v is None else _js_string(v) for v in value)


def _plain(value: Any) -> bool:
    """True when ``json.dumps`` already writes ``value`` exactly as JS would."""
    if isinstance(value, str) or value is None or value is True or value is False:
        return True
    if isinstance(value, int):
        return -_MAX_SAFE < value < _MAX_SAFE
    if isinstance(value, dict):
        return all(not (k[:1].isdigit() and _INDEX_KEY.fullmatch(k)) and _plain(v)
                   for k, v in value.items())
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    return False  # floats and anything else take the exact path


def _utf16(text: str) -> bytes:
    return text.encode("utf-16-be", "surrogatepass")


_STR = frozenset({str})


def canonical(message: Mapping[str, Any]) -> bytes:
    """The signing input: ``JSON.stringify(Object.entries(msg).sort())`` minus the signature."""
    if type(message) is dict and _STR.issuperset(map(type, message.values())) and (
            _SIMPLE_KEYS.fullmatch("".join(message))):
        # The common case, done in C: string values under ASCII keys above "," (which
        # sort the same by themselves). Keys are distinct, so the tuples compare by key.
        body = message.copy()
        body.pop(SIGNATURE_FIELD, None)
        try:
            return _compact(sorted(body.items())).encode("utf-8")
        except UnicodeEncodeError:
            pass  # a lone surrogate: JS escapes it, json.dumps keeps it raw
    pairs = [(k, v) for k, v in message.items() if k != SIGNATURE_FIELD]
    # The default sort compares String([k, v]) = k + "," + String(v) by UTF-16 code units.
    if _SIMPLE_KEYS.fullmatch("".join([k for k, _ in pairs])):
        # ASCII keys above "," sort the same by themselves (the common case, done in C).
        pairs.sort(key=_first)
    elif any("," in k for k, _ in pairs):
        pairs.sort(key=lambda kv: _utf16(kv[0] + "," + _js_string(kv[1])))
    else:
        pairs.sort(key=lambda kv: _utf16(kv[0] + ","))
    if all(type(v) is str for _, v in pairs) or all(_plain(v) for _, v in pairs):
        try:
            return _compact(pairs).encode("utf-8")
        except UnicodeEncodeError:
            pass  # a lone surrogate: JS escapes it, json.dumps keeps it raw
    return ("[" + ",".join("[" + _js_str(k) + "," + js_stringify(v) + "]" for k, v in pairs)
            + "]").encode("utf-8")


def sign_bytes(payload: bytes, secret: str) -> str:
    return hmac.new(secret.encode("utf-8"), payload, hashlib.sha256).hexdigest()


class Signer:
    """Signs with the first secret, verifies against any of them."""

    def __init__(self, secrets: Sequence[str]) -> None:
        self.secrets = tuple(s for s in secrets if s)
        self._keys = tuple(s.encode("utf-8") for s in self.secrets)

    @property
    def configured(self) -> bool:
        return bool(self.secrets)

    def signature(self, message: Mapping[str, Any]) -> str:
        if not self.secrets:
            raise MissingSecret()
        return sign_bytes(canonical(message), self.secrets[0])

    def sign(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """A copy of ``message`` with ``signature`` set (last, as a JS spread would put it)."""
        body = {k: v for k, v in message.items() if k != SIGNATURE_FIELD}
        body[SIGNATURE_FIELD] = self.signature(body)
        return body

    def check(self, message: Any, payload: bytes | None = None) -> str | None:
        """``None`` when the signature is valid, else the reason it is not.

        ``payload`` is ``canonical(message)`` when the caller computed it already.
        """
        if not self._keys:
            return "no signing secret is configured"
        if type(message) is not dict and not isinstance(message, Mapping):
            return "message is not a JSON object"
        given = message.get(SIGNATURE_FIELD)
        if not isinstance(given, str) or not given:
            return "message is unsigned"
        given_bytes = given.encode("utf-8", "surrogatepass")
        # Length check first: the expected length is fixed (hex SHA-256), so it leaks nothing.
        if len(given_bytes) != SIGNATURE_HEX_LEN:
            return "signature has the wrong length"
        if payload is None:
            payload = canonical(message)
        for key in self._keys:
            expected = hmac.digest(key, payload, "sha256").hex().encode("ascii")
            if hmac.compare_digest(given_bytes, expected):
                return None
        return "signature does not match"

    def verify(self, message: Any) -> bool:
        return self.check(message) is None

    def require(self, message: Any) -> None:
        reason = self.check(message)
        if reason is not None:
            raise SignatureError(reason)
