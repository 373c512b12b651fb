-- Why a delivery entry failed for good, as a word an operator (and the DLQ tooling) can
-- filter on: permanent (the platform refused it), max_attempts (the last attempt failed
-- transiently), lease_lost (its last sender died holding it), expired (not delivered
-- within SLUICE_DELIVERY_EXPIRE_SECONDS). last_error keeps the full text.
ALTER TABLE delivery_queue ADD COLUMN failure_reason text NULL;
