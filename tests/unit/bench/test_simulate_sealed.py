"""The simulated deployment reaches nothing but its stand-ins (the ``sealed`` invariant's
record): an AWS client the simulator did not replace is refused before anything is sent,
and so is a host that is no stand-in. Nothing here connects anywhere."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import boto3
import httpx
import pytest

from bench.simulate.peers import Installed, Network


def _network() -> Network:
    return Network(lambda: datetime(2026, 1, 5, tzinfo=UTC), lambda seconds: None)


def test_an_aws_call_through_botocore_is_refused_and_recorded() -> None:
    network = _network()
    client = boto3.client("cloudwatch", region_name="eu-west-1", aws_access_key_id="x",
                          aws_secret_access_key="y")
    with Installed(network), pytest.raises(Exception) as raised:
        client.list_metrics()
    assert "simulated network" in str(raised.value)
    assert network.refused_hosts == ["https://monitoring.eu-west-1.amazonaws.com (botocore)"]


def test_a_host_that_is_no_stand_in_is_refused_and_recorded() -> None:
    network = _network()
    with Installed(network), httpx.Client() as client, pytest.raises(httpx.ConnectError):
        client.get("http://10.0.0.1:8080/")
    assert network.refused_hosts == ["10.0.0.1:8080"]


def test_botocore_sends_as_before_once_uninstalled() -> None:
    from botocore.endpoint import Endpoint

    before: Any = Endpoint._send
    with Installed(_network()):
        assert Endpoint._send is not before
    assert Endpoint._send is before
