-- The write-ahead delivery queue (shared/sluice/delivery/store.py). Every settle write is one
-- UPDATE guarded by the status it expects, so it either happens whole or not at
-- all, and a stale writer (its lease lapsed, someone else took over) changes nothing.
-- While an entry is in_flight, next_attempt_at carries its lease end too, so the
-- partial index on (status, next_attempt_at) serves lease recovery; the claim reads
-- delivery_queue_due_idx (pending entries no destination holds).

-- name: insert_entry
-- One autocommit statement: the row is what the caller passed, so nothing is read back.
-- Only the idempotency key may conflict (no row inserted: the caller reads that entry);
-- an id collision is an error, never a silent no-op.
INSERT INTO delivery_queue
    (id, channel, recipient, subject_user_id, payload, idempotency_key, status, attempts,
     next_attempt_at, lease_until, enqueued_at, updated_at)
VALUES (:id, :channel, :recipient, :subject_user_id, :payload, :idempotency_key, :status,
        :attempts, :next_attempt_at, :lease_until, :now, :now)
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING

-- name: get_entry
SELECT * FROM delivery_queue WHERE id = :id

-- name: get_by_key
SELECT * FROM delivery_queue WHERE idempotency_key = :key

-- name: record_effect
-- In the enqueue's transaction. A key already recorded keeps its first record.
INSERT INTO delivery_effects
    (idempotency_key, producer, scope_id, subject, entry_id, outcome, recorded_at, updated_at)
VALUES (:key, :producer, :scope_id, :subject, :entry_id, 'enqueued', :now, :now)
ON CONFLICT (idempotency_key) DO NOTHING

-- name: effect_keys_among @sqlite
-- Which of :keys (a JSON array) have an effect record, when each was last seen and the
-- last state its entry was seen in: one statement for a sweep's matches.
SELECT idempotency_key, updated_at, outcome FROM delivery_effects
WHERE idempotency_key IN (SELECT value FROM json_each(:keys))

-- name: effect_keys_among @postgres
SELECT idempotency_key, updated_at, outcome FROM delivery_effects
WHERE idempotency_key IN (SELECT jsonb_array_elements_text(:keys))

-- name: entry_keys_among @sqlite
SELECT idempotency_key FROM delivery_queue
WHERE idempotency_key IN (SELECT value FROM json_each(:keys))

-- name: entry_keys_among @postgres
SELECT idempotency_key FROM delivery_queue
WHERE idempotency_key IN (SELECT jsonb_array_elements_text(:keys))

-- name: effects_before_prune
-- The entries prune is about to delete (the same choice): their effect records keep the
-- final state, and stay.
UPDATE delivery_effects
SET outcome = (SELECT q.status FROM delivery_queue q
               WHERE q.idempotency_key = delivery_effects.idempotency_key),
    updated_at = (SELECT q.updated_at FROM delivery_queue q
                  WHERE q.idempotency_key = delivery_effects.idempotency_key)
WHERE idempotency_key IN (
    SELECT idempotency_key FROM delivery_queue
    WHERE status IN ('acked', 'failed') AND updated_at < :before
      AND idempotency_key IS NOT NULL
    ORDER BY updated_at
    LIMIT :limit
)

-- name: effect_purged
UPDATE delivery_effects SET outcome = 'purged', updated_at = :now
WHERE idempotency_key = (SELECT idempotency_key FROM delivery_queue
                         WHERE id = :id AND status IN ('failed', 'unknown'))

-- name: effects_purged_all
UPDATE delivery_effects SET outcome = 'purged', updated_at = :now
WHERE idempotency_key IN (
    SELECT idempotency_key FROM delivery_queue
    WHERE status = 'failed' AND idempotency_key IS NOT NULL
      AND (CAST(:channel AS text) IS NULL OR channel = :channel)
)

