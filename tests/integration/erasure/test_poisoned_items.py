"""One bad request never stops erasure-purge: a purge the store refuses is that request's
failure, recorded on it with its reason (out of the due list until an operator confirms
it again), and the other due requests are purged."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest

from sluice.core.services import Services
from sluice.erasure.purge import purge_due
from sluice.erasure.requests import ErasureStatus, ErasureStore
from sluice.store.db import utcnow
from tests.conftest import REDIS_URL
from tests.integration.erasure.erasure_data import seed_subject


@pytest.fixture
def svc(db_url: str, redis_prefix: str, make_services: Callable[..., Services]) -> Services:
    return make_services(db_url, SLUICE_REDIS_URL=REDIS_URL, SLUICE_REDIS_KEY_PREFIX=redis_prefix)


def test_a_purge_the_store_refuses_fails_that_request_alone(svc: Services) -> None:
    store = ErasureStore(svc.db)
    now = utcnow()
    ids = {}
    for i, subject in enumerate(("a", "poison", "c")):
        seed_subject(svc.db, subject, rows=1)
        request, _ = store.create(subject, requested_by="x", grace_days=0,
                                  now=now - timedelta(minutes=3 - i))
        ids[subject] = request.id
    with svc.db.transaction() as tx:  # something else still points at one of its rows
        tx.execute("CREATE TABLE poison_ref (id text REFERENCES ai_usage_ledger (id))")
        tx.execute("INSERT INTO poison_ref (id) VALUES ('poison-l0')")

    result = purge_due(svc, now=now)

    assert (result["purged"], result["failed"], result["reason"]) == (2, 1, None)
    failed = store.get(ids["poison"])
    assert failed.status is ErasureStatus.FAILED
    assert "constraint_violation" in (failed.last_error or "")
    assert store.get(ids["c"]).status is not ErasureStatus.REQUESTED, "the next one was purged"
    assert purge_due(svc, now=now)["due"] == 0, "not retried every run"
