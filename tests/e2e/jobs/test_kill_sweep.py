"""The reduced kill sweep: every crash point found in shared/, killed on both stores at its
first pass, and on SQLite at its second too (within a batch); then the drain finishes and
nothing is lost, stuck, or duplicated where the receiver cannot deduplicate it. The whole
sweep, both positions on both stores, is ``python -m bench chaos``."""

from __future__ import annotations

from contextlib import ExitStack

import pytest

from bench.chaos.kill import (
    SCENARIOS,
    ConsumerKill,
    Metering,
    Plan,
    one_run,
    random_kills,
    sluice,
    sweep,
)
from bench.chaos.points import discover
from bench.chaos.stores import ScratchStores
from sluice.core.crash import CRASH_EXIT_CODE

# the positions killed, by store: the second pass on one store keeps the suite's time
POSITIONS = {"sqlite": (1, 2), "postgres": (1,)}


@pytest.mark.timeout(600)  # a run is several processes; the 2-core machine is shared
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.job)
def test_kills_at_every_point_lose_nothing_and_leave_nothing_stuck(
        backend: str, scenario: type, redis_server: str, pg_template: str) -> None:
    points = [p for p in discover() if p.startswith(scenario.prefix)]
    assert points, f"no crash point of {scenario.job} found"

    positions = POSITIONS[backend]
    tallies = sweep(Plan(backends=(backend,), positions=positions), points=points)
    [tally] = [t for t in tallies if t.scenario == f"{scenario.name} [{backend}]"]

    assert tally.runs == len(points) * len(positions)
    assert tally.points_reached == set(points), "every point killed the drain at least once"
    assert (tally.lost, tally.stuck, tally.unexpected, tally.burned) == (0, 0, 0, 0), tally.notes
    assert tally.notes == []


def test_the_checker_sees_work_a_killed_drain_left_undone(pg_template: str) -> None:
    """Without the completion run the check must report the stranded rows (not vacuous)."""
    with ExitStack() as stack, ScratchStores() as stores:
        scenario = Metering(stack)
        url = stores.fresh("sqlite")
        env = {"SLUICE_DATABASE_URL": url, **scenario.prepare(url)}
        crashed = sluice(["run", "metering-flush", "--json"], env,
                         crash_at="metering.after_claim@2")
        assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr
        counts = scenario.check(url)
        assert counts.stuck == Metering.ROWS - 1 and counts.lost == 0

        finished, reached = one_run(scenario, stores, "sqlite", "metering.after_send", 1)
        assert reached and (finished.lost, finished.stuck, finished.duplicated) == (0, 0, 1)


def test_the_consumer_checker_sees_what_a_killed_batch_left_and_what_redelivery_repeated(
        pg_template: str) -> None:
    """Not vacuous: without redelivery the check reports the batch still on the queue (and
    no lost work); with it, the record in flight at the kill applied twice, once allowed."""
    with ExitStack() as stack, ScratchStores() as stores:
        scenario = ConsumerKill(stack)
        url = stores.fresh("sqlite")
        env = {"SLUICE_DATABASE_URL": url, **scenario.prepare(url)}
        crashed = sluice([], env, crash_at="consumer.after_handler@2",
                         module="bench.chaos.consumer")
        assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr
        counts = scenario.check(url)
        assert (counts.stuck, counts.lost, counts.duplicated) == (ConsumerKill.GOOD + 2, 0, 0)

        finished, reached = one_run(scenario, stores, "sqlite", "consumer.after_handler", 2)
        assert reached and finished.notes == []
        assert (finished.lost, finished.stuck, finished.duplicated, finished.unexpected) == (
            0, 0, 1, 0)


def test_kills_from_outside_at_seeded_moments_lose_nothing(
        redis_server: str, pg_template: str) -> None:
    tallies = random_kills(("postgres",), seed=14, per_drain=1)
    assert len(tallies) == len(SCENARIOS)
    for tally in tallies:
        assert (tally.lost, tally.stuck, tally.unexpected, tally.burned) == (0, 0, 0, 0), tally
        assert tally.notes == []
