"""A webhook receiver is one destination however its URL writes it: ``https://h/`` and
``https://h:443/`` are ``webhook:h:443`` (one state, one rate, a pause of one holds both),
a key an operator types is read into that form, and migration 0027 moves the keys stored
before (``webhook:h:``) to it, keeping the more restrictive state. Both backends."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from sluice.core.errors import RequestError
from sluice.core.services import Services
from sluice.core.times import iso_z
from sluice.delivery.destinations import check_key
from sluice.delivery.keys import keys_for
from sluice.delivery.ratelimit import Override, rates_for
from sluice.delivery.replay import parse_filter
from sluice.delivery.store import DeliveryStatus, DeliveryStore
from sluice.ops.destinations import apply, describe, parse_change, view
from sluice.store.db import MIGRATIONS_DIR, Database, utcnow
from tests.integration.delivery.helpers import Providers, drain_once

KEY = "webhook:hooks.example.com:443"
SINCE = iso_z(utcnow() - timedelta(days=1))


def test_one_receiver_named_both_ways_is_one_destination(
        db_url: str, providers: Providers, make_services: Callable[..., Services]) -> None:
    # GIVEN two rules' URLs for one receiver: one names no port, the other its default
    svc = make_services(db_url, **providers.env())
    store = DeliveryStore(svc.db)
    bare = store.enqueue("webhook", "https://hooks.example.com/a", {"text": "bare"})[0]
    named = store.enqueue("webhook", "https://Hooks.Example.com:443/b", {"text": "named"})[0]

    # WHEN an operator pauses the receiver under its one key, and a drain runs
    until = utcnow() + timedelta(hours=1)
    apply(svc, parse_change("pause", KEY, {"until": iso_z(until)}))
    result = drain_once(svc)

    # THEN the pause holds both (nothing sent, nothing counted), under that one key
    assert result["paused"] == 2 and result["recovered"] == 0
    for held in (bare, named):
        stored = store.get(held.id)
        assert (stored.status, stored.attempts, stored.receiver) == (
            DeliveryStatus.PENDING, 0, KEY)
    # one state: the view knows one webhook destination, with both entries waiting on it
    [only] = [d for d in view(svc)["destinations"] if d["channel"] == "webhook"]
    assert (only["key"], only["state"], only["waiting"]) == (KEY, "paused", 2)
    # one rate: both sends take their slot on one host key, and an override of it binds both
    override = Override(KEY, 2, "second", until)
    assert rates_for(store.get(bare.id), svc.settings, override) == \
        rates_for(store.get(named.id), svc.settings, override)
    assert [rate.key for rate in rates_for(store.get(bare.id), svc.settings)] == \
        ["webhook:host:hooks.example.com:443"]
    assert describe(svc, KEY)["rates"][0]["key"] == "webhook:host:hooks.example.com:443"


@pytest.mark.parametrize(("typed", "read"), [
    ("webhook:Hooks.Example.COM.:443", KEY),
    ("webhook:hooks.example.com:0443", KEY),
    ("webhook:bücher.example:443", "webhook:xn--bcher-kva.example:443"),
    ("webhook:::1:8080", "webhook:::1:8080"),
    ("telegram:1001", "telegram:1001"),
])
def test_a_key_an_operator_types_is_read_as_the_drain_writes_it(typed: str, read: str) -> None:
    assert check_key(typed) == read
    assert parse_filter({"destination": typed, "since": SINCE},
                        channels=["webhook", "telegram"]).destination == read


@pytest.mark.parametrize(("url", "typed"), [
    ("https://Hooks.Example.COM./x", "webhook:hooks.example.com:443"),
    ("https://hooks.example.com:443/x", "webhook:HOOKS.example.com.:443"),
    ("http://b\u00fccher.example/x", "webhook:B\u00fccher.example:80"),
    ("https://[0:0::1]:8080/x", "webhook:::1:8080"),
    ("https://[::1]:8080/x", "webhook:0:0:0:0:0:0:0:1:8080"),
])
def test_the_drains_key_and_the_operators_are_one_reading(url: str, typed: str) -> None:
    """The receiver key an entry gets for a URL at its enqueue and the key an operator
    types for the same receiver are the same string, however either writes the host."""
    assert keys_for("webhook", url).receiver == check_key(typed)


def test_the_old_key_without_its_port_is_refused_naming_the_canonical_keys() -> None:
    with pytest.raises(RequestError) as refused:
        check_key("webhook:hooks.example.com:")
    assert refused.value.context["field"] == "destination"
    assert "webhook:hooks.example.com:443 for https" in refused.value.message
    assert "webhook:hooks.example.com:80 for http" in refused.value.message
    with pytest.raises(RequestError, match="names no port"):
        parse_filter({"destination": "webhook:hooks.example.com:",
                      "since": SINCE}, channels=["webhook"])


MIGRATION = "0027_webhook_destination_keys"


def _old_keys(db: Database, store: DeliveryStore, url: str, key: str, *, held: bool) -> str:
    """An entry as the drain keyed it before 0027 (``webhook:<host>:``)."""
    found = store.enqueue("webhook", url, {"text": url})[0]
    with db.transaction() as tx:
        tx.execute("UPDATE delivery_queue SET destination = :key, held_by = :held "
                   "WHERE id = :id", {"key": key, "held": key if held else None,
                                      "id": found.id})
    return found.id


def _destination(db: Database, key: str, **state: object) -> None:
    columns = {"key": key, "updated_at": utcnow(), "failures": 0, **state}
    with db.transaction() as tx:
        tx.execute(f"INSERT INTO delivery_destinations ({', '.join(columns)}) "
                   f"VALUES ({', '.join(':' + c for c in columns)})", columns)


def _row(db: Database, key: str) -> dict[str, object] | None:
    with db.transaction() as tx:
        return tx.fetchone("SELECT * FROM delivery_destinations WHERE key = :key", {"key": key})


def test_the_migration_moves_old_webhook_keys_to_the_canonical_ones(db: Database) -> None:
    store, now = DeliveryStore(db), utcnow()
    soon, later = now + timedelta(hours=1), now + timedelta(hours=5)
    # GIVEN entries and destinations keyed before 0027
    a = _old_keys(db, store, "https://a.example/x", "webhook:a.example:", held=True)
    a_named = _old_keys(db, store, "https://a.example:443/y", "webhook:a.example:443",
                        held=False)
    c = _old_keys(db, store, "http://c.example/x", "webhook:c.example:", held=False)
    _old_keys(db, store, "https://e.example:8443/x", "webhook:e.example:8443", held=False)
    # a.example: paused under both keys (the old one longer), failing under the old one
    _destination(db, "webhook:a.example:", paused_until=later, paused_at=now,
                 down_since=now - timedelta(hours=2), failures=4, next_probe_at=soon,
                 last_error="refused")
    _destination(db, "webhook:a.example:443", paused_until=soon, paused_at=now,
                 rate_limit=1.0, rate_period_s=60, rate_until=later)
    # b.example: disabled under the old key, paused under the new one
    _destination(db, "webhook:b.example:", disabled_at=now, disabled_reason="gone: 410")
    _destination(db, "webhook:b.example:443", paused_until=soon, paused_at=now)
    # c.example: only http entries; d.example: no entry tells (https)
    _destination(db, "webhook:c.example:", paused_until=soon, paused_at=now)
    _destination(db, "webhook:d.example:", disabled_at=now, disabled_reason="by an operator: x")
    with db.transaction() as tx:
        tx.execute("INSERT INTO delivery_rate_limits (key, next_at_us) VALUES "
                   "('webhook:host:a.example:', 1), ('webhook:host:e.example:8443', 2)")

    # WHEN the migration runs
    db.run_script((Path(MIGRATIONS_DIR) / f"{MIGRATION}.{db.dialect}.sql").read_text())

    # THEN each entry carries its URL's canonical key, and each receiver has one row
    assert {store.get(i).destination for i in (a, a_named)} == {"webhook:a.example:443"}
    assert store.get(a).held_by == "webhook:a.example:443"
    assert store.get(c).destination == "webhook:c.example:80"
    with db.transaction() as tx:
        keys = sorted(r["key"] for r in tx.fetchall("SELECT key FROM delivery_destinations"))
        slots = sorted(r["key"] for r in tx.fetchall("SELECT key FROM delivery_rate_limits"))
    assert keys == ["webhook:a.example:443", "webhook:b.example:443", "webhook:c.example:80",
                    "webhook:d.example:443"]
    assert slots == ["webhook:host:e.example:8443"]
    merged = _row(db, "webhook:a.example:443")
    assert merged is not None
    assert _time(merged["paused_until"]) == later, "the later pause end"
    assert (merged["failures"], merged["last_error"]) == (4, "refused"), "the failing state"
    assert (merged["rate_limit"], merged["rate_period_s"]) == (1.0, 60), "its own override"
    both = _row(db, "webhook:b.example:443")
    assert both is not None and both["disabled_reason"] == "gone: 410", "disabled over paused"
    assert _time(both["paused_until"]) == soon
    assert _row(db, "webhook:c.example:80") is not None
    moved = _row(db, "webhook:d.example:443")
    assert moved is not None and moved["disabled_reason"] == "by an operator: x"
    # and running it again changes nothing
    db.run_script((Path(MIGRATIONS_DIR) / f"{MIGRATION}.{db.dialect}.sql").read_text())
    with db.transaction() as tx:
        assert sorted(r["key"] for r in tx.fetchall(
            "SELECT key FROM delivery_destinations")) == keys


def _time(value: object) -> object:
    from datetime import UTC, datetime

    return datetime.fromisoformat(value).astimezone(UTC) if isinstance(value, str) else value


@pytest.mark.parametrize("key", ["telegram:\u0661\u0660\u0660\u0661", "nochannel:foo",
                                 "slack:not a channel", "webhook:ftp://x.example/",
                                 "email:not-an-address", "telegram", "webhook:h:99999"])
def test_a_key_no_entry_can_have_is_refused_naming_destination(key: str) -> None:
    with pytest.raises(RequestError) as refused:
        check_key(key)
    assert refused.value.context["field"] == "destination"


@pytest.mark.parametrize(("typed", "read"), [
    ("webhook:https://Hooks.Example.com/services/A", "webhook:https://hooks.example.com/services/A"),
    ("email:smtp", "email:smtp"),
    ("slack:C0ALERTS", "slack:C0ALERTS"),
    ("telegram:-100500", "telegram:-100500"),
])
def test_a_destination_is_read_as_its_entries_carry_it(typed: str, read: str) -> None:
    assert check_key(typed) == read
    channel, _, recipient = read.partition(":")
    if read != "email:smtp":
        assert keys_for(channel, recipient).destination == read
