"""The command line as a person and a script meet it, run as a real process: an error under
``--json`` is a JSON document on stdout with the exit code it has without ``--json``; a
failing in-process handler's traceback stays off stderr unless ``-v``; ``--version`` names
the installed distribution."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli

SECRET = "errors-test-signing-secret-0123456789"


def _popen(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("SLUICE_", "CRON_"))}
    return subprocess.Popen([sys.executable, "-m", "sluice.cli.main", *args], env={**full, **env},
                            cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# (what, argv, env, exit code, error code, field): each kind of error the table in
# docs/cli.md names, as a script meets it.
ERRORS: list[tuple[str, list[str], dict[str, str], int, str, str | None]] = [
    ("an option argparse refuses", ["dlq", "list", "--limit", "many"], {}, 64, "usage",
     "--limit"),
    ("a missing argument", ["run"], {}, 64, "usage", "job"),
    ("an unknown command", ["frobnicate"], {}, 64, "usage", "command"),
    ("an unknown id", ["dlq", "show", "rss.ingest", "nope"], {}, 64, "not_found", None),
    ("a value refused at the door", ["delivery", "enqueue", "webhook", "http://10.0.0.1/hook",
                                     "--text", "hi"], {}, 64, "address_refused", "recipient"),
    ("no database where it points", ["jobs"],
     {"SLUICE_DATABASE_URL": "sqlite:////nonexistent/dir/sluice.db"}, 78,
     "configuration_error", None),
    ("a bad setting", ["jobs"], {"CRON_SECRET": "short"}, 78, "configuration_error", None),
    ("a store that does not answer", ["jobs"],
     {"SLUICE_DATABASE_URL": "postgresql://postgres@127.0.0.1:9/none",
      "SLUICE_DATABASE_CONNECT_TIMEOUT_SECONDS": "1"}, 1, "store_unavailable", None),
]


def test_an_error_under_json_is_a_json_document_with_the_same_exit_code(
        tmp_path: Path) -> None:
    assert run_cli(["migrate"], {}, cwd=tmp_path).returncode == 0
    # both modes of every case at once: the store that does not answer waits out its pool
    runs = {(what, as_json): _popen([*argv, *(["--json"] if as_json else [])], env, tmp_path)
            for what, argv, env, *_ in ERRORS for as_json in (False, True)}
    done = {key: (*proc.communicate(timeout=120), proc.returncode)
            for key, proc in runs.items()}
    for what, _, _, code, error_code, field in ERRORS:
        (plain_out, plain_err, plain_code) = done[(what, False)]
        (json_out, json_err, json_code) = done[(what, True)]
        assert plain_code == json_code == code, (what, plain_code, json_code, json_err)
        assert plain_out == "", (what, plain_out)
        document = json.loads(json_out)  # one JSON document, and nothing else, on stdout
        assert json_out.count("\n") == 1, (what, json_out)
        error = document["error"]
        assert error["code"] == error_code and error["message"], (what, document)
        assert error.get("field") == field, (what, document)
        assert error["message"] in plain_err, "the same error a person reads on stderr"
        assert "Traceback" not in plain_err + json_err, what
        # stderr says the same in both modes (a human-mode command also names its database)
        assert json_err in plain_err, (what, plain_err, json_err)


def test_a_failing_in_process_handlers_traceback_stays_off_stderr(tmp_path: Path) -> None:
    (tmp_path / "boomapp.py").write_text(
        "from sluice.extend import Topic\n"
        "TOPICS = [Topic('boomapp.work', 'boomapp:handler', fields=('n',))]\n"
        "def handler(services):\n"
        "    def handle(message, inbound):\n"
        "        raise RuntimeError('the handler broke')\n"
        "    return handle\n")
    env = {"PYTHONPATH": str(tmp_path), "SLUICE_APP": "boomapp",
           "SLUICE_QUEUE_SIGNING_SECRET": SECRET,
           "SLUICE_DATABASE_URL": f"sqlite:///{tmp_path / 'app.db'}"}
    assert run_cli(["migrate"], env, cwd=tmp_path).returncode == 0
    quiet = run_cli(["publish", "boomapp.work"], env, cwd=tmp_path, stdin='{"n": 1}')
    assert quiet.returncode == 2, quiet.stderr  # not dispatched
    assert "outcome: dead_lettered" in quiet.stdout
    assert "reason: the handler broke" in quiet.stdout
    assert quiet.stderr == f"database: sqlite {tmp_path / 'app.db'}\n", \
        "docs/cli.md: stderr holds only the database at the default verbosity"
    loud = run_cli(["publish", "boomapp.work", "-v"], env, cwd=tmp_path, stdin='{"n": 2}')
    assert loud.returncode == 2
    assert "Traceback" in loud.stderr and "the handler broke" in loud.stderr, \
        "with -v the handler's failures are logged, traceback and all"


def _project() -> dict[str, str]:
    project: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project


def test_version_names_the_installed_distribution(tmp_path: Path) -> None:
    done = run_cli(["--version"], {}, cwd=tmp_path)
    project = _project()
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout == f"{project['name']} {project['version']}\n"


@pytest.mark.parametrize("argv", [["-v", "--version"], ["--version", "jobs"]])
def test_version_needs_no_command_and_no_database(argv: list[str], tmp_path: Path) -> None:
    done = run_cli(argv, {}, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.startswith(f"{_project()['name']} ")
    assert not (tmp_path / ".sluice").exists()
