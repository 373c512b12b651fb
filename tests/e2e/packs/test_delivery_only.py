"""The example app deployed with the delivery pack alone (``PACKS = ["delivery"]`` in
docs/examples/exampleapp/exampleapp/sluice_ext.py), through what a user runs: ``sluice
generate``'s files, the command line, ``sluice dev``'s console and API, and the app API.

Oracles: the generated YAML's functions and resources, each command's exit code and JSON,
the console page's navigation and cards, and the routes' statuses. Each test also runs the
same surface without an app (every pack on), so it shows what the delivery-only
deployment leaves out rather than what never existed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import BASE_ENV, ROOT, admin_token, run_cli, start_dev

APP = ROOT / "docs" / "examples" / "exampleapp"
APP_ENV = {"SLUICE_APP": "exampleapp.sluice_ext", "PYTHONPATH": str(APP)}
OTHER_PACKS = re.compile(r"rss|metering|ledger|erasure|history|alert", re.IGNORECASE)
pytestmark = pytest.mark.timeout(300)


class Loader(yaml.SafeLoader):
    pass


Loader.add_multi_constructor("!", lambda loader, suffix, node: f"!{suffix}")


def _yaml(path: Path) -> Any:
    return yaml.load(path.read_text(), Loader=Loader)


def _generate(folder: Path, env: dict[str, str]) -> dict[str, Any]:
    folder.mkdir()
    done = run_cli(["generate", "--dir", str(folder), "--service", "exampleapp", "--json"], env)
    assert done.returncode == 0, done.stderr
    return {"functions": set(_yaml(folder / "serverless.yml")["functions"]),
            **{name: set(_yaml(folder / "infra" / f"{name}.yml")["Resources"])
               for name in ("queues", "alarms", "iam")}}


def test_the_delivery_only_deployment_has_no_other_packs_functions_or_queues(
        tmp_path: Path) -> None:
    app = _generate(tmp_path / "app", {**BASE_ENV, **APP_ENV})
    assert app["functions"] == {"http", "stateCleanup", "deliveryDrain", "exampleappDigest",
                                "exampleappSignup"}
    assert app["queues"] == {"ExampleappSignupQueue", "ExampleappSignupDlq"}
    for kind in ("functions", "queues", "alarms", "iam"):
        assert not {name for name in app[kind] if OTHER_PACKS.search(name)}, kind
    # the delivery pack's own alarms go with its drain
    assert {"DeliveryDestinationsDownAlarm", "DeliveryDrainMissedRunAlarm",
            "ExampleappSignupDlqDepthAlarm"} <= app["alarms"]
    # Sluice's own deployment, every pack on: the same generator writes the rest
    own = _generate(tmp_path / "own", dict(BASE_ENV))
    assert {"rssRefresh", "rssIngest", "meteringFlush", "ledgerRedrive", "erasurePurge",
            "historySample", "deliveryDrain"} <= own["functions"]
    assert {"RssIngestQueue", "RssIngestDlq"} <= own["queues"]


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_cli(args, env)


def _json(args: list[str], env: dict[str, str]) -> Any:
    done = _cli([*args, "--json"], env)
    assert done.returncode == 0, (args, done.stderr)
    return json.loads(done.stdout)


def test_the_command_line_shows_only_the_delivery_pack(tmp_path: Path) -> None:
    env = {**BASE_ENV, **APP_ENV, "SLUICE_DATABASE_URL": f"sqlite:///{tmp_path}/app.db"}
    assert _cli(["migrate"], env).returncode == 0
    packs = _json(["packs"], env)
    assert packs["declaredIn"] == "SLUICE_APP (exampleapp.sluice_ext)"
    assert [p["pack"] for p in packs["packs"] if p["on"]] == ["delivery"]
    assert [job["job"] for job in _json(["jobs"], env)] == [
        "state-cleanup", "delivery-drain", "exampleapp-digest"]
    queues = _json(["queues"], env)
    assert set(queues) == {"generatedAt", "topics", "quarantine", "delivery", "jobs"}
    assert [row["topic"] for row in queues["topics"]] == ["exampleapp.signup"]
    assert [row["queue"] for row in _json(["dlq", "list"], env)["queues"]] == [
        "exampleapp.signup", "quarantine", "delivery"]
    usage = _cli(["--help"], env).stdout
    for command in ("rss", "flags", "erasure", "billing", "alerts"):
        assert not re.search(rf"^\s+{command}\s", usage, re.MULTILINE), command
        refused = _cli([command, "list"], env)
        assert refused.returncode == 64 and "invalid choice" in refused.stderr, command
    assert re.search(r"^\s+delivery\s", usage, re.MULTILINE)
    # without the app, every pack's commands are there
    everything = {**BASE_ENV, "SLUICE_DATABASE_URL": env["SLUICE_DATABASE_URL"]}
    assert re.search(r"^\s+rss\s", _cli(["--help"], everything).stdout, re.MULTILINE)
    assert "rssFanOut" in _json(["queues"], everything)


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SLUICE_", "CRON_"))}
    return subprocess.run([sys.executable, "-c", code], env={**full, **env}, text=True,
                          capture_output=True, timeout=120, check=False)


def test_the_app_api_refuses_what_a_pack_that_is_off_would_do(tmp_path: Path) -> None:
    env = {**BASE_ENV, **APP_ENV, "SLUICE_DATABASE_URL": f"sqlite:///{tmp_path}/app.db"}
    assert _cli(["migrate"], env).returncode == 0
    call = ("import sluice\ns = sluice.connect()\n"
            "e = sluice.enqueue_delivery(s, 'exampleapp-pager', 'team', {'text': 'hi'})\n"
            "print(e.status.value)\n"
            "try:\n    sluice.request_erasure(s, 'u-1', requested_by='ops')\n"
            "except sluice.ConfigurationError as exc:\n    print(exc.code, exc.message)\n")
    done = _python(call, env)
    assert done.returncode == 0, done.stderr
    enqueued, refused = done.stdout.splitlines()
    assert enqueued == "pending"
    assert refused == ("pack_off sluice.request_erasure needs the erasure pack, which this "
                       "deployment leaves out (PACKS in SLUICE_APP (exampleapp.sluice_ext))")


@pytest.fixture
def dev_server(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``sluice dev`` for the example app, delivery pack alone."""
    base, proc = start_dev({**BASE_ENV, **APP_ENV,
                            "SLUICE_DATABASE_URL": f"sqlite:///{tmp_path}/dev.db"},
                           tmp_path, "--no-scheduler")
    try:
        yield base, proc
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_the_console_shows_only_the_delivery_pack(
        dev_server: tuple[str, subprocess.Popen[str]]) -> None:
    base, _ = dev_server
    cookies = {"__session": admin_token(["super_admin"])}
    page = httpx.get(f"{base}/admin/queues", cookies=cookies, timeout=30)
    assert page.status_code == 200, page.text
    nav = page.text[page.text.index("<nav"):page.text.index("</nav>")]
    assert re.findall(r'href="(/admin/[a-z]+)"', nav) == [
        "/admin/queues", "/admin/dlq", "/admin/jobs", "/admin/deliveries", "/admin/audit"]
    assert re.findall(r'data-card="([^"]+)"', page.text) == [
        "exampleapp.signup", "exampleapp.signup-dlq", "quarantine", "delivery"]
    assert "depth over 24 h" not in page.text  # no history pack, no depth sampled to draw
    overview = httpx.get(f"{base}/api/admin/console/overview", cookies=cookies, timeout=30)
    assert [card["key"] for card in overview.json()["cards"]] == [
        "exampleapp.signup", "exampleapp.signup-dlq", "quarantine", "delivery"]
    # the routes of the packs that are off are not served; the delivery pack's are
    bearer = {"authorization": f"Bearer {admin_token(['super_admin'])}"}
    for path in ("/admin/erasure", "/admin/history", "/admin/flags", "/api/admin/rss/sources",
                 "/api/admin/flags", "/api/admin/erasure/requests", "/api/admin/alerts/rules/s1",
                 "/api/admin/console/history", "/api/admin/dlq/ledger"):
        assert httpx.get(f"{base}{path}", headers=bearer, timeout=30).status_code == 404, path
    for path in ("/api/queue/status", "/api/admin/delivery/stats", "/admin/deliveries"):
        assert httpx.get(f"{base}{path}", headers=bearer, timeout=30).status_code == 200, path
    assert httpx.get(f"{base}/api/health", timeout=30).json()["jobs"] == [
        "delivery-drain", "exampleapp-digest", "state-cleanup"]
