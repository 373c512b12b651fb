"""Deploy the packaged stack into moto's CloudFormation over HTTP, the way osls deploys.

First the create-stack template (the deployment bucket), then the artifacts uploaded
under their S3 keys, then the full template as a stack update. The stack goes to its
own region of the shared moto server, so other tests' queues never collide with it.
"""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest

from sluice.jobs.registry import JOBS
from tests.deploy.conftest import PREFIX, STAGE, Packaged
from tests.deploy.test_template import topics

pytestmark = [pytest.mark.aws, pytest.mark.slow, pytest.mark.timeout(900)]

REGION = "eu-west-3"
STACK = f"sluice-{STAGE}"


# moto's CloudFormation has no model of Lambda Function URLs (the job functions' cron GET,
# checked in test_template.py): their resources, and the outputs reading their URL, are left
# out of what moto deploys.
UNMODELLED = {"AWS::Lambda::Url"}


def modelled(template: dict[str, Any]) -> dict[str, Any]:
    left_out = {name for name, r in template["Resources"].items() if r["Type"] in UNMODELLED}
    assert left_out, "the job functions' URLs are in the template"
    resources = {k: v for k, v in template["Resources"].items() if k not in left_out}
    outputs = {k: v for k, v in template.get("Outputs", {}).items()
               if not any(name in json.dumps(v) for name in left_out)}
    assert not any(name in json.dumps(resources) for name in left_out), \
        "no modelled resource depends on a Function URL"
    return {**template, "Resources": resources, "Outputs": outputs}


@pytest.fixture(scope="module")
def deployed(packaged: Packaged, moto_endpoint: str) -> dict[str, Any]:
    def client(service: str) -> Any:
        return boto3.client(service, endpoint_url=moto_endpoint, region_name=REGION,
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    cfn = client("cloudformation")
    cfn.create_stack(StackName=STACK, TemplateBody=json.dumps(packaged.create_template),
                     Capabilities=["CAPABILITY_IAM"])
    outputs = {o["OutputKey"]: o["OutputValue"]
               for o in cfn.describe_stacks(StackName=STACK)["Stacks"][0]["Outputs"]}
    bucket = outputs["ServerlessDeploymentBucketName"]
    s3 = client("s3")
    for fn in packaged.functions().values():
        key = fn["Properties"]["Code"]["S3Key"]
        s3.upload_file(str(packaged.out / key.rsplit("/", 1)[1]), bucket, key)
    cfn.update_stack(StackName=STACK, TemplateBody=json.dumps(modelled(packaged.template)),
                     Capabilities=["CAPABILITY_IAM"])
    # No delete_stack afterwards: moto 5.2 fails deleting a stack with exports (KeyError on
    # the export name); the stack lives in its own region of this run's moto server.
    return {"client": client, "stack": cfn.describe_stacks(StackName=STACK)["Stacks"][0]}


def test_stack_deploys(deployed: dict[str, Any]) -> None:
    assert deployed["stack"]["StackStatus"] == "UPDATE_COMPLETE", deployed["stack"]


def test_queues_and_dlqs_exist_with_redrive(deployed: dict[str, Any]) -> None:
    sqs = deployed["client"]("sqs")
    for topic in topics():
        name = PREFIX + topic.replace(".", "-")
        url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
        dlq_url = sqs.get_queue_url(QueueName=name + "-dlq")["QueueUrl"]
        attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url,
                                           AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        assert json.loads(attrs["RedrivePolicy"])["deadLetterTargetArn"] == dlq_arn
        assert int(attrs["VisibilityTimeout"]) >= 300


def test_functions_rules_and_mappings_exist(deployed: dict[str, Any], packaged: Packaged) -> None:
    lam = deployed["client"]("lambda")
    events = deployed["client"]("events")
    names = {fn["Properties"]["FunctionName"] for fn in packaged.functions().values()}
    deployed_fns = {f["FunctionName"]: f for f in lam.list_functions()["Functions"]}
    assert names <= set(deployed_fns)

    schedules = {}
    for rule in events.list_rules()["Rules"]:
        for target in events.list_targets_by_rule(Rule=rule["Name"])["Targets"]:
            schedules[target["Arn"].rsplit(":", 1)[1]] = rule["ScheduleExpression"]
    for job in JOBS.values():
        fn = next(f for f in deployed_fns.values()
                  if f.get("Environment", {}).get("Variables", {}).get("SLUICE_JOB") == job.name)
        assert schedules[fn["FunctionName"]] == job.schedule, job.name

    mappings = lam.list_event_source_mappings()["EventSourceMappings"]
    by_queue = {m["EventSourceArn"].rsplit(":", 1)[1]: m for m in mappings}
    for topic in topics():
        mapping = by_queue[PREFIX + topic.replace(".", "-")]
        assert mapping["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
        assert mapping["FunctionArn"].rsplit(":", 1)[1] in names
