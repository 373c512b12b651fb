"""Old home of the AI usage fixtures, kept so that existing imports work.

The fixtures live in ``tests/integration/conftest.py`` now, where pytest finds them
without any import; new tests should simply name them as arguments.
"""

from __future__ import annotations

from tests.integration.billing.usage_data import T0, entry, envelope
from tests.integration.conftest import polar, redis_client, redis_env, transport, upstash_server

__all__ = ["T0", "entry", "envelope", "polar", "redis_client", "redis_env", "transport",
           "upstash_server"]
