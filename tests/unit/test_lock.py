"""The Lambda artifact's lock (infra/requirements.lock) agrees with pyproject.toml, and the
packaging plugin installs exactly what it pins."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import ROOT
from tests.deploy.conftest import ensure_node_modules

LOCK = ROOT / "infra" / "requirements.lock"
PLUGIN = ROOT / "infra" / "plugins" / "sluice-packaging.js"
COMMAND = ("uv pip compile pyproject.toml --python-version 3.12 --python-platform "
           "x86_64-manylinux_2_17 -o infra/requirements.lock")


def pins() -> dict[str, str]:
    found: dict[str, str] = {}
    for line in LOCK.read_text().splitlines():
        if not line or line[0] in "# ":
            continue
        name, sep, version = line.partition("==")
        assert sep and re.fullmatch(r"[\w.+!-]+", version), f"not an exact pin: {line!r}"
        found[canonicalize_name(name)] = version
    return found


def test_every_declared_dependency_is_pinned_within_its_range() -> None:
    declared = [Requirement(r) for r in
                tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]
    locked = pins()
    for requirement in declared:
        name = canonicalize_name(requirement.name)
        assert name in locked, f"{requirement} is not in the lock: run `{COMMAND}`"
        assert requirement.specifier.contains(locked[name], prereleases=True), \
            f"{name}=={locked[name]} is outside {requirement.specifier}: run `{COMMAND}`"
    # extras are locked too (psycopg[binary], pyjwt[crypto])
    assert {"psycopg-binary", "cryptography"} <= set(locked)


def test_the_lock_says_how_it_was_made_and_the_deployment_installs_from_it() -> None:
    assert COMMAND in LOCK.read_text().splitlines()[1]
    serverless = yaml.load((ROOT / "serverless.yml").read_text(), Loader=_Loader)
    assert serverless["custom"]["packaging"]["lock"] == "infra/requirements.lock"
    template = (ROOT / "shared" / "sluice" / "deploy" / "templates" / "serverless.yml").read_text()
    assert "    lock: requirements.lock" in template


def _plugin_requirements(service: Path, lock: str, local_only: list[str]) -> list[str]:
    """The Lambda requirements the packaging plugin writes from ``lock`` (its own code, run
    by Node on a stand-in of the osls service it gets)."""
    (service / "requirements.lock").write_text(lock)
    config = {"lock": "requirements.lock", "localOnly": local_only}
    script = (f"const Plugin = require({json.dumps(str(PLUGIN))});"
              "class Failed extends Error {};"
              f"const serverless = {{serviceDir: {json.dumps(str(service))}, classes: {{Error: Failed}},"
              f" service: {{custom: {{packaging: {json.dumps(config)}}}}}}};"
              "const log = {info() {}, warning() {}};"
              "new Plugin(serverless, {}, {log}).writeRequirements();")
    subprocess.run(["node", "-e", script], cwd=ROOT, capture_output=True, text=True,
                   timeout=60, check=True)
    return (service / ".serverless" / "sluice-requirements.txt").read_text().splitlines()


def test_the_plugin_installs_the_same_pins_less_what_only_sluice_dev_needs(
        tmp_path: Path) -> None:
    ensure_node_modules()
    written = _plugin_requirements(tmp_path, LOCK.read_text(), ["uvicorn", "pyyaml"])
    read = {canonicalize_name(line.split("==")[0]): line.split("==")[1] for line in written}
    # click is in the lock only for uvicorn; h11 for uvicorn and httpcore, so it stays
    left_out = {"uvicorn", "pyyaml", "click"}
    assert read == {name: version for name, version in pins().items() if name not in left_out}
    assert "h11" in read


def test_an_apps_lock_names_sluices_wheel_and_where_it_is(tmp_path: Path) -> None:
    ensure_node_modules()
    lock = ("--find-links wheels\n\nsluice-lambda @ file:///build/sluice_lambda-0.1.0-py3-none-any.whl\n"
            "    # via myapp (pyproject.toml)\nuvicorn==0.55.0\n    # via sluice-lambda\n"
            "click==8.5.1\n    # via uvicorn\n")
    written = _plugin_requirements(tmp_path, lock, ["uvicorn"])
    assert written == [f"--find-links {tmp_path / 'wheels'}",
                       "sluice-lambda @ file:///build/sluice_lambda-0.1.0-py3-none-any.whl"]


class _Loader(yaml.SafeLoader):
    pass


_Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
