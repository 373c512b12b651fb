"""The serverless wiring is generated from the job and topic tables, and committed as generated."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from infra import generate
from sluice.core.observe import metrics
from sluice.jobs.registry import JOBS, Job
from sluice.jobs.schedule import job_schedules
from sluice.queues.topics import TOPICS, Topic
from tests.conftest import ROOT


class _Loader(yaml.SafeLoader):
    pass


def _tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    value = loader.construct_scalar(node) if isinstance(node, yaml.ScalarNode) else None
    return {"!" + suffix: value}


_Loader.add_multi_constructor("!", _tag)


def _load(text: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.load(text, Loader=_Loader)
    return data


def test_the_committed_files_are_the_generated_ones() -> None:
    assert generate.stale() == [], "run `python -m infra.generate` and commit the result"


def test_serverless_yml_has_one_function_per_job_and_topic() -> None:
    functions = _load((ROOT / "serverless.yml").read_text())["functions"]
    expected = {"http"} | {generate.camel(j) for j in JOBS} | {generate.camel(t) for t in TOPICS}
    assert set(functions) == expected
    assert job_schedules(JOBS) == {name: [job.schedule] for name, job in JOBS.items()}
    for name, topic in TOPICS.items():
        function = functions[generate.camel(name)]
        assert function["handler"] == "functions/consumers.handler"
        assert function["environment"] == {"SLUICE_TOPIC": name}
        [event] = function["events"]
        assert event["sqs"]["functionResponseType"] == "ReportBatchItemFailures"
        assert event["sqs"]["arn"] == {"!GetAtt": f"{generate.pascal(name)}Queue.Arn"}
        expected_concurrency = (
            f"${{env:{topic.concurrency_var}, {topic.max_concurrency}}}"
            if topic.concurrency_var else topic.max_concurrency)
        assert event["sqs"].get("maximumConcurrency") == expected_concurrency


def test_every_scheduled_function_alarms_on_lambda_errors_and_drain_failures() -> None:
    resources = _load((ROOT / "infra" / "alarms.yml").read_text())["Resources"]
    alarms = [r["Properties"] for r in resources.values() if r["Type"] == "AWS::CloudWatch::Alarm"]
    # The DrainFailures alarm matches the dimensions the runner's metric really carries.
    metrics.add_metric(name="DrainFailures", unit="Count", value=1)
    metrics.add_dimension(name="job", value="any")
    emitted = metrics.serialize_metric_set()["_aws"]["CloudWatchMetrics"][0]
    metrics.clear_metrics()
    for name in JOBS:
        function = generate.lambda_id(generate.camel(name))
        [errors] = [a for a in alarms if a["MetricName"] == "Errors"
                    and a["Dimensions"] == [{"Name": "FunctionName", "Value": {"!Ref": function}}]]
        assert errors["Namespace"] == "AWS/Lambda" and errors["AlarmActions"]
        [drain] = [a for a in alarms if a["MetricName"] == "DrainFailures"
                   and {"Name": "job", "Value": name} in a["Dimensions"]]
        assert drain["Namespace"] == emitted["Namespace"]
        assert sorted(d["Name"] for d in drain["Dimensions"]) == sorted(emitted["Dimensions"][0])
        assert drain["Threshold"] == 0 and drain["AlarmActions"]


@pytest.mark.parametrize(("metric", "suffix"), [("QueueMessagesRejected", "RejectedAlarm"),
                                                ("QueueOutageWaits", "OutageWaitsAlarm")])
def test_every_topic_alarms_when_its_consumer_quarantines_or_waits_for_a_store(
        metric: str, suffix: str) -> None:
    # QueueOutageWaits: a waiting message is a new copy every few minutes, so the oldest
    # message's age never shows a store outage; this alarm does
    resources = _load((ROOT / "infra" / "alarms.yml").read_text())["Resources"]
    metrics.add_metric(name=metric, unit="Count", value=1)
    metrics.add_dimension(name="topic", value="any")
    emitted = metrics.serialize_metric_set()["_aws"]["CloudWatchMetrics"][0]
    metrics.clear_metrics()
    for name in TOPICS:
        alarm = resources[f"{generate.pascal(name)}{suffix}"]["Properties"]
        assert alarm["Namespace"] == emitted["Namespace"]
        assert alarm["MetricName"] == metric
        assert {"Name": "topic", "Value": name} in alarm["Dimensions"]
        assert sorted(d["Name"] for d in alarm["Dimensions"]) == sorted(emitted["Dimensions"][0])


def test_a_new_topic_and_a_publishing_job_are_one_table_entry_each() -> None:
    topic = Topic("news.digest", "shared.news:digest_handler", batch_size=5)
    job = Job(name="news-tick", route="/api/admin/news/tick", schedule="rate(5 minutes)",
              surface="state", target="shared.news:tick", publishes=("news.digest",))
    topics = [*TOPICS.values(), topic]
    jobs = [*JOBS.values(), job]
    queues = _load(generate.queues_yml(topics))["Resources"]
    assert queues["NewsDigestQueue"]["Properties"]["RedrivePolicy"]["deadLetterTargetArn"] == {
        "!GetAtt": "NewsDigestDlq.Arn"}
    alarms = _load(generate.alarms_yml(jobs, topics))["Resources"]
    assert {"NewsDigestDlqDepthAlarm", "NewsDigestOldestMessageAlarm", "NewsTickErrorsAlarm",
            "NewsTickDrainFailuresAlarm"} <= set(alarms)
    iam = _load(generate.iam_yml(jobs, topics))["Resources"]
    [publish] = iam["NewsTickJobRole"]["Properties"]["Policies"]
    assert publish["PolicyDocument"]["Statement"][0]["Resource"] == [
        {"!GetAtt": "NewsDigestQueue.Arn"}]
    consume = iam["NewsDigestConsumerRole"]["Properties"]["Policies"][0]["PolicyDocument"]
    assert [s["Resource"] for s in consume["Statement"]] == [
        [{"!GetAtt": "NewsDigestQueue.Arn"}], [{"!GetAtt": "NewsDigestDlq.Arn"}]]
    functions = _load("functions:\n" + generate.functions_block(jobs, topics, "functions/"))["functions"]
    assert functions["newsTick"]["role"] == "NewsTickJobRole"
    assert functions["newsTick"]["environment"] == {"SLUICE_JOB": "news-tick"}
    assert functions["newsDigest"]["events"][0]["sqs"]["batchSize"] == 5


def test_a_topic_sized_by_a_setting_names_a_real_setting_with_that_default() -> None:
    from sluice.core.settings import Settings, fields

    by_var = {var.name: name for name, var in fields().items()}
    for topic in TOPICS.values():
        if topic.concurrency_var:
            field = by_var[topic.concurrency_var]
            assert Settings._field_defaults[field] == topic.max_concurrency


def _schedule_seconds(expression: str) -> int:
    """The oracle: a rate's interval, or the longest gap between a cron's next 400 times."""
    import itertools
    import re
    from datetime import UTC, datetime

    from croniter import croniter

    if match := re.fullmatch(r"rate\((\d+) (minute|hour|day)s?\)", expression):
        return int(match.group(1)) * {"minute": 60, "hour": 3600, "day": 86400}[match.group(2)]
    minute, hour, dom, month, dow, _ = expression[5:-1].split()
    times = croniter(" ".join([minute, hour, dom.replace("?", "*"), month,
                               dow.replace("?", "*")]), datetime(2026, 1, 1, tzinfo=UTC))
    fires = [times.get_next(datetime) for _ in range(400)]
    return int(max((b - a).total_seconds() for a, b in itertools.pairwise(fires)))


def test_every_job_has_one_missed_run_alarm_on_its_invocations() -> None:
    resources = _load((ROOT / "infra" / "alarms.yml").read_text())["Resources"]
    alarms = [r["Properties"] for r in resources.values() if r["Type"] == "AWS::CloudWatch::Alarm"
              and r["Properties"]["MetricName"] == "Invocations"]
    assert len(alarms) == len(JOBS)
    for name, job in JOBS.items():
        function = {"!Ref": generate.lambda_id(job.function_key)}
        [alarm] = [a for a in alarms if a["Dimensions"] == [{"Name": "FunctionName",
                                                              "Value": function}]]
        assert (alarm["Namespace"], alarm["Statistic"], alarm["ComparisonOperator"],
                alarm["Threshold"], alarm["TreatMissingData"], alarm["EvaluationPeriods"]) == (
            "AWS/Lambda", "Sum", "LessThanThreshold", 1, "breaching", 1), name
        # Its window covers the schedule's longest gap with a grace (at least 5 minutes, at
        # most half a period), in whole minutes, within CloudWatch's limits.
        gap, period = _schedule_seconds(job.schedule), alarm["Period"]
        assert gap + 300 <= period <= gap * 1.5 + 300 and period % 60 == 0, (name, period)
        assert period <= (86_400 if period < 3600 else 604_800), name
        assert alarm["AlarmActions"] == [{"!Ref": "AlarmTopic"}]


def test_the_apps_template_keeps_sluices_own_deployment_settings(tmp_path: Any) -> None:
    """An app's serverless.yml (sluice generate's template) differs from Sluice's own only in
    what an app changes: its name, its handlers (the wheel's), its packages and its lock."""
    from sluice.deploy.generate import Deployment, outputs

    own = _load((ROOT / "serverless.yml").read_text())
    target = Deployment(tmp_path, service="myapp", packages=("myapp", "shared"))
    app = _load(outputs(target, dict(JOBS.using(())), dict(TOPICS.using(())))[
        tmp_path / "serverless.yml"])
    assert app["service"] == "myapp"
    assert app["provider"]["environment"].pop("SLUICE_APP") == ""  # no extension here
    assert app["provider"] == own["provider"] and app["resources"] == own["resources"]
    assert app["plugins"] == own["plugins"] == ["./infra/plugins/sluice-packaging.js"]
    own_packaging, app_packaging = own["custom"].pop("packaging"), app["custom"].pop("packaging")
    assert app["custom"] == own["custom"]
    assert app_packaging.pop("lock") == "requirements.lock"
    assert own_packaging.pop("lock") == "infra/requirements.lock"
    assert own_packaging.pop("sourceRoot") == "shared/"
    own_packaging["only"][0]["ship"].remove("functions/http.py")
    assert app_packaging == own_packaging
    assert app["package"]["patterns"] == [
        "!**", "myapp/**", "shared/**", "serverless.yml", "!**/__pycache__/**"]
    assert set(app["functions"]) == set(own["functions"])
    for name, function in own["functions"].items():
        mine = app["functions"][name]
        assert mine.pop("handler") == function.pop("handler").replace(
            "functions/", "sluice/lambda_handlers/")
        assert mine == function, name
