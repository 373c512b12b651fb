"""The receivers of docs/delivery.md (docs/examples/webhook_receiver.{py,js}), run on a
request Sluice's webhook adapter really sent: each accepts it, deduplicates on its id, and
refuses it tampered or signed with another secret."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from typing import Any

import pytest

from sluice.core.settings import Settings
from sluice.delivery.channels import Outbound, build_adapters
from sluice.delivery.store import DeliveryStore
from sluice.store.db import open_database
from tests.conftest import BASE_ENV, ROOT
from tests.providers.http import ProviderServer, json_response

EXAMPLES = ROOT / "docs" / "examples"
SECRET = "whsec_" + base64.b64encode(b"receiver-example-key-32-bytes!!!").decode()
OTHER = "whsec_" + base64.b64encode(b"some-other-key-of-32-bytes-long!").decode()


def sent_request(sqlite_url: str, entry_payload: dict[str, Any]) -> dict[str, Any]:
    """What Sluice's adapter put on the wire, captured by a local server."""
    captured: list[dict[str, Any]] = []

    def handle(method: str, path: str, headers: dict[str, str],
               body: bytes) -> tuple[int, dict[str, str], bytes]:
        captured.append({"headers": headers, "body": body.decode()})
        return json_response(200, {"id": "evt_1"})

    settings = Settings.from_env({**BASE_ENV, "SLUICE_DATABASE_URL": sqlite_url,
                                  "SLUICE_WEBHOOK_SIGNING_SECRET": SECRET,
                                  "SLUICE_WEBHOOK_ALLOW_HOSTS": "127.0.0.1"})
    db = open_database(settings.database_url)
    with ProviderServer(handle) as server, Outbound.open(settings) as client:
        entry, _ = DeliveryStore(db).enqueue("webhook", server.url + "/hook", entry_payload)
        build_adapters(settings, client)["webhook"].send(entry)
    db.close()
    [request] = captured
    return request


def run_example(name: str, request: dict[str, Any], secret: str) -> dict[str, Any]:
    command = ([sys.executable, str(EXAMPLES / name)] if name.endswith(".py")
               else ["node", str(EXAMPLES / name)])
    done = subprocess.run(command, input=json.dumps(request), capture_output=True, text=True,
                          env={"WEBHOOK_SECRET": secret, "PATH": "/usr/bin:/bin"},
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


@pytest.mark.parametrize("example", ["webhook_receiver.py", "webhook_receiver.js"])
def test_each_documented_receiver_verifies_what_sluice_sends(example: str,
                                                             sqlite_url: str) -> None:
    request = sent_request(sqlite_url, {"alert": "cpu", "text": "hot"})
    assert run_example(example, request, SECRET)["ok"] is True
    tampered = {**request, "body": request["body"].replace("hot", "HOT")}
    assert run_example(example, tampered, SECRET) == {"ok": False, "status": 401}
    assert run_example(example, request, OTHER) == {"ok": False, "status": 401}
