"""The command line as a scripting tool, walked over every command its parser has: ``--json``
prints one JSON document on stdout and nothing on stderr, reads take no ``--by``, and every
exit code is one the table in docs/cli.md defines."""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from sluice.cli.main import EXIT_CONFIG, EXIT_USAGE, build_parser, leaf_commands, main
from sluice.delivery.store import DeliveryStore
from sluice.erasure.requests import ErasureStore
from sluice.queues.deadletters import LocalDeadLetters
from sluice.queues.signing import Signer
from sluice.store.db import utcnow
from tests.conftest import BASE_ENV, ROOT

SECRET = "walk-secret-0123456789abcdef"
MESSAGE = {"topic": "rss.ingest", "batchId": "b-walk", "sourceId": "all-sources",
           "feedUrl": "", "publishedAt": "2026-11-29T03:20:00.000Z"}
RULES = {"rules": [{"id": "r1", "match": {"keywords": ["walk"]},
                    "destination": {"channel": "webhook",
                                    "recipient": "https://hooks.example/walk"}}]}
READS = {"list", "show", "stats", "verify", "registry", "stories"}

# One run of every command, in an order where each finds what it needs: (command, argv after
# it, stdin, exit codes it may answer). {name} is filled from the seeds and earlier outputs.
WALK: list[tuple[tuple[str, ...], list[str], str, set[int]]] = [
    (("migrate",), ["--dry-run"], "", {0}),
    (("run",), ["state-cleanup"], "", {0}),
    (("jobs",), [], "", {0}),
    (("schedule", "disable"), ["state-cleanup", "--reason", "maintenance"], "", {0}),
    (("schedule", "enable"), ["state-cleanup"], "", {0}),
    (("queues",), [], "", {0}),
    (("token",), ["--roles", "ops"], "", {0}),
    (("packs",), [], "", {0}),
    (("generate",), ["--check"], "", {0, 2}),
    (("sign",), [], json.dumps(MESSAGE), {0}),
    (("verify",), [], "{signed}", {0}),
    (("publish",), ["rss.ingest"], "{}", {0, 2}),
    (("flags",), [], "", {0}),
    (("dlq", "list"), ["rss.ingest"], "", {0}),
    (("dlq", "show"), ["rss.ingest", "{dead}"], "", {0}),
    (("dlq", "redrive"), ["rss.ingest", "--dry-run"], "", {0, 2}),
    (("dlq", "purge"), ["rss.ingest", "--all"], "", {0}),
    (("delivery", "enqueue"), ["webhook", "https://hooks.example/walk", "--text", "hi"], "",
     {0}),
    (("delivery", "list"), [], "", {0}),
    (("delivery", "show"), ["{delivery}"], "", {0}),
    (("delivery", "why"), ["{sent}"], "", {0}),
    (("delivery", "stats"), [], "", {0}),
    (("delivery", "redrive"), ["--all-failed"], "", {0}),
    (("delivery", "purge"), ["--all-failed"], "", {0}),
    (("delivery", "mark-delivered"), ["{sent}"], "", {0}),
    (("delivery", "send-again"), ["{lost}"], "", {0}),
    (("delivery", "destinations"), [], "", {0}),
    (("delivery", "destination"), ["disable", "slack:C0WALK", "--reason", "walked"], "", {0}),
    (("delivery", "replay"), ["--destination", "webhook:hooks.example:443", "--since",
                              "{since}", "--dry-run"], "", {0}),
    (("billing", "reset-attempts"), ["--dry-run"], "", {0}),
    (("erasure", "request"), ["walk-3", "--grace-days", "5"], "", {0}),
    (("erasure", "list"), [], "", {0}),
    (("erasure", "show"), ["{later}"], "", {0}),
    (("erasure", "cancel"), ["{later}"], "", {0}),
    (("erasure", "confirm"), ["{due}", "--yes"], "", {0, 2}),
    (("erasure", "purge"), ["--dry-run"], "", {0}),
    (("erasure", "verify"), ["nobody"], "", {0}),
    (("erasure", "registry"), [], "", {0}),
    (("rss", "sources", "add"), ["https://feeds.example/walk.xml"], "", {0}),
    (("rss", "sources", "list"), [], "", {0}),
    (("rss", "sources", "show"), ["{source}"], "", {0}),
    (("rss", "scopes", "set"), ["walk-scope", "--tenant", "t", "--source", "{source}",
                                "--locale", "en"], "", {0}),
    (("rss", "scopes", "list"), [], "", {0}),
    (("rss", "scopes", "show"), ["walk-scope"], "", {0}),
    (("rss", "stories"), ["walk-scope"], "", {0}),
    (("alerts", "rules"), ["walk-scope", "--set", "-"], json.dumps(RULES), {0}),
    (("rss", "scopes", "remove"), ["walk-scope"], "", {0}),
    (("rss", "sources", "remove"), ["{source}"], "", {0}),
    (("rss", "refresh"), [], "", {0, 2}),
    (("audit",), ["--limit", "5"], "", {0}),
]
# What an output gives later commands.
CAPTURE: dict[tuple[str, ...], Callable[[Any], dict[str, str]]] = {
    ("sign",): lambda out: {"signed": json.dumps(out)},
    ("delivery", "enqueue"): lambda out: {"delivery": out["id"]},
    ("rss", "sources", "add"): lambda out: {"source": out["id"]},
}


