"""The jobs page in a real browser (Playwright driving Debian's Chromium): a job whose
scheduler went quiet shows ``overdue`` with when it was expected and when it last ran;
marking it disabled on purpose (a reason, CSRF-safe, audited) shows it ``disabled``, and
taking the mark off shows it overdue again."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest

from sluice.core.services import Services
from sluice.jobs.runs import RunStore
from sluice.store.db import utcnow
from tests.e2e.console.test_console_browser import SHOTS, logged_in, served  # noqa: F401
from tests.integration.jobs.test_overdue import add_run


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_overdue_job_on_the_jobs_page_and_its_disabled_mark(
        served: tuple[str, Services]) -> None:  # noqa: F811
    base, services = served
    add_run(services.db, "metering-flush", "schedule", utcnow() - timedelta(minutes=40))
    add_run(services.db, "delivery-drain", "schedule", utcnow() - timedelta(seconds=20))
    with logged_in(base, services) as page:
        page.goto(f"{base}/admin/jobs")
        flush = page.locator("#job-metering-flush")
        assert flush.locator("[data-state]").inner_text() == "overdue"
        text = flush.inner_text()
        assert "expected by" in text and "no scheduled run since" in text, text
        assert "Last scheduled run" in text
        assert page.locator("#job-delivery-drain [data-state]").inner_text() == "ok"
        assert page.locator("#job-history-sample [data-state]").inner_text() == "never"
        page.screenshot(path=str(SHOTS / "jobs_overdue.png"), full_page=True)

        flush.get_by_label("Reason").fill("Polar contract paused")
        flush.get_by_role("button", name="Mark metering-flush's schedule disabled on "
                          "purpose").click()
        page.wait_for_url(re.compile(r"/admin/jobs"))
        flush = page.locator("#job-metering-flush")
        assert flush.locator("[data-state]").inner_text() == "disabled"
        assert "Polar contract paused" in flush.inner_text()
        [audit] = [r for r in RunStore(services.db).recent_audit()
                   if r["action"] == "metering-flush:disable"]
        assert audit["outcome"] == "303", audit

        flush.get_by_role("button", name="Take the disabled mark off metering-flush").click()
        page.wait_for_url(re.compile(r"/admin/jobs"))
        assert page.locator("#job-metering-flush [data-state]").inner_text() == "overdue"
        assert any(r["action"] == "metering-flush:enable"
                   for r in RunStore(services.db).recent_audit())
