"""The audit IP is who connected, as the nearest trusted hop saw it. ``sluice dev`` and the
Lambda path decide it with one function (``caller_address``): the socket's peer (locally)
or API Gateway's source IP (on Lambda), and ``X-Forwarded-For`` only from a proxy named in
``SLUICE_TRUSTED_PROXIES``, never from the caller itself."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from sluice.core.errors import ConfigurationError
from sluice.core.settings import Settings
from sluice.http.app import caller_address
from sluice.store.db import open_database
from tests.conftest import BASE_ENV, admin_token, start_dev

SCRIPT = "<script>alert(1)</script>"


def test_sluice_dev_stores_the_peer_not_the_callers_forwarded_for(tmp_path: Path) -> None:
    db = tmp_path / "dev.db"
    base, proc = start_dev({**BASE_ENV, "SLUICE_DATABASE_URL": f"sqlite:///{db}"}, tmp_path,
                           "--no-scheduler")
    try:
        token = admin_token(["super_admin"], subject="ops-1")
        for claim in (SCRIPT, "203.0.113.9"):
            answer = httpx.post(f"{base}/api/admin/state/cleanup", timeout=30, headers={
                "authorization": f"Bearer {token}", "x-forwarded-for": claim})
            assert answer.status_code == 200, answer.text
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
    store = open_database(f"sqlite:///{db}")
    with store.transaction() as tx:
        rows = tx.fetchall("SELECT ip, detail FROM admin_audit WHERE action = "
                           "'state-cleanup:admin' ORDER BY at")
    store.close()
    assert [row["ip"] for row in rows] == ["127.0.0.1", "127.0.0.1"]
    # the caller's claim is kept as what it is, beside the address
    assert SCRIPT in str(rows[0]["detail"]), rows[0]


@pytest.mark.parametrize(("peer", "forwarded", "trusted", "caller"), [
    # nobody trusted: the peer, whatever the header says (sluice dev's default, Lambda's)
    ("127.0.0.1", SCRIPT, (), "127.0.0.1"),
    ("198.51.100.23", "203.0.113.9", (), "198.51.100.23"),
    # a trusted proxy: the right-most hop that is not one of ours
    ("10.0.0.5", "203.0.113.9", ("10.0.0.0/8",), "203.0.113.9"),
    ("10.0.0.5", "198.51.100.1, 203.0.113.9, 10.0.0.7", ("10.0.0.0/8",), "203.0.113.9"),
    ("::1", "2001:db8::9", ("::1",), "2001:db8::9"),
    # a hop that is not an address ends the walk at the last trusted one
    ("10.0.0.5", SCRIPT, ("10.0.0.0/8",), "10.0.0.5"),
    ("10.0.0.5", f"203.0.113.9, {SCRIPT}", ("10.0.0.0/8",), "10.0.0.5"),
    # the header from an untrusted peer counts for nothing
    ("198.51.100.23", "10.0.0.1", ("10.0.0.0/8",), "198.51.100.23"),
    # a peer that is not an address (a test client's name) is no address
    ("testclient", "203.0.113.9", (), None),
    (None, "203.0.113.9", ("10.0.0.0/8",), None),
])
def test_caller_address(peer: str | None, forwarded: str | None, trusted: tuple[str, ...],
                        caller: str | None) -> None:
    assert caller_address(peer, forwarded, trusted) == caller


def test_trusted_proxies_must_be_addresses_or_ranges() -> None:
    ok = Settings.from_env({"SLUICE_TRUSTED_PROXIES": "10.0.0.0/8, 192.0.2.1, ::1"})
    assert ok.trusted_proxies == ("10.0.0.0/8", "192.0.2.1", "::1")
    with pytest.raises(ConfigurationError, match="SLUICE_TRUSTED_PROXIES"):
        Settings.from_env({"SLUICE_TRUSTED_PROXIES": "proxy.internal"})