def documented_exit_codes() -> set[int]:
    text = (ROOT / "docs" / "cli.md").read_text()
    table = text[text.index("Exit codes, for every command"):]
    return {int(code) for code in re.findall(r"^\| (\d+) \|", table, re.MULTILINE)}


@pytest.fixture
def walk_env(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    for key in [k for k in os.environ if k.startswith(("SLUICE_", "CRON_"))]:
        monkeypatch.delenv(key)
    env = {**BASE_ENV, "SLUICE_DATABASE_URL": sqlite_url, "SLUICE_QUEUE_SIGNING_SECRET": SECRET}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


def _seed(make_services: Any, url: str) -> dict[str, str]:
    services = make_services(url, SLUICE_QUEUE_SIGNING_SECRET=SECRET)
    erasures = ErasureStore(services.db)
    later, _ = erasures.create("walk-1", requested_by="test", grace_days=30)
    due, _ = erasures.create("walk-2", requested_by="test", grace_days=0)
    dead = LocalDeadLetters(services.db).add("rss.ingest", {
        "originalMessageId": "m-walk", "originalTopic": "rss.ingest", "deliveryCount": 5,
        "failedAt": (utcnow() - timedelta(minutes=5)).isoformat(),
        "errorMessage": "feed fetch failed", "originalMessage": Signer([SECRET]).sign(MESSAGE)})
    unknown = {}
    for name in ("sent", "lost"):  # two entries resting unknown, for the operator's two verbs
        entry, _ = DeliveryStore(services.db).enqueue("telegram", "1001", {"text": name})
        with services.db.transaction() as tx:
            tx.execute("UPDATE delivery_queue SET status = 'unknown', unknown_sends = 1 "
                       "WHERE id = :id", {"id": entry.id})
        unknown[name] = entry.id
    since = (utcnow() - timedelta(hours=1)).isoformat().replace("+00:00", "Z")
    return {"later": later.id, "due": due.id, "dead": dead, "since": since, **unknown}


def _run(argv: list[str], stdin: str, monkeypatch: pytest.MonkeyPatch,
         capfd: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code = main(argv)
    out, err = capfd.readouterr()
    return code, out, err


def test_every_data_command_prints_json_alone(walk_env: dict[str, str], make_services: Any,
                                              monkeypatch: pytest.MonkeyPatch,
                                              capfd: pytest.CaptureFixture[str]) -> None:
    leaves = leaf_commands(build_parser())
    assert {path for path, *_ in WALK} == set(leaves) - {("dev",)}, \
        "every command the parser has is walked (give a new one a row in WALK)"
    codes = documented_exit_codes()
    assert codes == {0, 1, 2, 64, 78}
    values = _seed(make_services, walk_env["SLUICE_DATABASE_URL"])
    capfd.readouterr()
    for path, rest, stdin, allowed in WALK:
        argv = [*path, *(arg.format(**values) for arg in rest), "--json"]
        code, out, err = _run(argv, stdin.replace("{signed}", values.get("signed", "")),
                              monkeypatch, capfd)
        assert code in allowed and code in codes, (argv, code, err)
        assert err == "", (argv, err)
        document = json.loads(out)  # exactly one JSON document
        assert out.count("\n") == 1, (argv, out)
        if path in CAPTURE:
            values.update(CAPTURE[path](document))


def test_human_mode_names_the_database_and_reads_take_no_by(
        walk_env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(["delivery", "stats"], "", monkeypatch, capfd)
    path = walk_env["SLUICE_DATABASE_URL"].removeprefix("sqlite:///")
    assert code == 0 and err == f"database: sqlite {path}\n"
    with pytest.raises(json.JSONDecodeError):
        json.loads(out)
    for command, leaf in leaf_commands(build_parser()).items():
        options = {o for action in leaf._actions for o in action.option_strings}
        if command[-1] in READS:
            assert "--by" not in options, command
        if command != ("dev",):
            assert "--json" in options, command


def test_one_exit_code_per_meaning(walk_env: dict[str, str], tmp_path: Any,
                                   monkeypatch: pytest.MonkeyPatch,
                                   capfd: pytest.CaptureFixture[str]) -> None:
    # An unknown identifier is a usage error whichever command names it.
    for argv in (["erasure", "show", "nope"], ["delivery", "show", "nope"],
                 ["dlq", "show", "rss.ingest", "nope"], ["dlq", "list", "nope"],
                 ["rss", "sources", "show", "nope"], ["rss", "scopes", "show", "nope"],
                 ["rss", "stories", "nope"], ["alerts", "rules", "nope"], ["run", "nope"],
                 ["flags", "nope"], ["publish", "nope"],
                 ["alerts", "rules", "nope", "--set", "-"]):  # stdin {}: no rules list
        code, out, err = _run([*argv, "--json"], "{}", monkeypatch, capfd)
        assert code == EXIT_USAGE and err.startswith("sluice: "), (argv, err)
        assert json.loads(out)["error"]["message"] in err, (argv, out)
    # No database where SLUICE_DATABASE_URL points: configuration, and nothing created.
    missing = tmp_path / "elsewhere" / "sluice.db"
    monkeypatch.setenv("SLUICE_DATABASE_URL", f"sqlite:///{missing}")
    code, out, err = _run(["jobs", "--json"], "", monkeypatch, capfd)
    assert code == EXIT_CONFIG and str(missing) in err and not missing.parent.exists()
    assert json.loads(out)["error"]["code"] == "configuration_error"
