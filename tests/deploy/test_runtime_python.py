"""The deployment check: every packaged function starts and answers as Lambda runs it.

For Sluice's own deployment and the example app's (both packaged by osls, tests/deploy/
conftest.py), each function's zip is unpacked into a clean folder and started under AWS's
runtime interface client on CPython 3.12 with only the runtime's own packages beside it
(tests/deploy/lambda_check.py), against a local Runtime API. Its secrets are where the
template says (SSM under ``SLUICE_SECRETS_PATH``, on moto over HTTP), its database a real
Postgres, its queues moto's, created from the template. One event each, from tests/events:
the scheduled event for a job's function, the HTTP API request (a cron ``GET`` through
Mangum) for the HTTP function, and for a consumer an SQS batch of one message Sluice
itself published to the function's queue and Lambda's poller would hand over. An init
error, an invocation error or no answer fails the check naming the function.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple
from unittest.mock import patch

import boto3
import psycopg
import pytest

from sluice.core.extensions import load
from sluice.core.settings import Settings
from sluice.queues import topics
from sluice.queues.keys import idempotency_key
from sluice.queues.publish import Publisher
from sluice.queues.topics import TOPICS, queue_name
from tests.conftest import CRON_SECRET, JWT_SECRET, PG_ADMIN_URL, RUN_ID, load_event
from tests.deploy.conftest import APP, Packaged
from tests.deploy.lambda_check import (
    Function,
    Started,
    functions,
    invoke,
    runtime_python,
    runtime_site,
)
from tests.sqs_helpers import REGION, to_record

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800), pytest.mark.postgres,
              pytest.mark.aws]

SIGNING_SECRET = "deploy-check-signing-secret-0123456789"
# what a consumer's message carries, by topic: an app's topic its own fields (an rss.* topic
# its reference fields, a batchId given and the rest filled by the publisher)
TOPIC_FIELDS: dict[str, dict[str, Any]] = {
    "exampleapp.signup": {"userId": "u1", "name": "Ada", "pager": "team-a"},
}


class World(NamedTuple):
    """What the runtime finds around a function: its Python, the runtime's packages, and
    the AWS and Postgres the deployed functions reach."""

    python: str
    site: Path
    aws: str  # the moto endpoint
    database_url: str

    def env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_SESSION_TOKEN": "testing", "AWS_REGION": REGION,
                "AWS_DEFAULT_REGION": REGION, "AWS_ENDPOINT_URL": self.aws}

    def client(self, service: str) -> Any:
        return boto3.client(service, endpoint_url=self.aws, region_name=REGION,
                            aws_access_key_id="testing", aws_secret_access_key="testing")


@pytest.fixture(scope="module")
def world(moto_endpoint: str, pg_template: str,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    name = f"sluice_deploy_{RUN_ID}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
    database_url = PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    yield World(runtime_python(), runtime_site(tmp_path_factory.mktemp("var-runtime")),
                moto_endpoint, database_url)
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _provision(packaged: Packaged, world: World) -> None:
    """The stage's secrets in SSM where the template's functions read them, and its queues."""
    paths = {fn.environment.get("SLUICE_SECRETS_PATH") for fn in functions(packaged)}
    ssm = world.client("ssm")
    for path in filter(None, paths):
        for key, value in {"CRON_SECRET": CRON_SECRET, "SLUICE_ADMIN_JWT_SECRET": JWT_SECRET,
                           "SLUICE_QUEUE_SIGNING_SECRET": SIGNING_SECRET,
                           "SLUICE_DATABASE_URL": world.database_url}.items():
            ssm.put_parameter(Name=path + key, Value=value, Type="SecureString", Overwrite=True)
    sqs = world.client("sqs")
    for resource in packaged.of_type("AWS::SQS::Queue").values():
        sqs.create_queue(QueueName=resource["Properties"]["QueueName"])


def _reserved(topic: str) -> bool:
    return topic in TOPICS and TOPICS[topic].reserved


@contextmanager
def _topics_with(topic: str) -> Iterator[None]:
    """This process's topic table, or, for the example app's topic, the app's (its PACKS
    and TOPICS), as the app's functions have it: the publisher builds the topic's own
    message and key from it."""
    if topic in TOPICS:
        yield
        return
    sys.path.insert(0, str(APP))
    try:
        with patch.object(topics, "TOPICS", TOPICS.using(load(["exampleapp.sluice_ext"],
                                                                group=None))):
            yield
    finally:
        sys.path.remove(str(APP))


def _sqs_batch(fn: Function, world: World) -> dict[str, Any]:
    """One message on ``fn``'s topic, built and signed by Sluice's publisher, sent to the
    function's queue as a producer sends it, and received as Lambda's poller receives it."""
    topic = fn.environment["SLUICE_TOPIC"]
    settings = Settings.from_env({"SLUICE_QUEUE_SIGNING_SECRET": SIGNING_SECRET,
                                  "SLUICE_DATABASE_URL": "sqlite:///:memory:"})
    with _topics_with(topic):
        message = Publisher(settings).build(
            topic, TOPIC_FIELDS.get(topic) or {"batchId": str(uuid.uuid4())})
        key = idempotency_key(message)
    sqs = world.client("sqs")
    url = sqs.get_queue_url(QueueName=queue_name(fn.environment["SLUICE_QUEUE_PREFIX"],
                                                 topic))["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody=json.dumps(message), MessageAttributes={
        "idempotencyKey": {"DataType": "String", "StringValue": key}})
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, WaitTimeSeconds=5,
                              MessageSystemAttributeNames=["All"], MessageAttributeNames=["All"])
    [received] = got["Messages"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"]
    # the sample's shape, this message's fields
    record = {**load_event("sqs_rss_ingest")["Records"][0], **to_record(received, arn)}
    return {"Records": [record]}


def _event(fn: Function, world: World) -> dict[str, Any]:
    if fn.kind == "cron":
        return load_event("scheduled_event")
    if fn.kind == "http":
        return load_event("http_get_cron")
    return _sqs_batch(fn, world)


def _answered(started: Started) -> str | None:
    """Why ``started`` did not answer as its function should, naming it; None if it did.
    A reserved topic's consumer fails its message loud: with every record of the batch
    failed, the invocation fails (Powertools' ``BatchProcessingError``), as designed."""
    fn, outcome = started.function, started.outcome
    if fn.kind == "consumers" and _reserved(fn.environment["SLUICE_TOPIC"]) \
            and outcome is not None and outcome.kind == "error":
        message = str(outcome.body.get("errorMessage"))
        return None if "consumer is not implemented" in message else started.failure()
    failure = started.failure()
    if failure is not None or outcome is None:
        return failure
    body = outcome.body
    if fn.kind in ("cron", "http") and body.get("statusCode") != 200:
        return f"{fn.name}: answered {json.dumps(body)[:500]}"
    if fn.kind == "consumers":
        failed = body.get("batchItemFailures")
        if failed != [] or _reserved(fn.environment["SLUICE_TOPIC"]):
            return f"{fn.name}: batchItemFailures {failed}"
    return None


def check(packaged: Packaged, world: World, scratch: Path,
          without: tuple[str, ...] = ()) -> list[str]:
    """Each function started and invoked once; the failures, each naming its function.
    ``without``: variables taken out of every function's environment."""
    _provision(packaged, world)
    failures = []
    for fn in functions(packaged):
        fn = fn._replace(environment={k: v for k, v in fn.environment.items()
                                      if k not in without})
        started = invoke(fn, _event(fn, world), python=world.python, site=world.site,
                         env=world.env(), scratch=scratch / fn.name)
        failure = _answered(started)
        if failure is not None:
            failures.append(failure)
    return failures


def test_packaging_compiled_bytecode_for_the_runtime(packaged: Packaged) -> None:
    runtime_python()
    assert "with cpython-312 bytecode" in packaged.log
    for logical_id, fn in packaged.functions().items():
        module = fn["Properties"]["Handler"].rpartition(".")[0]
        folder, _, name = module.rpartition("/")
        assert f"{folder}/__pycache__/{name}.cpython-312.pyc" in packaged.zip_names(logical_id)


def test_every_function_of_sluices_deployment_starts_and_answers(
        packaged: Packaged, world: World, tmp_path: Path) -> None:
    assert check(packaged, world, tmp_path) == []


def test_every_function_of_the_example_apps_deployment_starts_and_answers(
        packaged_app: Packaged, world: World, tmp_path: Path) -> None:
    names = {fn.name for fn in functions(packaged_app)}
    assert {"exampleapp-test-exampleappDigest", "exampleapp-test-exampleappSignup"} <= names
    assert check(packaged_app, world, tmp_path) == []


def test_without_sluice_app_the_apps_functions_fail_the_check_by_name(
        packaged_app: Packaged, world: World, tmp_path: Path) -> None:
    # SLUICE_APP is how a function finds the app: its zip has no entry points
    failures = check(packaged_app, world, tmp_path, without=("SLUICE_APP",))
    failed = {failure.split(":", 1)[0] for failure in failures}
    assert {"exampleapp-test-exampleappDigest", "exampleapp-test-exampleappSignup"} <= failed
    digest = next(f for f in failures if f.startswith("exampleapp-test-exampleappDigest:"))
    assert "init failed: UnknownJob" in digest and "exampleapp-digest" in digest


def test_the_functions_ship_only_what_runs_on_lambda(packaged: Packaged,
                                                     packaged_app: Packaged) -> None:
    for deployment in (packaged, packaged_app):
        for fn in functions(deployment):
            key = next(k for k, v in deployment.functions().items()
                       if v["Properties"]["FunctionName"] == fn.name)
            names = deployment.zip_names(key)
            tops = {name.split("/")[0] for name in names}
            assert not any(n.startswith(("sluice/deploy/", "croniter/tests/")) or n.endswith(
                ".pyi") for n in names), fn.name
            assert not tops & {"uvicorn", "click", "yaml", "_yaml", "pip", "setuptools"}, fn.name
            assert not any(t.startswith("sluice") and t.endswith(".egg-info") for t in tops)
            web = {"fastapi", "starlette", "pydantic", "jinja2", "mangum"} & tops
            assert web == (set() if fn.kind != "http" else web | {"fastapi", "jinja2"}), fn.name
            assert ("cryptography" in tops) == (fn.kind != "consumers"), fn.name


def test_generate_check_starts_each_function_as_its_zip_will(
        app_deployment: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    app, env = app_deployment
    folder = tmp_path / "app"
    shutil.copytree(app, folder, symlinks=True, ignore=shutil.ignore_patterns(".serverless"))

    def generate_check() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "sluice.cli.main", "generate", "--check",
                               "--json"], cwd=folder, env=env, capture_output=True, text=True,
                              timeout=300, check=False)

    done = generate_check()
    assert done.returncode == 0, done.stdout + done.stderr
    started = {s["function"]: s["error"] for s in json.loads(done.stdout)["coldStarts"]}
    assert {"http", "exampleappDigest", "exampleappSignup"} <= set(started)
    assert set(started.values()) == {None}
    serverless = folder / "serverless.yml"
    serverless.write_text(serverless.read_text().replace(
        'SLUICE_APP: "exampleapp.sluice_ext"', 'SLUICE_APP: ""'))
    done = generate_check()
    assert done.returncode == 2, done.stdout + done.stderr
    failed = {s["function"]: s["error"] for s in json.loads(done.stdout)["coldStarts"]
              if s["error"] is not None}
    assert failed.keys() == {"exampleappDigest", "exampleappSignup"}, failed
    assert failed["exampleappDigest"].startswith("UnknownJob")
    assert failed["exampleappSignup"].startswith("UnknownTopic")
