"""Validation at the door: one check per kind of value, each a ``RequestError`` naming the field.

Every value Sluice accepts from the API, the console or the command line passes
one of these before it is stored or acted on: a URL (http/https, in the one
canonical form the egress layer dials), a recipient per channel, an identifier,
a locale, a text field, an instant (ISO 8601 with its offset), and the nesting depth
of a JSON document. Each check is
a pure function returning the value to store, so a refusal is a ``400`` (exit
64 on the command line) that names the field, and never a ``5xx`` from a
driver, a store index or a recursion limit further in.
"""

from __future__ import annotations

import ipaddress
import json
import re
import unicodedata
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import idna

from sluice.core.errors import RequestError

# Postgres refuses a btree entry over ~2.7 KB; every bound below keeps a key (4 bytes a
# character at worst) well under it.
MAX_URL = 2048
MAX_IDENTIFIER = 256
MAX_LINE = 512
MAX_MESSAGE = 65_536
MAX_LOCALE = 35
MAX_DEPTH = 64
MAX_EMAIL = 254
MAX_SCOPE_ID = 200
MAX_ACTOR = 200

_SCHEMES = ("http", "https")
_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
_NUMERIC_LABEL = re.compile(r"(?:0x[0-9a-f]*|[0-9]+)")
_PORT = re.compile(r"[1-9][0-9]{0,4}")
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
# What may stand in a path, query or fragment as given; anything else is percent-encoded
# into the canonical form (as the HTTP client would), except what is refused outright.
_URL_SAFE = "!$&'()*+,;=:@/?-._~%[]"
# ASCII only, as documented: Python's \w would also take "é", "٣" or "ｘ".
_SCOPE_ID = re.compile(r"[A-Za-z0-9_.:@-]+")
_LOCALE = re.compile(r"[A-Za-z]{2,3}(?:-[A-Za-z0-9]{1,8})*")
_TELEGRAM = re.compile(r"-?[1-9][0-9]{0,19}|@[A-Za-z][A-Za-z0-9_]{3,31}")
_SLACK = re.compile(r"[A-Z][A-Z0-9]{1,31}|#?[a-z0-9][a-z0-9._-]{0,79}")
_EMAIL_LOCAL = re.compile(r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*")
# Unicode's "other" categories: controls, format characters (bidi overrides, zero-width),
# surrogates, private use and unassigned; and line/paragraph separators.
_INVISIBLE = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
_TEXT_BREAKS = frozenset("\n\t")


def refuse(field: str, message: str) -> RequestError:
    return RequestError(f"{field} {message}", field=field)


def _string(value: Any, field: str, limit: int) -> str:
    if not isinstance(value, str) or not value:
        raise refuse(field, "must be a non-empty string")
    if len(value) > limit:
        raise refuse(field, f"must be at most {limit} characters")
    return value


def has_control(text: str, allowed: frozenset[str] = frozenset()) -> bool:
    """True when ``text`` holds a control, format or separator character not in ``allowed``."""
    return any(c not in allowed and (c < " " or unicodedata.category(c) in _INVISIBLE)
               for c in text)


def actor_name(value: str) -> str:
    """Who did an action, as every record of it stores the name (the audit trail, a
    schedule's mark, an erasure request): its text with the control, format and separator
    characters removed (an escape sequence, a bidi override, a line break), trimmed, at most
    ``MAX_ACTOR`` characters. Applied where Sluice learns who acts (a verified token's
    ``sub``, the command line's operator), so every row names them alike; empty when
    nothing printable is left, which the caller refuses."""
    return "".join(c for c in value if not has_control(c)).strip()[:MAX_ACTOR]


# --- URLs --------------------------------------------------------------------------


def check_host(host: str, field: str) -> str:
    """A host name, IPv4 or bracketed IPv6 address in its one canonical (dialled) form."""
    if host.startswith("["):
        if not host.endswith("]") or "%" in host:
            raise refuse(field, "an IPv6 address must be enclosed in [ ] with no zone")
        try:
            return f"[{ipaddress.IPv6Address(host[1:-1]).compressed}]"
        except ValueError:
            raise refuse(field, "holds an invalid IPv6 address") from None
    if not host:
        raise refuse(field, "has no host")
    if not host.isascii():
        try:  # IDNA 2008 without mapping: "①②⑦" or full-width digits are refused, not folded
            host = idna.encode(host.lower(), uts46=False).decode("ascii")
        except (idna.IDNAError, UnicodeError):
            raise refuse(field, "holds an invalid international host name") from None
    host = host.lower()
    labels = host.split(".")
    if _NUMERIC_LABEL.fullmatch(labels[-1]):
        # A host ending in a number is an IPv4 address to every resolver: only the dotted
        # decimal form is accepted, so "0177.0.0.2", "1.2.3.04" or "127.1" never reach one.
        try:
            return str(ipaddress.IPv4Address(host))
        except ValueError:
            raise refuse(field, "holds an IPv4 address not in dotted decimal form") from None
    if len(host) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise refuse(field, "holds an invalid host name (empty, over-long or bad labels)")
    for label in labels:
        if label.startswith("xn--"):
            try:
                if idna.encode(idna.decode(label), uts46=False).decode("ascii") != label:
                    raise idna.IDNAError(label)
            except (idna.IDNAError, UnicodeError):
                raise refuse(field, f"holds an invalid IDNA label {label!r}") from None
    return host


def _authority(netloc: str, field: str) -> tuple[str, str]:
    if "@" in netloc:
        raise refuse(field, "must not contain a user name or password")
    if netloc.startswith("["):
        end = netloc.find("]")
        if end < 0:
            raise refuse(field, "has an unclosed [ in its host")
        host, rest = netloc[:end + 1], netloc[end + 1:]
    else:
        host, colon, port = netloc.partition(":")
        rest = colon + port
    if rest and (not rest.startswith(":") or not _PORT.fullmatch(rest[1:])
                 or int(rest[1:]) > 65535):
        raise refuse(field, "has an invalid port")
    return check_host(host, field), rest


def check_url(value: Any, *, field: str) -> str:
    """An http(s) URL in canonical form: lower-case scheme and host, a dotted decimal IPv4
    or compressed IPv6 address, IDNA host names as A-labels, non-ASCII path characters
    percent-encoded. No user info, whitespace or control characters; at most ``MAX_URL``."""
    text = _string(value, field, MAX_URL)
    if has_control(text) or any(c.isspace() for c in text) or "\\" in text:
        raise refuse(field, "must not contain whitespace, backslashes or control characters")
    scheme, sep, rest = text.partition("://")
    if not sep or scheme.lower() not in _SCHEMES:
        raise refuse(field, "must be an http:// or https:// URL")
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    host, port = _authority(rest[:cut], field)
    tail = rest[cut:]
    if _BAD_PERCENT.search(tail):
        raise refuse(field, "holds a % that is not followed by two hex digits")
    canonical = f"{scheme.lower()}://{host}{port}{quote(tail, safe=_URL_SAFE + '#')}"
    if len(canonical) > MAX_URL:
        raise refuse(field, f"must be at most {MAX_URL} characters once encoded")
    return canonical


# --- identifiers, locales, text ------------------------------------------------------


def check_identifier(value: Any, *, field: str, limit: int = MAX_IDENTIFIER,
                     pattern: re.Pattern[str] | None = None, rule: str = "") -> str:
    """A key-like value (ids, names used in keys): bounded, no spaces or control characters,
    and matching ``pattern`` in full when one is given (``rule`` says what it allows)."""
    text = _string(value, field, limit)
    if has_control(text) or any(c.isspace() for c in text):
        raise refuse(field, "must not contain spaces or control characters")
    if pattern is not None and not pattern.fullmatch(text):
        raise refuse(field, rule or "is not a valid identifier")
    return text


def check_scope_id(value: Any, *, field: str = "scopeId") -> str:
    """A tenant scope id: the key of its scope, its alert rules and its flag overrides."""
    return check_identifier(value, field=field, limit=MAX_SCOPE_ID, pattern=_SCOPE_ID,
                            rule=f"must be 1-{MAX_SCOPE_ID} ASCII letters, digits or . : @ _ -")


def check_optional_identifier(value: Any, *, field: str, limit: int = MAX_IDENTIFIER
                              ) -> str | None:
    return None if value is None else check_identifier(value, field=field, limit=limit)


def check_locale(value: Any, *, field: str = "locale") -> str:
    """A BCP 47 language tag such as ``en`` or ``pt-BR`` (matched in full: ``"en\\n"`` is not)."""
    text = _string(value, field, MAX_LOCALE)
    if not _LOCALE.fullmatch(text):
        raise refuse(field, "must be a language tag such as en or pt-BR")
    return text


def check_text(value: Any, *, field: str, limit: int = MAX_LINE,
               multiline: bool = False) -> str:
    """Free text: bounded, not blank, no control characters (newlines and tabs only where
    ``multiline``: message bodies have them, titles and names do not)."""
    text = _string(value, field, limit)
    if not text.strip():
        raise refuse(field, "must not be blank")
    if has_control(text, _TEXT_BREAKS | {"\r"} if multiline else frozenset()):
        raise refuse(field, "must not contain control characters"
                     + ("" if multiline else " or line breaks"))
    return text


def check_optional_text(value: Any, *, field: str, limit: int = MAX_LINE) -> str | None:
    return None if value is None else check_text(value, field=field, limit=limit)


# --- instants -------------------------------------------------------------------------

# ISO 8601, extended format, with its offset: 2026-12-01T10:00Z, 2026-12-01T10:00:00.5+02:00
_INSTANT = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:\.[0-9]{1,6})?)?"
                      r"(?:Z|[+-][0-9]{2}:[0-9]{2})")


