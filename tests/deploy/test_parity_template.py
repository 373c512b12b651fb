"""The scheduled surface as the reference documents describe it, in the template that
``osls package`` writes: the rss tick's function gets the document's 300 seconds, and the
schedules come from one table (the job registry), one EventBridge rule per job."""

from __future__ import annotations

import pytest

from sluice.jobs.registry import JOBS
from tests.deploy.conftest import Packaged
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
