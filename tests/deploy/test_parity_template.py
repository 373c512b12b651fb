"""The scheduled surface as the reference documents describe it, in the template that
``osls package`` writes: the rss tick's function gets the document's 300 seconds, and the
schedules come from one table (the job registry), one EventBridge rule per job, and the
four topics of the document each have their queue and dead-letter queue."""

from __future__ import annotations

import pytest

from sluice.jobs.registry import JOBS
from tests.deploy.conftest import PREFIX, Packaged
from tests.deploy.test_template import function_for_job, getatt

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_the_rss_tick_function_gets_300_seconds(packaged: Packaged) -> None:
    _, function = function_for_job(packaged, "rss-refresh")
    assert function["Properties"]["Timeout"] == 300


def test_every_schedule_in_the_template_is_a_registered_jobs(packaged: Packaged) -> None:
    """The rules are the registry's: one per job, on that job's function, and no other."""
    functions = {function_for_job(packaged, name)[0]: name for name in JOBS}
    scheduled = {}
    for rule in packaged.of_type("AWS::Events::Rule").values():
        properties = rule["Properties"]
        if "ScheduleExpression" not in properties:
            continue
        [target] = properties["Targets"]
        scheduled[functions[getatt(target["Arn"])]] = properties["ScheduleExpression"]
    assert scheduled == {name: job.schedule for name, job in JOBS.items()}


def test_the_four_documented_topics_each_have_a_queue_and_a_dlq(packaged: Packaged) -> None:
    queues = {q["Properties"]["QueueName"] for q in packaged.of_type("AWS::SQS::Queue").values()}
    topics = {PREFIX + name for name in ("rss-ingest", "rss-enrich", "rss-cluster",
                                         "rss-synthesize")}
    assert {q for q in queues if q.startswith(PREFIX + "rss-")} == (
        topics | {name + "-dlq" for name in topics})
