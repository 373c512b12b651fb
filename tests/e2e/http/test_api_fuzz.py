"""Schemathesis over the OpenAPI document, in process against the ASGI app: no input,
anonymous, with the cron bearer or with a super_admin token, makes the app answer 5xx.
Seeded and bounded (``SLUICE_FUZZ_EXAMPLES`` examples per operation, default 6)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from sluice.core.services import Services
from sluice.http.app import create_app
from tests.conftest import CRON_SECRET, admin_token

EXAMPLES = int(os.environ.get("SLUICE_FUZZ_EXAMPLES", "6"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))


def server_errors(app: Any, headers: dict[str, str]) -> list[str]:
    """Every operation of the document, fuzzed; the 5xx answers, described."""
    schema = schemathesis.openapi.from_asgi("/api/openapi.json", app)
    found: list[str] = []
    operations = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1

        @FUZZ
        @given(case=operation.as_strategy())
        def fuzz(case: Any) -> None:
            response = case.call(headers=headers)
            if response.status_code >= 500:
                found.append(f"{case.method} {case.formatted_path} query={case.query} "
                             f"body={case.body!r}: {response.status_code} {response.text[:300]}")

        fuzz()
    assert operations > 10, "the document lists the API"
    return found


@pytest.mark.parametrize("auth", ["anonymous", "cron", "super_admin"])
def test_no_input_makes_the_api_answer_a_server_error(
        auth: str, sqlite_url: str, make_services: Callable[..., Services]) -> None:
    headers = {"cron": {"Authorization": f"Bearer {CRON_SECRET}"},
               "super_admin": {"Authorization": f"Bearer {admin_token(['super_admin'])}"},
               "anonymous": {}}[auth]
    app = create_app(make_services(sqlite_url))
    assert server_errors(app, headers) == []
