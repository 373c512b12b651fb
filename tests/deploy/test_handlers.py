"""Every handler path in serverless.yml imports in a fresh interpreter, only the HTTP
function loads the HTTP stack, and none loads OpenTelemetry without an OTLP endpoint
(checked from ``sys.modules`` after the import; the otel extra is installed here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import CRON_SECRET, ROOT

HTTP_STACK = ("fastapi", "starlette", "mangum", "pydantic", "uvicorn")
PROBE = """
import importlib, json, sys
module, attr = sys.argv[1], sys.argv[2]
handler = getattr(importlib.import_module(module), attr)
print(json.dumps({"callable": callable(handler),
                  "loaded": sorted({m.split(".")[0] for m in sys.modules}),
                  "otel": sorted(m for m in sys.modules if m.startswith(
                      ("opentelemetry.sdk", "opentelemetry.exporter")))}))
"""


def _functions() -> dict[str, dict[str, Any]]:
    class Loader(yaml.SafeLoader):
        pass

    def any_tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
        return None  # CloudFormation tags (!GetAtt ...) do not matter here

    Loader.add_multi_constructor("!", any_tag)
    data = yaml.load((ROOT / "serverless.yml").read_text(), Loader=Loader)
    functions: dict[str, dict[str, Any]] = data["functions"]
    return functions


FUNCTIONS = _functions()


def _is_http(fn: dict[str, Any]) -> bool:
    return any("httpApi" in event or "http" in event for event in fn.get("events") or [])


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_handler_imports_and_stays_lean(name: str, tmp_path: Path) -> None:
    fn = FUNCTIONS[name]
    module, _, attr = fn["handler"].rpartition(".")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLUICE_", "CRON_", "AWS_", "POLAR_", "SENTRY_", "OTEL_"))}
    env.update({
        "SLUICE_STAGE": "test",
        "SLUICE_DATABASE_URL": f"sqlite:///{tmp_path}/sluice.db",
        "SLUICE_QUEUE_MODE": "sqs",
        "SLUICE_QUEUE_PREFIX": "sluice-test-",
        "CRON_SECRET": CRON_SECRET,
        "SLUICE_QUEUE_SIGNING_SECRET": "signing-secret-for-tests-0123456789",
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "eu-north-1", "AWS_DEFAULT_REGION": "eu-north-1",
        # init must not call AWS: any call would fail against this closed port
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
        **{k: str(v) for k, v in (fn.get("environment") or {}).items()},
    })

    done = subprocess.run([sys.executable, "-c", PROBE, module.replace("/", "."), attr],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=60,
                          check=False)

    assert done.returncode == 0, f"{name}: {fn['handler']} does not import:\n{done.stderr}"
    probe = json.loads(done.stdout.strip().splitlines()[-1])
    assert probe["callable"], f"{name}: {fn['handler']} is not callable"
    # FastAPI loads OpenTelemetry's API by itself where it is installed; Sluice's own set-up
    # (the SDK, the exporter) is only loaded when on
    assert probe["otel"] == [], f"{name} sets up OpenTelemetry while off"
    if not _is_http(fn):
        assert "opentelemetry" not in probe["loaded"], f"{name} imports OpenTelemetry while off"
    leaked = sorted(set(HTTP_STACK) & set(probe["loaded"]))
    if _is_http(fn):
        assert {"fastapi", "mangum"} <= set(probe["loaded"])
    else:
        assert leaked == [], f"{name} ({fn['handler']}) imports the HTTP stack: {leaked}"
