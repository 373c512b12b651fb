"""Which destinations named in data (feed URLs, webhook recipients) Sluice may call.

A destination is refused unless it is http(s), has a host the HTTP layer can parse, and
every address its host resolves to is public: not loopback, private, link-local (the
instance metadata address included), multicast, reserved or unspecified. The connection
is then made to an address that was checked, so a DNS answer cannot change between the
check and the connection. Hosts (or ``host:port``) on the destination kind's allow-list
skip the address check: ``SLUICE_FEED_ALLOW_HOSTS`` for feeds,
``SLUICE_WEBHOOK_ALLOW_HOSTS`` for webhooks.

Refusals never name a resolved address: the text reaches ``lastError`` and the console.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Callable, Iterable

from sluice.egress.errors import DestinationRefused, NotSent

Resolver = Callable[[str, int], list[str]]


def system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def refusal(address: str) -> str | None:
    """Why ``address`` may not be called, or None when it is a public address."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for kind in ("loopback", "unspecified", "link_local", "multicast", "reserved", "private"):
        if getattr(ip, f"is_{kind}"):
            return kind.replace("_", "-")
    if not ip.is_global:
        return "not-global"
    return None


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def resolve_within(resolver: Resolver, host: str, port: int, timeout: float | None) -> list[str]:
    """``resolver(host, port)``, given up after ``timeout`` seconds.

    ``getaddrinfo`` has no timeout of its own, so it runs on a daemon thread that is
    abandoned if it does not answer in time (it ends when the system resolver gives up).
    """
    if timeout is None:
        return resolver(host, port)
    found: list[list[str]] = []
    failed: list[BaseException] = []
    done = threading.Event()

    def work() -> None:
        try:
            found.append(resolver(host, port))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            failed.append(exc)
        finally:
            done.set()

    threading.Thread(target=work, name="egress-resolve", daemon=True).start()
    if not done.wait(max(0.0, timeout)):
        raise TimeoutError(f"resolving {host} took longer than {timeout:.3g} s")
    if failed:
        raise failed[0]
    return found[0]


class AddressGuard:
    """The addresses one kind of destination may reach.

    ``setting`` names the allow-list variable in refusals, so an operator knows where an
    exception goes; ``field`` is the request field a save-time refusal names.
    """

    def __init__(self, allow_hosts: Iterable[str] = (), resolver: Resolver = system_resolver,
                 *, setting: str = "SLUICE_FEED_ALLOW_HOSTS", field: str = "url",
                 trust_all: bool = False) -> None:
        self.allow_hosts = frozenset(h.strip().lower() for h in allow_hosts if h.strip())
        self.resolver = resolver
        self.setting = setting
        self.field = field
        self.trust_all = trust_all

    def refused(self, why: str, field: str | None = None) -> DestinationRefused:
        return DestinationRefused(f"{why} ({self.setting} lists exceptions)",
                                  field=field or self.field)

    def allowed_host(self, host: str, port: int | None = None) -> bool:
        host = host.lower().strip("[]")
        return host in self.allow_hosts or (port is not None
                                            and f"{host}:{port}" in self.allow_hosts)

    def check_url(self, url: str, *, resolve: bool = False, field: str | None = None) -> None:
        """Refuse a URL that is not http(s), that the HTTP layer cannot parse, or that names
        a refused address. Without ``resolve`` this never touches the network (save-time
        checks); every connection checks the resolved addresses anyway."""
        from sluice.egress.urls import parse_url

        host, port = parse_url(url, field=field or self.field)
        if self.trust_all or self.allowed_host(host, port):
            return
        name = host.rstrip(".")
        if name == "localhost" or name.endswith(".localhost"):
            raise self.refused("the destination is a loopback name", field)
        if is_ip(host) or resolve:
            try:
                self.addresses(host, port)
            except DestinationRefused as exc:
                raise DestinationRefused(exc.message, field=field or self.field) from None

    def addresses(self, host: str, port: int, timeout: float | None = None) -> list[str]:
        """The addresses to connect to for ``host``; refused if any of them is not public.
        Resolution is given up after ``timeout`` seconds."""
        try:
            found = ([host.strip("[]")] if is_ip(host)
                     else resolve_within(self.resolver, host, port, timeout))
        except TimeoutError as exc:
            raise NotSent(f"cannot resolve {host}: no answer in time") from exc
        except OSError as exc:
            raise NotSent(f"cannot resolve {host}: {exc.strerror or type(exc).__name__}"
                          ) from exc
        if not found:
            raise NotSent(f"{host} has no address")
        if self.trust_all or self.allowed_host(host, port):
            return found
        reasons = [why for why in map(refusal, found) if why is not None]
        if reasons:
            # an address written in the URL may be named by its kind; what a name resolves
            # to is never described (that would map the inside of the network)
            raise self.refused(f"the destination is a {reasons[0]} address" if is_ip(host)
                               else "the destination is not a public address")
        return found


def trusted(resolver: Resolver = system_resolver) -> AddressGuard:
    """The guard of provider base URLs from settings: trusted as configured (any address),
    still resolved under the deadline."""
    return AddressGuard((), resolver, setting="(trusted)", trust_all=True)
