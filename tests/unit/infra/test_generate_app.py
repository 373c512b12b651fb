"""What ``sluice generate`` writes into an app's deployment folder beyond the tables: the
``SLUICE_APP`` line its functions find the app by, and nothing outside the folder."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sluice.core.errors import RequestError
from sluice.deploy.generate import Deployment, outputs, stale, write
from sluice.jobs.registry import JOBS
from sluice.queues.topics import TOPICS


def _environment(text: str) -> dict[str, str]:
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    environment: dict[str, str] = yaml.load(text, Loader=Loader)["provider"]["environment"]
    return environment


def test_the_apps_modules_are_its_functions_sluice_app(tmp_path: Path) -> None:
    target = Deployment(tmp_path, service="myapp", packages=("myapp",),
                        modules=("myapp.sluice_ext", "myapp.more"))
    write(target, dict(JOBS.own), dict(TOPICS.own))
    text = (tmp_path / "serverless.yml").read_text()
    assert _environment(text)["SLUICE_APP"] == "myapp.sluice_ext,myapp.more"
    # a later run with other modules rewrites that one line, and only it
    again = outputs(target._replace(modules=("other.ext",)), dict(JOBS.own), dict(TOPICS.own))
    changed = again[tmp_path / "serverless.yml"]
    assert _environment(changed)["SLUICE_APP"] == "other.ext"
    assert [a for a, b in zip(text.splitlines(), changed.splitlines(), strict=True)
            if a != b] == ['    SLUICE_APP: "myapp.sluice_ext,myapp.more"']


def test_a_serverless_yml_without_the_line_gets_it(tmp_path: Path) -> None:
    target = Deployment(tmp_path, service="myapp", modules=("myapp.sluice_ext",))
    write(target, dict(JOBS.own), dict(TOPICS.own))
    serverless = tmp_path / "serverless.yml"
    serverless.write_text(serverless.read_text().replace('    SLUICE_APP: "myapp.sluice_ext"\n',
                                                         ""))
    assert stale(target, dict(JOBS.own), dict(TOPICS.own)) == [serverless]
    write(target, dict(JOBS.own), dict(TOPICS.own))
    environment = _environment(serverless.read_text())
    assert environment["SLUICE_APP"] == "myapp.sluice_ext"
    assert environment["SLUICE_QUEUE_MODE"] == "sqs"  # the rest of it as it was
    serverless.write_text(serverless.read_text().replace("  environment:\n", "  env:\n", 1)
                          .replace('    SLUICE_APP: "myapp.sluice_ext"\n', ""))
    with pytest.raises(RequestError, match="no provider.environment"):
        outputs(target, dict(JOBS.own), dict(TOPICS.own))


def test_nothing_is_written_through_a_link_that_leaves_the_folder(tmp_path: Path) -> None:
    deployment, elsewhere = tmp_path / "deploy", tmp_path / "elsewhere"
    deployment.mkdir()
    elsewhere.mkdir()
    (deployment / "infra").symlink_to(elsewhere)
    target = Deployment(deployment, service="myapp")
    with pytest.raises(RequestError, match="outside the deployment folder") as refused:
        write(target, dict(JOBS.own), dict(TOPICS.own))
    assert refused.value.context == {"field": "--dir"}
    assert list(elsewhere.iterdir()) == [] and not (deployment / "serverless.yml").exists()
