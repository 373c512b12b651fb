"""Every webhook Sluice sends verifies with the ``standardwebhooks`` library (the receiver
stand-in is built on it), before, during and after a secret rotation; ``webhook-id`` is
the same on every try of one entry."""

from __future__ import annotations

import base64
from collections.abc import Callable

from sluice.core.services import Services
from sluice.delivery.store import DeliveryStatus, DeliveryStore
from tests.integration.delivery.conftest import WIDE_RATES
from tests.integration.delivery.helpers import drain_once, due_now
from tests.providers.webhook import WebhookReceiver

OLD = "whsec_" + base64.b64encode(b"old-key-" * 4).decode()
NEW = "whsec_" + base64.b64encode(b"new-key-" * 4).decode()


def test_every_webhook_verifies_across_a_rotation(
        db_url: str, make_services: Callable[..., Services]) -> None:
    env = {"SLUICE_WEBHOOK_ALLOW_HOSTS": "127.0.0.1", **WIDE_RATES}
    with WebhookReceiver(OLD) as old_rx, WebhookReceiver(NEW) as new_rx:
        # GIVEN receivers that know only the old, or only the new, secret
        for phase, secrets, expect_old in (("before", OLD, 1), ("during", f"{NEW},{OLD}", 1),
                                           ("after", NEW, 0)):
            svc = make_services(db_url, SLUICE_WEBHOOK_SIGNING_SECRET=secrets, **env)
            store = DeliveryStore(svc.db)
            # (a refused request holds its destination, so the new receiver joins only once
            # its secret signs)
            for rx in (old_rx,) if phase == "before" else (old_rx, new_rx):
                store.enqueue("webhook", rx.url, {"phase": phase},
                              idempotency_key=f"{phase}:{rx.url}")
            # WHEN the drain sends them
            drain_once(svc)
            # THEN the old receiver accepts while its secret still signs, the new one once
            # its secret does
            got_old = [r for r in old_rx.received if r["body"] == {"phase": phase}]
            got_new = [r for r in new_rx.received if r["body"] == {"phase": phase}]
            assert len(got_old) == expect_old, phase
            assert len(got_new) == (0 if phase == "before" else 1), phase
            for got in got_old + got_new:
                assert len(got["headers"]["webhook-signature"].split(" ")) == len(
                    secrets.split(","))
                assert not any(name.startswith("x-sluice-") for name in got["headers"])
        assert (old_rx.rejected, new_rx.rejected) == (1, 0), "refused only once retired"


def test_the_webhook_id_is_the_same_on_every_try(
        db_url: str, make_services: Callable[..., Services]) -> None:
    with WebhookReceiver(NEW) as rx:
        svc = make_services(db_url, SLUICE_WEBHOOK_SIGNING_SECRET=NEW,
                            SLUICE_WEBHOOK_ALLOW_HOSTS="127.0.0.1", **WIDE_RATES)
        store = DeliveryStore(svc.db)
        entry, _ = store.enqueue("webhook", rx.url, {"text": "once"})
        rx.answers.extend([503, 503])
        for _ in range(3):
            drain_once(svc)
            if store.get(entry.id).status is DeliveryStatus.ACKED:
                break
            due_now(svc)
        ids = {r["headers"]["webhook-id"] for r in rx.received}
        assert len(rx.received) == 3 and ids == {entry.id} and list(rx.delivered) == [entry.id]
