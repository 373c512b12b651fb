"""A destination's rate override over HTTP, on both backends: a ``limit`` no float holds (a
400-digit integer, ``1e400``, ``NaN``) or outside its bounds is a typed 400 naming the field,
never a 500; one inside them is taken."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from sluice.core.services import Services
from sluice.core.times import iso_z
from sluice.http.app import create_app
from sluice.store.db import utcnow
from tests.conftest import admin_token

RATE = "/api/admin/delivery/destinations/telegram:1001/rate"


@pytest.fixture
def client(db_url: str, make_services: Callable[..., Services]) -> TestClient:
    return TestClient(create_app(make_services(db_url)), raise_server_exceptions=False)


def ops() -> dict[str, str]:
    return {"authorization": f"Bearer {admin_token(['ops'], subject='ops-1')}"}


@pytest.mark.parametrize("limit", ["1" + "0" * 399, "-" + "9" * 400, "1e400", "NaN",
                                   "-Infinity", "10001", "0.001", "\"5\""])
def test_a_limit_out_of_bounds_or_beyond_a_float_is_a_400_naming_it(
        client: TestClient, limit: str) -> None:
    until = iso_z(utcnow() + timedelta(hours=1))
    body = f'{{"limit": {limit}, "per": "second", "until": "{until}"}}'

    answer = client.post(RATE, content=body, headers={**ops(), "content-type": "application/json"})

    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["field"] == "limit"
    assert "from 0.01 to 10000 (per second)" in error["message"]


def test_a_limit_within_bounds_is_taken(client: TestClient) -> None:
    until = iso_z(utcnow() + timedelta(hours=1))
    answer = client.post(RATE, json={"limit": 10_000, "per": "second", "until": until},
                         headers=ops())
    assert answer.status_code == 200, answer.text
