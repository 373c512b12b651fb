"""The Lambda artifact's lock (infra/requirements.lock) agrees with pyproject.toml, and the
packaging plugin installs exactly what it pins."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import ROOT

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


def test_the_plugin_reads_the_same_pins() -> None:
    # the plugin's own line pattern, run by Node over the lock
    pattern = re.search(r"^const PINNED = (/.*/);$", PLUGIN.read_text(), re.MULTILINE)
    assert pattern is not None
    script = (f"const PINNED = {pattern.group(1)};"
              "const text = require('fs').readFileSync(0, 'utf8');"
              "console.log(JSON.stringify(text.split('\\n').map((l) => l.match(PINNED))"
              ".filter(Boolean).map((m) => [m[1], m[2]])));")
    # an app's lock names Sluice's wheel by its file: a pin too
    wheel = "sluice @ file:///build/sluice-0.1.0-py3-none-any.whl\n    # via myapp\n"
    done = subprocess.run(["node", "-e", script], input=LOCK.read_text() + wheel,
                          capture_output=True, text=True, timeout=60, check=True)
    read = {canonicalize_name(name): version for name, version in json.loads(done.stdout)}
    assert read.pop("sluice") == "@ file:///build/sluice-0.1.0-py3-none-any.whl"
    assert read == {name: f"=={version}" for name, version in pins().items()}


class _Loader(yaml.SafeLoader):
    pass


_Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