def check_instant(value: Any, *, field: str) -> datetime:
    """A moment as ISO 8601 with its offset (``2026-12-01T10:00:00Z``), in UTC. A time
    without an offset names no instant (whose clock?) and is refused, as is a date alone."""
    text = _string(value, field, 40)
    if not _INSTANT.fullmatch(text):
        raise refuse(field, "must be an ISO 8601 time with its offset, such as "
                            "2026-12-01T10:00:00Z or 2026-12-01T11:00:00+01:00")
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise refuse(field, f"is not a real time: {text!r}") from None
    return moment.astimezone(UTC)


# --- recipients ----------------------------------------------------------------------


def _webhook(value: Any, field: str) -> str:
    return check_url(value, field=field)


def _telegram(value: Any, field: str) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    text = _string(value, field, 40)
    if not _TELEGRAM.fullmatch(text):
        raise refuse(field, "must be a Telegram chat id (an integer) or @channelname")
    return text


def _slack(value: Any, field: str) -> str:
    text = _string(value, field, 81)
    if not _SLACK.fullmatch(text):
        raise refuse(field, "must be a Slack channel id (C0123ABC) or channel name (#name)")
    return text


def _email(value: Any, field: str) -> str:
    text = _string(value, field, MAX_EMAIL)
    local, at, domain = text.rpartition("@")
    if has_control(text) or any(c.isspace() for c in text):
        raise refuse(field, "must not contain spaces, line breaks or control characters")
    if not at or len(local) > 64 or not _EMAIL_LOCAL.fullmatch(local):
        raise refuse(field, "must be an email address (name@example.com)")
    host = check_host(domain, field)
    if host.startswith("[") or "." not in host or host[-1].isdigit():
        raise refuse(field, "must be an email address at a domain name")
    return f"{local}@{host}"


