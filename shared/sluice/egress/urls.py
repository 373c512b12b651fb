"""URLs as the HTTP layer will read them: what cannot be parsed is refused, typed.

A host the HTTP library would reject when the request is made (``0177.0.0.2``,
``[::1``, an empty label, a bad IDNA form) is refused here, at save time and per item,
never raised as a library error in the middle of a run.
"""

from __future__ import annotations

import ipaddress

import httpx

from sluice.egress.errors import DestinationRefused

SCHEMES = ("http", "https")


def parse_url(url: str, *, field: str = "url") -> tuple[str, int]:
    """``(host, port)`` of an http(s) URL with a host; ``DestinationRefused`` otherwise."""
    if any(ord(c) < 0x21 or c == "\x7f" for c in url):
        raise DestinationRefused("the URL holds spaces or control characters", field=field)
    try:
        parsed = httpx.URL(url)
        _ = parsed.host  # decodes the IDNA form: a malformed A-label ("xn--") raises here
        host, port = parsed.raw_host.decode("ascii").lower(), parsed.port
    except (httpx.InvalidURL, ValueError, UnicodeError):
        raise DestinationRefused("the URL cannot be parsed (host, port or brackets)",
                                 field=field) from None
    if parsed.scheme not in SCHEMES:
        raise DestinationRefused("only http and https URLs are allowed", field=field)
    if not host:
        raise DestinationRefused("the URL has no host", field=field)
    if port is not None and not 0 < port < 65536:
        raise DestinationRefused("the URL's port is out of range", field=field)
    if ":" not in host and not _dotted_quad(host):
        labels = host.removesuffix(".").split(".")
        if any(not label for label in labels):
            raise DestinationRefused("the URL's host has an empty label", field=field)
        if _numeric(labels[-1]):
            # 2130706433, 0x7f.1, 127.1: the resolver reads these as addresses in forms
            # no one writes on purpose; only the dotted-quad form is accepted
            raise DestinationRefused("the URL's host is a number that is not a dotted-quad "
                                     "address", field=field)
    return host, port or (443 if parsed.scheme == "https" else 80)


def receiver(url: str) -> tuple[str, int]:
    """The receiver an http(s) URL reaches, ``(host, port)``, as one name however the URL
    writes it: the host as ``parse_url`` reads it (lower case, an IDNA A-label, an IPv6
    address unbracketed, in its compressed form: ``[0:0::1]`` is ``::1``) without a
    trailing dot (the resolver reads ``name.`` as ``name``), the scheme's default port
    written out (https 443, http 80). ``DestinationRefused`` when it cannot be parsed."""
    host, port = parse_url(url)
    if ":" in host:
        try:
            return ipaddress.IPv6Address(host).compressed, port
        except ValueError:
            raise DestinationRefused("the URL's IPv6 address is invalid") from None
    return host.removesuffix("."), port


def _dotted_quad(host: str) -> bool:
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return False
    return True


def _numeric(label: str) -> bool:
    label = label.lower()
    return label.isdigit() or (label.startswith("0x") and
                               all(c in "0123456789abcdef" for c in label[2:]))
