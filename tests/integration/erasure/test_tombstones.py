"""A purge leaves a tombstone, and a sweep that failed is retried by the next run."""

from __future__ import annotations

from collections.abc import Callable

from sluice.core.services import Services
from sluice.erasure.purge import count_subject, purge_due
from sluice.erasure.requests import ErasureStatus, ErasureStore
from sluice.store.db import utcnow
from tests.conftest import REDIS_URL, free_port
from tests.integration.erasure.erasure_data import seed_redis, seed_subject


def test_a_sweep_that_failed_with_redis_down_is_retried_by_the_next_run(
        db_url: str, redis_prefix: str, make_services: Callable[..., Services]) -> None:
    down = make_services(db_url, SLUICE_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
                         SLUICE_REDIS_KEY_PREFIX=redis_prefix)
    up = make_services(db_url, SLUICE_REDIS_URL=REDIS_URL, SLUICE_REDIS_KEY_PREFIX=redis_prefix)
    seed_subject(up.db, "u1")
    seed_redis(up, "u1")
    store = ErasureStore(up.db)
    request, _ = store.create("u1", requested_by="dpo", grace_days=0)

    first = purge_due(down, now=utcnow())
    assert first["failed"] == 1
    assert store.get(request.id).status is ErasureStatus.FAILED
    stone = store.tombstone("u1")
    assert stone is not None and stone["request_id"] == request.id and stone["sweep_pending"]
    assert count_subject(up, "u1")["redis:ai:ledger:retry:queue"] == 2

    second = purge_due(up, now=utcnow())  # no operator in between
    assert (second["resumed"], second["purged"], second["failed"]) == (1, 1, 0)
    done = store.get(request.id)
    assert done.status is ErasureStatus.PURGED and done.verified_at is not None
    assert not any(count_subject(up, "u1").values())
    stone = store.tombstone("u1")
    assert stone is not None and not stone["sweep_pending"]
    assert purge_due(up, now=utcnow())["resumed"] == 0
