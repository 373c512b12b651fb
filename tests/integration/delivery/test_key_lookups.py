"""Which of a sweep's match keys are already stored: one statement per ``KEYS_PER_READ``
keys on both backends, whatever the number of keys, with the same answer as a read per
key."""

from __future__ import annotations

from sluice.delivery import store as store_module
from sluice.delivery.store import DeliveryStore, Effect
from sluice.store.db import Database


def test_effect_and_entry_keys_are_found_among_more_keys_than_one_read_takes(
        db: Database) -> None:
    store = DeliveryStore(db)
    recorded = [f"alert:s:r:{n}" for n in (0, 499, 500, 1201)]  # either side of a chunk
    for key in recorded:
        store.enqueue("telegram", "-100", {"k": key}, idempotency_key=key,
                      effect=Effect("alert", "s", key))
    plain = "plain:no-effect"
    store.enqueue("telegram", "-100", {"k": plain}, idempotency_key=plain)
    keys = [f"alert:s:r:{n}" for n in range(1300)] + [plain]
    assert len(keys) > 2 * store_module.KEYS_PER_READ

    assert store.known_effects(keys) == set(recorded)
    assert store.known_keys(keys) == {*recorded, plain}
    assert store.known_effects([]) == set() == store.known_keys([])
    # a key with quotes or a comma is a value, never part of the statement
    odd = 'alert:s:r:"x",1'
    store.enqueue("telegram", "-100", {"k": odd}, idempotency_key=odd,
                  effect=Effect("alert", "s", odd))
    assert store.known_effects([odd, "alert:s:r:x"]) == {odd}
