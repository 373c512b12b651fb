"""Erasure removes the alert rules addressed to the subject (recipient equal to the subject
id, any case) and keeps every other rule, on both backends; counted and verified."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sluice.alerts.rules import RulesStore
from sluice.core.services import Services
from sluice.erasure.purge import count_subject
from sluice.erasure.requests import ErasureStore
from sluice.jobs.registry import get_job
from sluice.jobs.runner import run_job


def rule(rule_id: str, channel: str, recipient: str) -> dict[str, Any]:
    return {"id": rule_id, "match": {"keywords": ["x"]},
            "destination": {"channel": channel, "recipient": recipient}}


def test_an_erasure_removes_the_subjects_rules_and_keeps_the_others(
        db_url: str, make_services: Callable[..., Services]) -> None:
    svc = make_services(db_url)
    rules = RulesStore(svc)
    rules.put("acme", [rule("mine", "email", "Ana@Example.com"), rule("team", "slack", "C0A"),
                       rule("mine-too", "email", "ana@example.com")])
    rules.put("globex", [rule("other", "email", "ana@example.org"),
                         rule("dm", "email", "ANA@example.com")])
    rules.put("initech", [rule("r", "slack", "C0B")])
    assert count_subject(svc, "ana@example.com")["alert_rules"] == 3

    ErasureStore(svc.db).create("ana@example.com", requested_by="admin-1", grace_days=0)
    outcome = run_job(get_job("erasure-purge"), svc, "cli")
    assert outcome.outcome == "ok", outcome.body
    [result] = outcome.body["results"]
    assert result["status"] == "purged" and result["tables"]["alert_rules"] == 2  # rows

    assert count_subject(svc, "ana@example.com")["alert_rules"] == 0
    assert [r.id for r in rules.get("acme")] == ["team"]
    assert [r.id for r in rules.get("globex")] == ["other"]
    assert [r.id for r in rules.get("initech")] == ["r"]