-- name: claim @postgres
-- One statement, one round trip: first one probe entry (the oldest it holds,
-- delivery_queue_held_due_idx) for each failing destination whose probe is due, its next
-- probe moved to the lease's end (no other claim probes it meanwhile; the probe's outcome
-- sets the next one); then due entries that wait on nothing, oldest first
-- (delivery_queue_due_idx: held entries are not in it), among :channels (a JSON array,
-- the configured channels) when given. SKIP LOCKED lets two drains, or a drain and an
-- admin redrive, pass each other without waiting.
WITH probe AS (
    UPDATE delivery_destinations SET next_probe_at = :lease_until, updated_at = :now
    WHERE key IN (SELECT key FROM delivery_destinations d
                  WHERE next_probe_at <= :now AND down_since IS NOT NULL
                    AND disabled_at IS NULL AND (paused_until IS NULL OR paused_until <= :now)
                    AND EXISTS (SELECT 1 FROM delivery_queue h
                                WHERE h.status = 'pending' AND h.held_by = d.key)
                  ORDER BY next_probe_at, key LIMIT :limit FOR UPDATE SKIP LOCKED)
    RETURNING key
), picked AS (
    SELECT (SELECT q.id FROM delivery_queue q
            WHERE q.status = 'pending' AND q.held_by = probe.key
            ORDER BY q.enqueued_at, q.id LIMIT 1 FOR UPDATE SKIP LOCKED) AS id, 0 AS o
    FROM probe
    UNION ALL
    SELECT id, 1 FROM (
        SELECT id FROM delivery_queue
        WHERE status = 'pending' AND held_by IS NULL AND next_attempt_at <= :now
          AND (CAST(:channels AS jsonb) IS NULL
               OR channel IN (SELECT jsonb_array_elements_text(CAST(:channels AS jsonb))))
        ORDER BY next_attempt_at, enqueued_at, id
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    ) due
)
UPDATE delivery_queue
SET status = 'in_flight', attempts = attempts + 1, lease_until = :lease_until,
    next_attempt_at = :lease_until, request_left_at = NULL, updated_at = :now
WHERE id IN (SELECT id FROM picked WHERE id IS NOT NULL ORDER BY o LIMIT :limit)
RETURNING *

-- name: due_probes
-- SQLite's claim, in statements (it serialises writers, BEGIN IMMEDIATE, so they cannot
-- race; Postgres does it all in claim): the failing destinations whose probe is due and that
-- hold an entry to probe with (never a paused or disabled one)...
SELECT key FROM delivery_destinations d
WHERE next_probe_at <= :now AND down_since IS NOT NULL
  AND disabled_at IS NULL AND (paused_until IS NULL OR paused_until <= :now)
  AND EXISTS (SELECT 1 FROM delivery_queue h WHERE h.status = 'pending' AND h.held_by = d.key)
ORDER BY next_probe_at, key
LIMIT :limit

-- name: probing
-- ... its next probe moved to the lease's end (the probe's outcome sets the next one) ...
UPDATE delivery_destinations SET next_probe_at = :lease_until, updated_at = :now
WHERE key = :key

-- name: claim_probe
-- ... the oldest entry it holds (delivery_queue_held_due_idx) ...
UPDATE delivery_queue
SET status = 'in_flight', attempts = attempts + 1, lease_until = :lease_until,
    next_attempt_at = :lease_until, request_left_at = NULL, updated_at = :now
WHERE id IN (
    SELECT id FROM delivery_queue
    WHERE status = 'pending' AND held_by = :key
    ORDER BY enqueued_at, id
    LIMIT 1
)
RETURNING *

-- name: claim @sqlite
-- ... then due entries that wait on nothing, oldest first (delivery_queue_due_idx: held
-- entries are not in it), among :channels when given.
UPDATE delivery_queue
SET status = 'in_flight', attempts = attempts + 1, lease_until = :lease_until,
    next_attempt_at = :lease_until, request_left_at = NULL, updated_at = :now
WHERE id IN (
    SELECT id FROM delivery_queue
    WHERE status = 'pending' AND held_by IS NULL AND next_attempt_at <= :now
      AND (:channels IS NULL OR channel IN (SELECT value FROM json_each(:channels)))
    ORDER BY next_attempt_at, enqueued_at, id
    LIMIT :limit
)
RETURNING *