RECIPIENTS = {"webhook": _webhook, "telegram": _telegram, "slack": _slack, "email": _email}


def check_recipient(channel: str, value: Any, *, field: str) -> str:
    """What ``channel`` can address: a webhook URL, a Telegram chat id, a Slack channel, an
    email address. A channel without a check here is refused (a new channel adds one)."""
    check = RECIPIENTS.get(channel)
    if check is None:
        raise refuse(field, f"no recipient check for channel {channel!r}")
    return check(value, field)


# --- nested input ------------------------------------------------------------------

_STRING_OR_BRACKET = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


def check_depth(text: str, *, field: str = "body", limit: int = MAX_DEPTH) -> None:
    """Refuse JSON nested deeper than ``limit`` before any recursive parser sees it (about
    a thousand ``[`` would otherwise be a ``RecursionError``). Brackets inside strings do
    not count; the text need not be valid JSON."""
    if text.count("[") + text.count("{") <= limit:
        return  # fewer openers in all than the limit (strings included): cannot be deeper
    depth = 0
    for match in _STRING_OR_BRACKET.finditer(text):
        token = match.group()
        if token == "[" or token == "{":
            depth += 1
            if depth > limit:
                raise refuse(field, f"is nested deeper than {limit} levels")
        elif token == "]" or token == "}":
            depth -= 1


def load_json(text: str, *, field: str) -> Any:
    """``json.loads`` at the door: bounded depth, and any parse error a ``RequestError``."""
    check_depth(text, field=field)
    try:
        return json.loads(text)
    except ValueError as exc:
        raise refuse(field, f"is not JSON: {exc}") from None
