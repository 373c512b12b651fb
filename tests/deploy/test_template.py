"""The packaged CloudFormation template: lint-clean, and wired as the registries say.

Expectations come from the job registry (``sluice.jobs.registry.JOBS``) and the topic list
(``sluice.queues.topics.TOPICS``), so adding a job or a topic without its serverless.yml
function, queue or role fails here.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from sluice.core.secrets import SECRET_NAMES
from sluice.jobs.registry import JOBS
from sluice.queues.topics import TOPICS
from tests.deploy.conftest import PREFIX, Packaged

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

# opentelemetry/: OpenTelemetry's API, FastAPI's dependency; the otel extra (the SDK, the
# exporter) is in no zip: it comes as a layer (docs/observability.md)
HTTP_STACK = ("fastapi/", "starlette/", "pydantic/", "pydantic_core/", "mangum/",
              "opentelemetry/")


def topics() -> tuple[str, ...]:
    return tuple(TOPICS)


def implemented() -> frozenset[str]:
    return frozenset(name for name, topic in TOPICS.items() if not topic.reserved)


def getatt(value: Any) -> str | None:
    if isinstance(value, dict) and "Fn::GetAtt" in value:
        target = value["Fn::GetAtt"]
        return str(target[0] if isinstance(target, list) else target.split(".")[0])
    return None


def by_name(packaged: Packaged, kind: str, name: str) -> str:
    found = [k for k, v in packaged.of_type(kind).items()
             if v["Properties"].get("QueueName") == name]
    assert len(found) == 1, f"expected one {kind} named {name}, found {found}"
    return found[0]


def function_for_job(packaged: Packaged, job: str) -> tuple[str, dict[str, Any]]:
    found = [(k, v) for k, v in packaged.functions().items()
             if v["Properties"].get("Environment", {}).get("Variables", {}).get("SLUICE_JOB") == job]
    assert len(found) == 1, f"job {job}: expected one function with SLUICE_JOB={job}, got {found}"
    return found[0]


def statements(packaged: Packaged, role_id: str) -> list[dict[str, Any]]:
    role = packaged.resources[role_id]["Properties"]
    found = [s for policy in role.get("Policies", []) for s in policy["PolicyDocument"]["Statement"]]
    for arn in role.get("ManagedPolicyArns", []):
        if isinstance(arn, dict) and "Ref" in arn:
            found += packaged.resources[arn["Ref"]]["Properties"]["PolicyDocument"]["Statement"]
    return found


def resources_of(statement: dict[str, Any]) -> list[Any]:
    resource = statement.get("Resource", [])
    return resource if isinstance(resource, list) else [resource]


def test_cfn_lint_reports_no_errors(packaged: Packaged) -> None:
    template = packaged.out / "cloudformation-template-update-stack.json"
    done = subprocess.run([sys.executable, "-m", "cfnlint", "--format", "parseable", str(template)],
                          capture_output=True, text=True, timeout=300, check=False)
    errors = [line for line in done.stdout.splitlines() if ":E" in line]
    assert errors == [], "\n".join(errors)
    assert done.returncode & 2 == 0, done.stdout + done.stderr  # cfn-lint's error bit


def test_every_job_has_its_schedule_rule_and_timeout(packaged: Packaged) -> None:
    rules = packaged.of_type("AWS::Events::Rule")
    permissions = packaged.of_type("AWS::Lambda::Permission")
    assert JOBS, "the job registry is empty"
    for job in JOBS.values():
        logical_id, fn = function_for_job(packaged, job.name)
        assert fn["Properties"]["Handler"] == "functions/cron.handler"
        assert fn["Properties"]["Timeout"] == job.timeout_s, job.name
        targeting = [r["Properties"] for r in rules.values()
                     if any(getatt(t["Arn"]) == logical_id for t in r["Properties"]["Targets"])]
        assert [r["ScheduleExpression"] for r in targeting] == [job.schedule], job.name
        assert all(r["State"] == "ENABLED" for r in targeting)
        assert any(getatt(p["Properties"]["FunctionName"]) == logical_id
                   and p["Properties"]["Principal"] == "events.amazonaws.com"
                   for p in permissions.values()), f"{job.name}: EventBridge may not invoke it"
        # The cron GET with the job's whole time: a function URL on this very function.
        urls = [u["Properties"] for u in packaged.of_type("AWS::Lambda::Url").values()
                if getatt(u["Properties"]["TargetFunctionArn"]) == logical_id]
        assert [u["AuthType"] for u in urls] == ["NONE"], f"{job.name}: no function URL"


def test_every_topic_has_queue_dlq_and_partial_batch_consumer(packaged: Packaged) -> None:
    mappings = packaged.of_type("AWS::Lambda::EventSourceMapping")
    functions = packaged.functions()
    assert topics(), "no topics"
    for topic in topics():
        name = PREFIX + topic.replace(".", "-")
        queue_id = by_name(packaged, "AWS::SQS::Queue", name)
        dlq_id = by_name(packaged, "AWS::SQS::Queue", name + "-dlq")
        queue = packaged.resources[queue_id]["Properties"]
        dlq = packaged.resources[dlq_id]["Properties"]
        assert getatt(queue["RedrivePolicy"]["deadLetterTargetArn"]) == dlq_id
        assert queue["RedrivePolicy"]["maxReceiveCount"] > 5  # above the wrapper's 5 attempts
        assert dlq["MessageRetentionPeriod"] >= 7 * 86400  # room for the redrive tooling

        consuming = [m["Properties"] for m in mappings.values()
                     if getatt(m["Properties"]["EventSourceArn"]) == queue_id]
        assert len(consuming) == 1, f"{topic}: expected one consumer, got {consuming}"
        mapping = consuming[0]
        assert mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"], topic
        if topic in implemented():  # a working consumer writes downstream: its fan-out is capped
            assert 2 <= mapping["ScalingConfig"]["MaximumConcurrency"] <= 50, topic
        consumer_id = getatt(mapping["FunctionName"])
        assert consumer_id in functions, topic
        timeout = functions[consumer_id]["Properties"]["Timeout"]
        assert queue["VisibilityTimeout"] >= max(300, timeout), topic


def test_alarms_watch_every_dlq_and_oldest_message(packaged: Packaged) -> None:
    alarms = [a["Properties"] for a in packaged.of_type("AWS::CloudWatch::Alarm").values()]
    for topic in topics():
        name = PREFIX + topic.replace(".", "-")
        for queue, metric in ((name + "-dlq", "ApproximateNumberOfMessagesVisible"),
                              (name, "ApproximateAgeOfOldestMessage")):
            queue_id = by_name(packaged, "AWS::SQS::Queue", queue)
            assert any(a["MetricName"] == metric and a["AlarmActions"]
                       and getatt(a["Dimensions"][0]["Value"]) == queue_id for a in alarms), (
                f"no {metric} alarm on {queue}")


def test_every_scheduled_function_alarms_on_errors_and_drain_failures(
        packaged: Packaged) -> None:
    alarms = [a["Properties"] for a in packaged.of_type("AWS::CloudWatch::Alarm").values()]
    for job in JOBS.values():
        logical_id, _ = function_for_job(packaged, job.name)
        assert any(a["Namespace"] == "AWS/Lambda" and a["MetricName"] == "Errors"
                   and a["Dimensions"] == [{"Name": "FunctionName", "Value": {"Ref": logical_id}}]
                   and a["AlarmActions"] for a in alarms), f"{job.name}: no Errors alarm"
        assert any(a["MetricName"] == "DrainFailures" and a["AlarmActions"]
                   and {"Name": "job", "Value": job.name} in a["Dimensions"]
                   for a in alarms), f"{job.name}: no DrainFailures alarm"
        missed = [a for a in alarms if a["MetricName"] == "Invocations"
                  and a["Dimensions"] == [{"Name": "FunctionName", "Value": {"Ref": logical_id}}]]
        assert len(missed) == 1 and missed[0]["TreatMissingData"] == "breaching" \
            and missed[0]["ComparisonOperator"] == "LessThanThreshold" \
            and missed[0]["AlarmActions"], f"{job.name}: not one missed-run alarm"


def test_iam_least_privilege(packaged: Packaged) -> None:
    functions = packaged.functions()
    queues = packaged.of_type("AWS::SQS::Queue")
    mappings = packaged.of_type("AWS::Lambda::EventSourceMapping").values()
    for logical_id, fn in functions.items():
        role_id = getatt(fn["Properties"]["Role"])
        assert role_id in packaged.of_type("AWS::IAM::Role"), f"{logical_id}: role {role_id}"
        found = statements(packaged, role_id)
        for statement in found:
            for resource in resources_of(statement):
                assert resource != "*", f"{logical_id}: wildcard resource in {statement}"
                if any(str(a).startswith("sqs:") for a in statement["Action"]):
                    # queues exist in the template: name them, never by pattern
                    assert getatt(resource) in queues, f"{logical_id}: {resource}"
        sqs_targets = {getatt(r) for s in found if any(str(a).startswith("sqs:") for a in s["Action"])
                       for r in resources_of(s)}
        consumed = {getatt(m["Properties"]["EventSourceArn"]) for m in mappings
                    if getatt(m["Properties"]["FunctionName"]) == logical_id}
        if consumed:
            own = consumed | {getatt(queues[q]["Properties"]["RedrivePolicy"]["deadLetterTargetArn"])
                              for q in consumed}
            assert sqs_targets == own, f"{logical_id} may touch {sqs_targets}, needs {own}"
        if "SLUICE_JOB" in fn["Properties"].get("Environment", {}).get("Variables", {}):
            assert sqs_targets <= set(queues), logical_id


def test_no_secret_in_template(packaged: Packaged) -> None:
    for logical_id, fn in packaged.functions().items():
        variables = fn["Properties"].get("Environment", {}).get("Variables", {})
        leaked = set(variables) & set(SECRET_NAMES)
        assert not leaked, f"{logical_id} carries {leaked} in its template environment"
        assert variables["SLUICE_SECRETS_PATH"] == "/sluice/test/"


def test_each_package_holds_what_its_function_needs(packaged: Packaged) -> None:
    for logical_id, fn in packaged.functions().items():
        names = packaged.zip_names(logical_id)
        module, _, _ = fn["Properties"]["Handler"].rpartition(".")
        assert f"{module}.py" in names, f"{logical_id}: handler module missing"
        assert "sluice/core/settings.py" in names
        assert "sluice/core/aws-roots.pem" in names, f"{logical_id}: the secret load's roots"
        # the one import name at the zip's root (shared/ is only the source root), migrations
        # as the package's data
        assert not any(n.startswith("shared/") for n in names), logical_id
        assert "sluice/store/migrations/0001_foundation.postgres.sql" in names, logical_id
        # manylinux wheels built for CPython 3.12, and no boto3 (the runtime has it)
        assert any(n.startswith("psycopg_binary/") and "cpython-312-x86_64-linux-gnu" in n
                   for n in names), logical_id
        assert not any(n.startswith(("boto3/", "botocore/")) for n in names), logical_id
        http = module == "functions/http"
        for prefix in HTTP_STACK:
            assert any(n.startswith(prefix) for n in names) == http, f"{logical_id}: {prefix}"
        assert ("sluice/http/app.py" in names) == http, logical_id
        assert not any(n.startswith(("opentelemetry/sdk/", "opentelemetry/exporter/"))
                       for n in names), logical_id


def test_the_http_function_may_invoke_exactly_the_job_functions(packaged: Packaged) -> None:
    """The console's "run now" invokes ``<prefix><function key>``: the prefix on the HTTP
    function names every job function, and its role may invoke those and nothing else."""
    functions = packaged.functions()
    http = next(fn["Properties"] for fn in functions.values()
                if fn["Properties"]["Handler"] == "functions/http.handler")
    prefix = http["Environment"]["Variables"]["SLUICE_JOB_FUNCTION_PREFIX"]
    job_functions = {fn["Properties"]["FunctionName"] for fn in functions.values()
                     if "SLUICE_JOB" in fn["Properties"].get("Environment", {}).get(
                         "Variables", {})}
    assert job_functions == {prefix + job.function_key for job in JOBS.values()}
    invokable = {str(resource.get("Fn::Sub", resource) if isinstance(resource, dict)
                     else resource).rsplit(":function:", 1)[-1]
                 for statement in statements(packaged, getatt(http["Role"]))
                 if "lambda:InvokeFunction" in statement["Action"]
                 for resource in resources_of(statement)}
    assert invokable == job_functions
