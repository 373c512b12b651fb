"""One TLS context per process for Sluice's outbound HTTPS clients.

Building a context loads the CA bundle: about 30 ms of CPU. The scheduled functions built
an HTTP client, and so a context, on every run, which was most of an idle run's CPU (and
of its bill). A context is only read once made, so clients and threads can share it; the
clients themselves (and their connections) still live for one run.
"""

from __future__ import annotations

import ssl
from functools import cache


@cache
def tls_context(*, trust_env: bool = True) -> ssl.SSLContext:
    """The process's verifying context (``trust_env``: honour ``SSL_CERT_FILE``/``_DIR``)."""
    import httpx  # only the functions that make HTTPS calls pay for it

    return httpx.create_ssl_context(trust_env=trust_env)
