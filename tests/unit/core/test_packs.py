"""Packs: Sluice's capabilities declared through the extension API, and chosen by the app's
``PACKS``, one place, strictly (a wrong choice fails start-up naming the module)."""

from __future__ import annotations

import ast
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

from sluice.core.errors import ConfigurationError
from sluice.core.extensions import load, with_packs
from sluice.core.packs import ALL, PACKS, owner
from sluice.jobs.registry import CORE_JOBS, JOBS, Job
from sluice.queues.topics import TOPICS
from tests.conftest import ROOT

PACK_SOURCES = ROOT / "shared" / "sluice" / "packs"


@pytest.fixture
def module(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    made = types.ModuleType("test_ext")
    monkeypatch.setitem(sys.modules, "test_ext", made)
    yield made


def _packs(module: types.ModuleType, **declared: Any) -> list[str]:
    for name, value in declared.items():
        setattr(module, name, value)
    return [e.source for e in with_packs(load(["test_ext"], group=None))][:-1]


def test_no_packs_declared_is_every_pack(module: types.ModuleType) -> None:
    assert _packs(module) == [f"pack {name!r} (sluice.packs.{name})" for name in ALL]
    assert len(ALL) == 7 and list(JOBS.using(())) == [
        "state-cleanup", "erasure-purge", "metering-flush", "ledger-redrive", "delivery-drain",
        "history-sample", "rss-refresh"]


def test_the_app_chooses_its_packs_in_table_order(module: types.ModuleType) -> None:
    assert _packs(module, PACKS=("rss", "delivery", "alerts")) == [
        "pack 'delivery' (sluice.packs.delivery)", "pack 'rss' (sluice.packs.rss)",
        "pack 'alerts' (sluice.packs.alerts)"]
    found = load(["test_ext"], group=None)
    assert list(JOBS.using(found)) == ["state-cleanup", "delivery-drain", "rss-refresh"]
    assert list(TOPICS.using(found)) == ["rss.ingest", "rss.enrich", "rss.cluster",
                                         "rss.synthesize"]


def test_no_packs_at_all_leaves_the_core(module: types.ModuleType) -> None:
    module.PACKS = []
    found = load(["test_ext"], group=None)
    assert list(JOBS.using(found)) == [job.name for job in CORE_JOBS] == ["state-cleanup"]
    assert list(TOPICS.using(found)) == []


@pytest.mark.parametrize(("packs", "words"), [
    (["rss", "billing"], "PACKS names 'billing', not a pack; the packs are erasure, "),
    (["alerts", "rss"], "the alerts pack needs delivery; add it to PACKS"),
    (["metering"], "the metering pack needs ledger"),
    (["delivery", "delivery"], "PACKS names a pack twice"),
    ("delivery", "PACKS must be a list or tuple of pack names"),
])
def test_a_wrong_choice_fails_naming_the_module(module: types.ModuleType, packs: Any,
                                                words: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        _packs(module, PACKS=packs)
    assert caught.value.message.startswith("SLUICE_APP (test_ext): " + words)


def test_packs_are_declared_in_one_module(module: types.ModuleType,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    other = types.ModuleType("test_ext_two")
    monkeypatch.setitem(sys.modules, "test_ext_two", other)
    module.PACKS, other.PACKS = ["delivery"], ["rss"]
    with pytest.raises(ConfigurationError, match=r"SLUICE_APP \(test_ext\) and SLUICE_APP "
                                                 r"\(test_ext_two\) each declare PACKS"):
        with_packs(load(["test_ext", "test_ext_two"], group=None))


def test_channels_need_the_delivery_pack(module: types.ModuleType) -> None:
    from sluice.extend import Channel

    channel = Channel("app-pager", "a pager", lambda *a: None, check=lambda v, f: str(v))
    with pytest.raises(ConfigurationError, match="CHANNELS needs the delivery pack"):
        _packs(module, PACKS=["rss"], CHANNELS=[channel])


def test_an_app_job_cannot_take_a_packs_name_or_route(module: types.ModuleType) -> None:
    module.JOBS = [Job(name="delivery-drain", route="/api/admin/app/drain",
                       schedule="rate(5 minutes)", surface="delivery", target="app.w:run",
                       budget_s=20.0, timeout_s=30)]
    with pytest.raises(ConfigurationError, match="'delivery-drain', a name already taken"):
        JOBS.using(load(["test_ext"], group=None)).merged()
    module.PACKS = ["rss"]  # with the delivery pack off, the name is the app's to use
    assert "delivery-drain" in JOBS.using(load(["test_ext"], group=None))


def test_the_packs_declare_their_work_through_the_extension_api() -> None:
    """Each pack module takes what it declares with from ``sluice.extend``, as an app's
    extension module does; anything else it imports from sluice is a helper of its own."""
    for pack in PACKS:
        tree = ast.parse((PACK_SOURCES / f"{pack.name}.py").read_text())
        declared = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    and node.module == "sluice.extend" for alias in node.names}
        for kind in ("Job", "Topic", "Channel", "MessageField"):
            if f"{kind}(" in ast.unparse(tree):
                assert kind in declared, (pack.name, kind)


@pytest.mark.parametrize(("path", "pack"), [
    ("/api/admin/rss/sources", "rss"), ("/api/admin/flags", "rss"), ("/admin/flags", "rss"),
    ("/api/queue/status", "delivery"), ("/admin/deliveries/replay", "delivery"),
    ("/admin/erasure/r1/cancel", "erasure"), ("/api/admin/console/history", "history"),
    ("/api/admin/alerts/rules/s1", "alerts"), ("/admin/queues", None), ("/api/admin/dlq", None),
    ("/api/admin/erasures", None),
])
def test_each_path_belongs_to_its_pack(path: str, pack: str | None) -> None:
    assert owner(path) == pack
