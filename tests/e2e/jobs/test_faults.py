"""Provider and store faults: typed answers in time, nothing lost or stuck, and the next
run finishes once the provider or the store is back."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from bench.chaos.faults import (
    delivery_fault,
    metering_fault,
    pg_table_locked,
    pg_terminated,
    redis_stopped,
)
from bench.chaos.kill import Counts
from bench.chaos.stores import ScratchStores

BACKENDS = ["sqlite", "postgres"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fault", ["429+Retry-After", "500", "reset", "401"])
def test_a_polar_outage_fails_nothing_for_good_and_burns_no_attempt(
        backend: str, fault: str, pg_template: str) -> None:
    with ScratchStores() as stores:
        counts = metering_fault(stores, backend, fault)
    assert counts == Counts(), counts


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fault", ["429", "500", "timeout", "reset", "401"])
def test_a_webhook_outage_fails_nothing_for_good_and_burns_no_attempt(
        backend: str, fault: str, pg_template: str) -> None:
    with ScratchStores() as stores:
        counts = delivery_fault(stores, backend, fault)
    assert counts == Counts(), counts


@pytest.mark.parametrize("scenario", [pg_table_locked, pg_terminated],
                         ids=["table-locked", "postgres-gone"])
def test_postgres_faults_answer_typed_in_time_and_the_next_run_completes(
        scenario: Callable[[ScratchStores], Counts], pg_template: str) -> None:
    with ScratchStores() as stores:
        counts = scenario(stores)
    assert (counts.lost, counts.stuck, counts.unexpected, counts.notes) == (0, 0, 0, [])


@pytest.mark.parametrize("backend", BACKENDS)
def test_redis_stopped_mid_redrive_answers_typed_and_the_next_run_completes(
        backend: str, redis_server: str, pg_template: str) -> None:
    with ScratchStores() as stores:
        counts = redis_stopped(stores, backend)
    assert counts == Counts(), counts