-- name: request_left
-- The claimed attempt's request is about to leave: from here a lapsed lease is unknown.
-- :destination (the adapter's key) is written on every settle below too, when given.
UPDATE delivery_queue SET request_left_at = :now, unsent_lapses = 0,
    destination = COALESCE(:destination, destination)
WHERE id = :id AND status = 'in_flight' AND attempts = :attempts

-- name: hold_unconfigured @postgres
-- Entries of a channel with no adapter wait out of the claim's index until it has one.
UPDATE delivery_queue
SET held_by = 'unconfigured:' || channel, updated_at = :now,
    last_error = 'waiting: no adapter configured for channel ''' || channel || ''''
WHERE status = 'pending' AND held_by IS NULL
  AND channel NOT IN (SELECT jsonb_array_elements_text(:channels))
RETURNING channel

-- name: hold_unconfigured @sqlite
UPDATE delivery_queue
SET held_by = 'unconfigured:' || channel, updated_at = :now,
    last_error = 'waiting: no adapter configured for channel ''' || channel || ''''
WHERE status = 'pending' AND held_by IS NULL
  AND channel NOT IN (SELECT value FROM json_each(:channels))
RETURNING channel

-- name: unhold_configured @postgres
UPDATE delivery_queue SET held_by = NULL, next_attempt_at = :now, updated_at = :now
WHERE status = 'pending'
  AND held_by IN (SELECT 'unconfigured:' || value FROM jsonb_array_elements_text(:channels))

-- name: unhold_configured @sqlite
UPDATE delivery_queue SET held_by = NULL, next_attempt_at = :now, updated_at = :now
WHERE status = 'pending'
  AND held_by IN (SELECT 'unconfigured:' || value FROM json_each(:channels))

-- name: unhold
-- The destination took an entry: what it held is due at once (unless an operator paused it
-- meanwhile: then its entries wait for the pause's end).
UPDATE delivery_queue SET held_by = NULL, next_attempt_at = :now
WHERE status = 'pending' AND held_by = :key
  AND NOT EXISTS (SELECT 1 FROM delivery_destinations d
                  WHERE d.key = :key AND d.paused_until > :now)

-- name: ack
UPDATE delivery_queue
SET status = 'acked', platform_message_id = :platform_message_id, duration_ms = :duration_ms,
    lease_until = NULL, last_error = NULL, held_by = NULL, acked_at = :now, updated_at = :now,
    destination = COALESCE(:destination, destination)
WHERE id = :id AND status = 'in_flight' AND attempts = :attempts

-- name: nack
UPDATE delivery_queue
SET status = 'pending', next_attempt_at = :next_attempt_at, lease_until = NULL,
    last_error = :error, duration_ms = :duration_ms, held_by = NULL, updated_at = :now,
    destination = COALESCE(:destination, destination)
WHERE id = :id AND status = 'in_flight' AND attempts = :attempts

-- name: nack_unknown
-- Sent, no answer: counted (attempt and unknown send), never failed; pending again only
-- when the policy allows one more send, else resting in 'unknown' for the operator.
UPDATE delivery_queue
SET status = :status, unknown_sends = unknown_sends + 1, next_attempt_at = :next_attempt_at,
    lease_until = NULL, last_error = :error, duration_ms = :duration_ms, held_by = NULL,
    updated_at = :now, destination = COALESCE(:destination, destination)
WHERE id = :id AND status = 'in_flight' AND attempts = :attempts

-- name: fail
UPDATE delivery_queue
SET status = 'failed', last_error = :error, failure_reason = :reason, held_by = NULL,
    duration_ms = :duration_ms, lease_until = NULL, failed_at = :now, updated_at = :now,
    destination = COALESCE(:destination, destination)
WHERE id = :id AND status = 'in_flight' AND attempts = :attempts

-- name: fail_given_back
-- Failed for good without counting the attempt it claimed: nothing judged the entry itself
-- (its destination is disabled, or failed for too long).
UPDATE delivery_queue
SET status = 'failed', attempts = attempts - 1, last_error = :error, failure_reason = :reason,
    held_by = NULL, duration_ms = :duration_ms, lease_until = NULL, request_left_at = NULL,
    failed_at = :now, updated_at = :now, destination = COALESCE(:destination, destination)
WHERE id = :id AND status = 'in_flight' AND attempts = :attempts

-- name: release
-- Back to pending without counting the attempt it claimed: nothing judged this entry
-- (no adapter, the channel is down, the process is out of memory). last_error says why.
UPDATE delivery_queue
SET status = 'pending', attempts = attempts - 1, next_attempt_at = :next_attempt_at,
    lease_until = NULL, last_error = :error, held_by = :held_by, request_left_at = NULL,
    updated_at = :now, destination = COALESCE(:destination, destination)
WHERE id = :id AND status = 'in_flight' AND attempts = :attempts

-- name: expire
-- Pending entries not delivered within the expiry: failed, reason expired, never deleted
-- here (pruning takes settled entries past the retention, like any failed entry). Nothing
-- held by a paused destination expires (the pause's end restarts their expiry).
UPDATE delivery_queue
SET status = 'failed', failure_reason = 'expired', failed_at = :now, updated_at = :now,
    last_error = 'expired: not delivered within ' || :expire_s || ' s'
        || CASE WHEN last_error IS NULL THEN '' ELSE '; last error: ' || last_error END
WHERE status = 'pending' AND COALESCE(started_at, enqueued_at) < :before
  AND (held_by IS NULL OR held_by NOT IN (SELECT key FROM delivery_destinations
                                          WHERE paused_until > :now))
RETURNING held_by

-- name: expired_leases
SELECT id, attempts, channel, unknown_sends, request_left_at, unsent_lapses FROM delivery_queue
WHERE status = 'in_flight' AND next_attempt_at < :now
ORDER BY next_attempt_at, id
LIMIT :limit

-- name: recover_lease
-- A lapsed lease whose request had left is a send that never reported back (the process
-- died or timed out): an unknown outcome, counted (:unknown 1); :status is pending when it
-- may be sent again, else unknown, so an entry that kills its sender every time cannot
-- loop. One whose request never left gives its attempt back (:given_back 1) and counts
-- an unsent lapse; the policy fails the entry (:status failed, :reason) at the limit.
UPDATE delivery_queue
SET status = :status, unknown_sends = unknown_sends + :unknown,
    attempts = attempts - :given_back, unsent_lapses = unsent_lapses + :given_back,
    next_attempt_at = :next_attempt_at, failure_reason = :reason,
    failed_at = :failed_at,
    lease_until = NULL, request_left_at = NULL, last_error = :error, updated_at = :now
WHERE id = :id AND status = 'in_flight' AND next_attempt_at < :now
RETURNING status

-- name: count_deferred
-- Pending entries still in their backoff that this run left alone (it did not touch them
-- since :since): what the drain skipped because they were not due.
SELECT count(*) AS n FROM delivery_queue
WHERE status = 'pending' AND next_attempt_at > :now AND updated_at < :since

-- name: count_due
SELECT count(*) AS n FROM delivery_queue WHERE status = 'pending' AND next_attempt_at <= :now

-- name: queue_status
SELECT count(*) FILTER (WHERE status = 'pending' AND next_attempt_at > :now) AS in_backoff,
       min(enqueued_at) FILTER (WHERE status = 'pending') AS oldest_pending
FROM delivery_queue
WHERE status = 'pending'

-- name: prune
DELETE FROM delivery_queue
WHERE id IN (
    SELECT id FROM delivery_queue
    WHERE status IN ('acked', 'failed') AND updated_at < :before
    ORDER BY updated_at
    LIMIT :limit
)

-- name: list_entries
SELECT * FROM delivery_queue
WHERE (CAST(:status AS text) IS NULL OR status = :status)
  AND (CAST(:channel AS text) IS NULL OR channel = :channel)
  AND (CAST(:destination AS text) IS NULL OR destination = :destination)
ORDER BY enqueued_at DESC, id
LIMIT :limit

-- name: restart @sqlite
-- Every operator restart (redrive, send again, a replay): one statement resets what the
-- schedule and the expiry read, so an entry restarted after weeks is sent, on a new count.
-- :ids (a JSON array, a replay's batch), :id and :channel narrow it when given.
UPDATE delivery_queue
SET status = 'pending', attempts = 0, unknown_sends = 0, next_attempt_at = :now,
    started_at = :now, lease_until = NULL, held_by = NULL, request_left_at = NULL,
    unsent_lapses = 0,
    last_error = NULL, failed_at = NULL, failure_reason = NULL, updated_at = :now
WHERE status = :from_status
  AND (CAST(:id AS text) IS NULL OR id = :id)
  AND (CAST(:channel AS text) IS NULL OR channel = :channel)
  AND (:ids IS NULL OR id IN (SELECT value FROM json_each(:ids)))
  AND (CAST(:destination AS text) IS NULL OR destination = :destination)

-- name: restart @postgres
UPDATE delivery_queue
SET status = 'pending', attempts = 0, unknown_sends = 0, next_attempt_at = :now,
    started_at = :now, lease_until = NULL, held_by = NULL, request_left_at = NULL,
    unsent_lapses = 0,
    last_error = NULL, failed_at = NULL, failure_reason = NULL, updated_at = :now
WHERE status = :from_status
  AND (CAST(:id AS text) IS NULL OR id = :id)
  AND (CAST(:channel AS text) IS NULL OR channel = :channel)
  AND (CAST(:ids AS jsonb) IS NULL  -- = ANY (ARRAY(...)): the primary key finds a batch
       OR id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:ids AS jsonb)))))
  AND (CAST(:destination AS text) IS NULL OR destination = :destination)

-- name: forget_chunks @sqlite
-- An acked entry replayed is sent whole again: the chunks its last send got through are
-- forgotten with the restart (a failed entry redriven keeps them, and resumes after them).
DELETE FROM delivery_chunks
WHERE entry_id IN (SELECT id FROM delivery_queue
                   WHERE status = 'acked' AND id IN (SELECT value FROM json_each(:ids)))

-- name: forget_chunks @postgres
DELETE FROM delivery_chunks
WHERE entry_id IN (SELECT id FROM delivery_queue
                   WHERE status = 'acked'
                     AND id = ANY (ARRAY(SELECT jsonb_array_elements_text(
                                                CAST(:ids AS jsonb)))))

-- name: replay_window
-- One page of a replay's window (delivery_queue_window_idx): the settled entries enqueued
-- before :until (of :channel when given) after the last page's (enqueued_at, id), the
-- first page's being (:since, ''): a row comparison, so each page is a range of the
-- index, never a rescan from the window's start.
SELECT * FROM delivery_queue
WHERE status IN ('acked', 'failed', 'unknown')
  AND (enqueued_at, id) > (:after_at, :after_id) AND enqueued_at < :until
  AND (CAST(:channel AS text) IS NULL OR channel = :channel)
ORDER BY enqueued_at, id
LIMIT :limit

-- name: purge
DELETE FROM delivery_queue WHERE id = :id AND status IN ('failed', 'unknown')

-- name: mark_delivered
UPDATE delivery_queue
SET status = 'acked', acked_at = :now, updated_at = :now, held_by = NULL,
    last_error = 'marked delivered by an operator; last error: ' || COALESCE(last_error, '')
WHERE id = :id AND status = 'unknown'

-- name: held_counts
SELECT held_by, count(*) AS n FROM delivery_queue
WHERE status = 'pending' AND held_by IS NOT NULL
GROUP BY held_by

-- name: destinations_failing
SELECT * FROM delivery_destinations
WHERE down_since IS NOT NULL AND disabled_at IS NULL
ORDER BY down_since, key

-- name: destinations_all
SELECT * FROM delivery_destinations ORDER BY key

-- name: destination_get
SELECT * FROM delivery_destinations WHERE key = :key

-- name: destination_summary
-- The destinations view: per destination (the entries a drain has taken) and status, how
-- many, one channel and recipient that go there (its rates), and its last delivery.
SELECT destination AS key, status, count(*) AS n, min(channel) AS channel,
       min(recipient) AS recipient, max(acked_at) AS last_acked
FROM delivery_queue
WHERE destination IS NOT NULL AND (CAST(:key AS text) IS NULL OR destination = :key)
GROUP BY destination, status

-- name: destination_failed_disabled
SELECT count(*) AS n FROM delivery_queue
WHERE destination = :key AND status = 'failed' AND failure_reason = 'destination_disabled'

-- name: destination_controls
-- What an operator (or a gone destination) set that stops sends: disabled, or paused now.
SELECT key, paused_until, disabled_at, disabled_reason FROM delivery_destinations
WHERE disabled_at IS NOT NULL OR paused_until > :now

-- name: destination_failed
-- The first failure since its last success starts the clock (down_since); the next ones
-- count on it.
INSERT INTO delivery_destinations (key, down_since, failures, last_error, next_probe_at,
                                   updated_at)
VALUES (:key, :now, 1, :error, :next_probe_at, :now)
ON CONFLICT (key) DO UPDATE
SET failures = CASE WHEN delivery_destinations.down_since IS NULL THEN 1
                    ELSE delivery_destinations.failures + 1 END,
    down_since = COALESCE(delivery_destinations.down_since, excluded.down_since),
    last_error = excluded.last_error,
    next_probe_at = excluded.next_probe_at, updated_at = excluded.updated_at
RETURNING key, down_since, failures, last_error, next_probe_at

-- name: hold_alike
-- The destination failed: the entries waiting for the same recipient wait on it too,
-- at once (scanning the unheld pending entries once, not a claim each).
UPDATE delivery_queue SET held_by = :key, last_error = :error, updated_at = :now
WHERE status = 'pending' AND held_by IS NULL AND channel = :channel
  AND recipient = :recipient

-- name: destination_up
-- With unhold, in one transaction: a destination that is up holds nothing; its row keeps
-- what an operator set and when it last took an entry.
UPDATE delivery_destinations
SET down_since = NULL, failures = 0, next_probe_at = NULL, last_success_at = :now,
    updated_at = :now
WHERE key = :key

-- The entries of one destination, for an operator's change or a disable: those the drain
-- has seen (destination, or held_by naming it) and those not yet seen for a recipient it
-- has (same channel and recipient as one of its entries).

-- name: destination_entries
SELECT status, count(*) AS n FROM delivery_queue q
WHERE status IN ('pending', 'in_flight')
  AND (destination = :key OR held_by = :key
       OR (destination IS NULL AND held_by IS NULL AND EXISTS (
           SELECT 1 FROM delivery_queue o
           WHERE o.destination = :key AND o.channel = q.channel
             AND o.recipient = q.recipient)))
GROUP BY status

-- name: fail_destination
-- Its pending entries fail at once, attempts untouched, nothing sent: redriven (or sent
-- again) once it is enabled. Their effect records stay as they are.
UPDATE delivery_queue
SET status = 'failed', failure_reason = 'destination_disabled', failed_at = :now,
    updated_at = :now, held_by = NULL, destination = :key, lease_until = NULL,
    last_error = 'not sent: destination ' || :key || ' is disabled: ' || :reason
        || CASE WHEN last_error IS NULL THEN '' ELSE '; last error: ' || last_error END
WHERE status = 'pending'
  AND (destination = :key OR held_by = :key
       OR (destination IS NULL AND held_by IS NULL AND EXISTS (
           SELECT 1 FROM delivery_queue o
           WHERE o.destination = :key AND o.channel = delivery_queue.channel
             AND o.recipient = delivery_queue.recipient)))

-- name: hold_destination
-- Paused: its pending entries wait out of the claim's index (nothing counted) until the
-- pause ends.
UPDATE delivery_queue
SET held_by = :key, destination = :key, updated_at = :now, next_attempt_at = :until_at,
    last_error = 'waiting: destination ' || :key || ' is paused until ' || :until
WHERE status = 'pending'
  AND (destination = :key OR held_by = :key
       OR (destination IS NULL AND held_by IS NULL AND EXISTS (
           SELECT 1 FROM delivery_queue o
           WHERE o.destination = :key AND o.channel = delivery_queue.channel
             AND o.recipient = delivery_queue.recipient)))

-- name: release_destination
-- The pause ended (resumed, or its time came): its entries are due at once, their expiry
-- read from now; a destination still failing keeps them held for its probe.
UPDATE delivery_queue
SET held_by = CASE WHEN :failing = 1 THEN held_by ELSE NULL END,
    next_attempt_at = :now, started_at = :now, updated_at = :now,
    last_error = CASE WHEN :failing = 1 THEN last_error ELSE NULL END
WHERE status = 'pending' AND held_by = :key

-- name: destination_pause
INSERT INTO delivery_destinations (key, failures, paused_until, paused_at, updated_at)
VALUES (:key, 0, :until, :now, :now)
ON CONFLICT (key) DO UPDATE
SET paused_until = excluded.paused_until, paused_at = excluded.paused_at,
    updated_at = excluded.updated_at

-- name: destination_resume
UPDATE delivery_destinations SET paused_until = NULL, paused_at = NULL, updated_at = :now
WHERE key = :key AND paused_until IS NOT NULL
RETURNING down_since

-- name: destination_disable
-- Disabled: never probed, never sent to, until enabled. A destination disabled already
-- keeps its first time and reason.
INSERT INTO delivery_destinations (key, failures, disabled_at, disabled_reason, updated_at)
VALUES (:key, 0, :now, :reason, :now)
ON CONFLICT (key) DO UPDATE
SET disabled_at = COALESCE(delivery_destinations.disabled_at, excluded.disabled_at),
    disabled_reason = COALESCE(delivery_destinations.disabled_reason, excluded.disabled_reason),
    updated_at = excluded.updated_at

-- name: destination_enable
-- Enabled: it starts afresh (no failures counted, no probe waiting); what was failed
-- destination_disabled stays failed until an operator redrives it.
UPDATE delivery_destinations
SET disabled_at = NULL, disabled_reason = NULL, down_since = NULL, failures = 0,
    next_probe_at = NULL, updated_at = :now
WHERE key = :key AND disabled_at IS NOT NULL

-- name: destination_rate
INSERT INTO delivery_destinations (key, failures, rate_limit, rate_period_s, rate_until,
                                   updated_at)
VALUES (:key, 0, :rate_limit, :rate_period_s, :until, :now)
ON CONFLICT (key) DO UPDATE
SET rate_limit = excluded.rate_limit, rate_period_s = excluded.rate_period_s,
    rate_until = excluded.rate_until, updated_at = excluded.updated_at

-- name: destination_rate_clear
UPDATE delivery_destinations
SET rate_limit = NULL, rate_period_s = NULL, rate_until = NULL, updated_at = :now
WHERE key = :key AND rate_until IS NOT NULL

-- name: rate_overrides
-- The operators' rate overrides in force (the limiter reads them, every sender alike).
SELECT key, rate_limit, rate_period_s, rate_until FROM delivery_destinations
WHERE rate_until > :now

-- name: pauses_lapsed
SELECT key, down_since FROM delivery_destinations
WHERE paused_until IS NOT NULL AND paused_until <= :now

-- name: rates_lapsed
UPDATE delivery_destinations
SET rate_limit = NULL, rate_period_s = NULL, rate_until = NULL, updated_at = :now
WHERE rate_until IS NOT NULL AND rate_until <= :now

-- name: purge_all
DELETE FROM delivery_queue
WHERE status = 'failed' AND (CAST(:channel AS text) IS NULL OR channel = :channel)

-- name: status_counts
SELECT status, count(*) AS n, min(enqueued_at) AS oldest FROM delivery_queue GROUP BY status

-- name: count_failed
-- Exactly the rows redrive_all / purge_all would change, for their confirmation.
SELECT count(*) AS n FROM delivery_queue
WHERE status = 'failed' AND (CAST(:channel AS text) IS NULL OR channel = :channel)
  AND (CAST(:destination AS text) IS NULL OR destination = :destination)
