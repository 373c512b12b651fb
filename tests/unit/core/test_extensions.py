"""The app's extension modules: found by entry point or SLUICE_APP, merged into the tables,
and refused, naming the module, when a declaration is malformed or takes a used name."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

from sluice.core.errors import ConfigurationError, RequestError
from sluice.core.extensions import Extension, load
from sluice.delivery.channels import Channel, channels, check_recipient
from sluice.jobs.registry import JOBS, Job
from sluice.jobs.schedule import job_schedules
from sluice.queues.topics import TOPICS, Topic
from tests.conftest import ROOT

APP = ROOT / "docs" / "examples" / "exampleapp"


def _job(**change: Any) -> Job:
    base = Job(name="app-tick", route="/api/admin/app/tick", schedule="rate(5 minutes)",
               surface="state", target="app.work:tick", budget_s=20.0, timeout_s=30)
    return base._replace(**change)


@pytest.fixture
def module(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """An extension module of a test's own, importable as ``test_ext``."""
    made = types.ModuleType("test_ext")
    monkeypatch.setitem(sys.modules, "test_ext", made)
    yield made


def _tables(module: types.ModuleType) -> tuple[dict[str, Job], dict[str, Topic]]:
    found = load(["test_ext"], group=None)
    return JOBS.using(found).merged(), TOPICS.using(found).merged()


def test_the_example_app_merges_into_every_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(APP))
    found = load(["exampleapp.sluice_ext"], group=None)
    assert [e.packages for e in found] == [("exampleapp",)]
    jobs = JOBS.using(found)
    assert list(jobs)[-1] == "exampleapp-digest" and set(JOBS.own) < set(jobs)
    assert job_schedules(jobs)["exampleapp-digest"] == ["rate(1 minute)"]
    assert "exampleapp.signup" in TOPICS.using(found)
    # the process's own tables hold no app (no entry point, no SLUICE_APP in the suite)
    assert "exampleapp-digest" not in JOBS and "exampleapp-pager" not in channels()


def test_a_module_named_twice_counts_once(module: types.ModuleType) -> None:
    module.JOBS = [_job()]
    found = load(["test_ext", "test_ext"], group=None)
    assert len(found) == 1 and isinstance(found[0], Extension)
    assert "app-tick" in JOBS.using(found)


@pytest.mark.parametrize(("change", "words"), [
    ({"name": "state-cleanup"}, "already taken"),
    ({"name": "App_Tick"}, "lower-case words"),
    ({"route": "/admin/tick"}, "under /api/"),
    ({"route": "/api/admin/state/cleanup"}, "share the route"),
    ({"schedule": "every 5 minutes"}, "expected rate(...) or cron(...)"),
    ({"schedule": "cron(0 3 * * * *)"}, "day-of-month or day-of-week"),
    ({"surface": "billing"}, "surface must be one of"),
    ({"target": "app.work.tick"}, "'module:function'"),
    ({"budget_s": 30.0}, "below timeout_s"),
    ({"timeout_s": 1000, "budget_s": 50.0}, "at most 900"),
])
def test_a_malformed_job_is_refused_naming_the_module(module: types.ModuleType,
                                                      change: dict[str, Any], words: str) -> None:
    module.JOBS = [_job(**change)]
    with pytest.raises(ConfigurationError, match="test_ext") as caught:
        _tables(module)
    assert words in caught.value.message


@pytest.mark.parametrize(("declared", "words"), [
    ({"TOPICS": [Topic("rss.ingest", "app.work:h")]}, "already taken"),
    ({"TOPICS": [Topic("signup", "app.work:h")]}, "area.name"),
    ({"TOPICS": [Topic("app.signup", "app.work.h")]}, "'module:function'"),
    ({"TOPICS": [Topic("app.signup", "app.work:h", batch_size=11)]}, "batch_size"),
    ({"TOPICS": [Topic("app.signup", "app.work:h", max_concurrency=1)]}, "max_concurrency"),
    ({"TOPICS": [Topic("app.signup", "app.work:h", concurrency_var="X")]}, "concurrency_var"),
    ({"TOPICS": ["app.signup"]}, "not a sluice.extend.Topic"),
    ({"TOPICS": "app.signup"}, "must be a list or tuple"),
    ({"JOBS": [{"name": "x"}]}, "not a sluice.extend.Job"),
])
def test_a_malformed_declaration_is_refused(module: types.ModuleType, declared: dict[str, Any],
                                            words: str) -> None:
    for name, value in declared.items():
        setattr(module, name, value)
    with pytest.raises(ConfigurationError, match="test_ext") as caught:
        _tables(module)
    assert words in caught.value.message


def test_a_module_that_does_not_import_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="SLUICE_APP: cannot import 'no_such_app_x'"):
        load(["no_such_app_x"], group=None)


def _build(*args: object) -> None:
    return None


def _pager(value: Any, field: str) -> str:
    if value != "team":
        raise RequestError(f"{field} must be team", field=field)
    return "team"


def test_a_channel_brings_its_own_recipient_check(monkeypatch: pytest.MonkeyPatch,
                                                  module: types.ModuleType) -> None:
    import sluice.delivery.channels as registry

    module.CHANNELS = [Channel("app-pager", "a pager", _build, check=_pager)]
    table = registry._table().using(load(["test_ext"], group=None))
    monkeypatch.setattr(registry, "_table", lambda: table)
    assert "app-pager" in channels()
    assert check_recipient("app-pager", "team", field="recipient") == "team"
    with pytest.raises(RequestError, match="recipient must be team"):
        check_recipient("app-pager", "nobody", field="recipient")
    # Sluice's own channels keep their checks
    with pytest.raises(RequestError):
        check_recipient("email", "a b@c", field="recipient")


@pytest.mark.parametrize(("channel", "words"), [
    (Channel("webhook", "x", _build, check=_pager), "already taken"),
    (Channel("App Pager", "x", _build, check=_pager), "lower-case words"),
    (Channel("app-pager", "x", _build), "build and check must be functions"),
])
def test_a_malformed_channel_is_refused(module: types.ModuleType, channel: Channel,
                                        words: str) -> None:
    import sluice.delivery.channels as registry

    module.CHANNELS = [channel]
    with pytest.raises(ConfigurationError, match="test_ext") as caught:
        registry._table().using(load(["test_ext"], group=None)).merged()
    assert words in caught.value.message


def test_sluices_own_jobs_pass_the_checks_an_apps_do() -> None:
    from sluice.jobs.registry import check_job

    own = list(JOBS.using(()).values())  # the core's and every pack's (sluice.packs)
    assert [check_job(job, "sluice") for job in own] == own and len(own) == 7
