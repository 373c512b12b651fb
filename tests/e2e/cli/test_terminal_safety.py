"""Nothing a peer stored reaches the terminal as a control: every command of the parser is
walked in text mode over a store whose strings carry ESC sequences, C1 controls, line
separators and bidirectional overrides, and nothing it prints to stdout or stderr holds
one (line breaks aside). The oracle is Unicode's own categories, not the code's list."""

from __future__ import annotations

import io
import json
import unicodedata
from typing import Any

import pytest

from sluice.cli.main import build_parser, leaf_commands, main
from sluice.delivery.store import DeliveryStore
from sluice.jobs.runs import RunStore
from sluice.queues.signing import Signer
from sluice.rss.store import RssStore
from tests.e2e.cli import test_scripting
from tests.e2e.cli.test_scripting import MESSAGE, SECRET, WALK, _seed

walk_env = test_scripting.walk_env  # the same environment as the JSON walk

HOSTILE = ("\x1b[2J\x1b]0;owned\x07red\x1b[31m\u2028second\u2029third\u202eevil\u202c"
           "\u2066iso\u2069\x9b1m\x85\r\tend\u200bzw\ufeff\nforged line")
# Commands walked with a hostile argument of their own (what they print back).
ARGV: dict[tuple[str, ...], list[str]] = {
    ("token",): ["--roles", "ops", "--subject", f"dev{HOSTILE}"],
}


def terminal_controls(text: str) -> list[str]:
    """Characters a terminal acts on: Unicode's control, format and surrogate categories and
    the line/paragraph separators; the newline of a printed line is the one allowed."""
    return [c for c in text if c != "\n" and (unicodedata.category(c) in
                                              ("Cc", "Cf", "Cs", "Zl", "Zp"))]


def _hostile_store(make_services: Any, url: str) -> dict[str, str]:
    values = _seed(make_services, url)
    services = make_services(url, SLUICE_QUEUE_SIGNING_SECRET=SECRET)
    runs = RunStore(services.db)
    runs.audit(actor=f"sub{HOSTILE}", action=f"flags:set{HOSTILE}", target=HOSTILE,
               outcome="200", ip=None, detail={"why": HOSTILE})
    entry, _ = DeliveryStore(services.db).enqueue("webhook", "https://hooks.example/h",
                                                  {"text": HOSTILE})
    source = RssStore(services.db).add_source("https://feeds.example/hostile.xml", HOSTILE)
    with services.db.transaction() as tx:
        tx.execute("UPDATE delivery_queue SET last_error = :e", {"e": HOSTILE})
        tx.execute("UPDATE data_erasure_requests SET last_error = :e", {"e": HOSTILE})
    from sluice.queues.deadletters import LocalDeadLetters

    LocalDeadLetters(services.db).add("rss.ingest", {
        "originalMessageId": f"m{HOSTILE}", "originalTopic": "rss.ingest", "deliveryCount": 5,
        "failedAt": "2026-12-01T00:00:00Z", "errorMessage": HOSTILE,
        "originalMessage": Signer([SECRET]).sign({**MESSAGE, "batchId": "b-hostile"})})
    signed = Signer([SECRET]).sign({**MESSAGE, "feedUrl": HOSTILE})
    return {**values, "delivery": entry.id, "source": source.id, "signed": json.dumps(signed)}


def _run(argv: list[str], stdin: str, monkeypatch: pytest.MonkeyPatch,
         capfd: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code = main(argv)
    out, err = capfd.readouterr()
    return code, out, err


def test_every_command_prints_hostile_strings_escaped(
        walk_env: dict[str, str], make_services: Any, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    assert {path for path, *_ in WALK} == set(leaf_commands(build_parser())) - {("dev",)}
    values = _hostile_store(make_services, walk_env["SLUICE_DATABASE_URL"])
    capfd.readouterr()
    shown = ""
    for path, rest, stdin, allowed in WALK:
        argv = [*path, *(arg.format(**values) for arg in ARGV.get(path, rest))]
        code, out, err = _run(argv, stdin.replace("{signed}", values["signed"]),
                              monkeypatch, capfd)
        assert code in allowed, (argv, code, err)
        assert terminal_controls(out) == [] and terminal_controls(err) == [], (argv, out, err)
        shown += out + err
    # The hostile strings were shown, escaped, not dropped.
    for escaped in ("\\x1b[2J", "\\x1b]0;owned\\x07", "\\u2028", "\\u202e", "\\x9b", "\\x0d",
                    "\\ufeff"):
        assert escaped in shown, escaped


def test_a_token_sub_with_esc_is_escaped_in_sluice_audit_and_kept_in_its_json(
        walk_env: dict[str, str], make_services: Any, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    services = make_services(walk_env["SLUICE_DATABASE_URL"])
    RunStore(services.db).audit(actor=f"evil\x1b[2J{HOSTILE}", action="flags:set",
                                target="rssQueuePipeline", outcome="200", ip=None)
    code, out, err = _run(["audit"], "", monkeypatch, capfd)
    assert code == 0 and terminal_controls(out + err) == []
    assert "evil\\x1b[2J\\x1b[2J" in out and "\n" not in out.split("evil", 1)[1].split(
        "flags:set")[0], "one entry, one line: its line breaks escaped"
    code, out, err = _run(["audit", "--json"], "", monkeypatch, capfd)
    assert code == 0 and terminal_controls(out) == []
    [entry] = json.loads(out)["entries"]
    assert entry["actor"] == f"evil\x1b[2J{HOSTILE}", "JSON means the same, escaped as \\u"


def test_logs_and_argument_errors_are_escaped_too(
        walk_env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    from sluice.cli.output import Mode, speaking
    from sluice.core.observe import logger

    written = io.StringIO()  # where the log handler writes (the stderr it was built with)
    monkeypatch.setattr(logger.logger_handler, "stream", written)
    with speaking(Mode(verbose=1)):
        logger.info(f"a peer's text {HOSTILE}", extra={"field": HOSTILE})
    [line] = written.getvalue().splitlines()
    assert terminal_controls(line) == [] and json.loads(line)["field"] == HOSTILE, line
    assert main(["migrate", f"extra{HOSTILE}"]) == 64
    _, err = capfd.readouterr()
    assert terminal_controls(err) == [] and "unrecognized arguments: extra\\x1b[2J" in err
    assert main(["migrate", f"extra{HOSTILE}", "--json"]) == 64
    out, err = capfd.readouterr()
    assert terminal_controls(out + err) == []
    assert json.loads(out)["error"]["message"] == f"unrecognized arguments: extra{HOSTILE}"
