"""Where the simulated webhook receivers listen: each on a port of its own of 127.0.0.1,
so each is a destination of its own, as Sluice keys one (``webhook:host:port``)."""

from __future__ import annotations

HOOK_PORTS = range(7100, 7200)  # each simulated webhook receiver listens on a port of its own
# the hooks of this tenant number share one host and port: many URLs on one host
# (``isolation.py``), a destination's rate and outages being the host's
SHARED = 9


def hook_host(recipient: str) -> str:
    """The host and port of the receiver of webhook ``hook-<t>-<r>``: each on a port of its
    own (a destination of its own, as Sluice keys it: ``webhook:host:port``)."""
    tenant, rule = (int(part) for part in recipient.removeprefix("hook-").split("-")[:2])
    if tenant == SHARED:
        return f"127.0.0.1:{HOOK_PORTS.start + 10 * tenant}"
    return f"127.0.0.1:{HOOK_PORTS.start + 10 * tenant + rule}"


def hook_url(recipient: str) -> str:
    """The URL of webhook ``hook-<t>-<r>``: its rule's recipient, its path the name."""
    return f"http://{hook_host(recipient)}/{recipient}"


def is_hook_host(host: str) -> bool:
    name, _, port = host.partition(":")
    return name == "127.0.0.1" and port.isdigit() and int(port) in HOOK_PORTS
