-- The write-ahead delivery queue (shared/sluice/delivery/store.py). Every settle write is one
-- UPDATE guarded by the status it expects, so it either happens whole or not at
-- all, and a stale writer (its lease lapsed, someone else took over) changes nothing.
-- While an entry is in_flight, next_attempt_at carries its lease end too, so the
-- partial index on (status, next_attempt_at) serves lease recovery; the claim reads
-- delivery_queue_due_idx (pending entries no destination holds).

-- name: insert_entry
-- One autocommit statement: the row is what the caller passed, so nothing is read back.
-- Only the idempotency key may conflict (no row inserted: the caller reads that entry);
-- an id collision is an error, never a silent no-op. destination and receiver are decided
-- here, once (shared/sluice/delivery/keys.py); trace_context is the enqueue span's.
INSERT INTO delivery_queue
    (id, channel, recipient, subject_user_id, payload, idempotency_key, status, attempts,
     next_attempt_at, lease_until, enqueued_at, updated_at, destination, receiver,
     trace_context)
VALUES (:id, :channel, :recipient, :subject_user_id, :payload, :idempotency_key, :status,
        :attempts, :next_attempt_at, :lease_until, :now, :now, :destination, :receiver,
        :trace_context)
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING

-- name: insert_entries @postgres
-- A batch of new pending entries in one statement (:entries, a JSON array of insert_entry's
-- values by name, times as ISO text): as insert_entry, only the idempotency key may
-- conflict (a key stored already, or given twice: that row is not inserted). The ids
-- inserted come back.
INSERT INTO delivery_queue
    (id, channel, recipient, subject_user_id, payload, idempotency_key, status, attempts,
     next_attempt_at, lease_until, enqueued_at, updated_at, destination, receiver,
     trace_context)
SELECT e.id, e.channel, e.recipient, e.subject_user_id, e.payload, e.idempotency_key,
       e.status, e.attempts, e.next_attempt_at, e.lease_until, e.now, e.now, e.destination,
       e.receiver, e.trace_context
FROM jsonb_to_recordset(CAST(:entries AS jsonb)) AS e(
    id text, channel text, recipient text, subject_user_id text, payload jsonb,
    idempotency_key text, status text, attempts integer, next_attempt_at timestamptz,
    lease_until timestamptz, now timestamptz, destination text, receiver text,
    trace_context text)
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id

-- name: insert_entries @sqlite
-- (WHERE true: SQLite reads an upsert after INSERT ... SELECT only behind a WHERE.) The
-- times come as the store writes them (fixed width, so text order is time order).
INSERT INTO delivery_queue
    (id, channel, recipient, subject_user_id, payload, idempotency_key, status, attempts,
     next_attempt_at, lease_until, enqueued_at, updated_at, destination, receiver,
     trace_context)
SELECT json_extract(value, '$.id'), json_extract(value, '$.channel'),
       json_extract(value, '$.recipient'), json_extract(value, '$.subject_user_id'),
       json_extract(value, '$.payload'), json_extract(value, '$.idempotency_key'),
       json_extract(value, '$.status'), json_extract(value, '$.attempts'),
       replace(json_extract(value, '$.next_attempt_at'), 'T', ' '),
       replace(json_extract(value, '$.lease_until'), 'T', ' '),
       replace(json_extract(value, '$.now'), 'T', ' '),
       replace(json_extract(value, '$.now'), 'T', ' '),
       json_extract(value, '$.destination'), json_extract(value, '$.receiver'),
       json_extract(value, '$.trace_context')
FROM json_each(:entries) WHERE true
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id

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

-- name: queue_turn @postgres
-- First in every transaction that changes many queued entries at once (a claim, the
-- lapsed leases' recovery, the expiry, setting aside, a disable's or a pause's end): they
-- take the queue one at a time, each statement reading it as the last one left it. Two
-- such statements never lock the same entries in different orders (a deadlock, one of
-- them aborted), and a claim never reaches for entries another claim just took.
SELECT pg_advisory_xact_lock(hashtextextended('sluice.delivery_queue', 0))

-- name: queue_turn @sqlite
-- A writing transaction has the whole database to itself already.
SELECT 1

-- name: claim @postgres
-- One statement: due pending entries whose destination and receiver let them go now
-- (not paused; not disabled unless an operator restarted the entry since; the receiver's
-- rate slot and provider's wait passed; a failing receiver only when its probe is due),
-- served in turns: each receiver's first entry, then each one's second, and so on, up to
-- a share of a receiver: :per_round, or more when fewer receivers wait than :limit
-- (ceil(:limit / receivers waiting), so a lone backlog goes :limit at a time), and one of
-- a failing receiver (its probe) or of one paced within the last minute. Receivers after
-- :after come first, so a claim smaller than the receivers waiting goes round them all.
-- Bounded by the index on (receiver, next_attempt_at), not by the entries due: the walk
-- skips from one receiver with pending entries to the next (one index probe each, however
-- long its backlog), reads at most :limit claimable entries of each, and the first :limit
-- receivers with one (in walk order) are those waiting. What cannot go now is never
-- claimed, so a backlog that waits costs one probe a claim.
WITH RECURSIVE ahead(receiver) AS (
    SELECT (SELECT min(receiver) FROM delivery_queue
            WHERE status = 'pending' AND held_by IS NULL AND receiver > :after)
  UNION ALL
    SELECT (SELECT min(q.receiver) FROM delivery_queue q
            WHERE q.status = 'pending' AND q.held_by IS NULL AND q.receiver > a.receiver)
    FROM ahead a WHERE a.receiver IS NOT NULL
), behind(receiver) AS (
    SELECT (SELECT min(receiver) FROM delivery_queue
            WHERE status = 'pending' AND held_by IS NULL)
  UNION ALL
    SELECT (SELECT min(q.receiver) FROM delivery_queue q
            WHERE q.status = 'pending' AND q.held_by IS NULL AND q.receiver > b.receiver)
    FROM behind b WHERE b.receiver <= :after
), walk AS (
    SELECT receiver, 0 AS lap FROM ahead WHERE receiver IS NOT NULL
  UNION ALL
    SELECT receiver, 1 AS lap FROM behind WHERE receiver <= :after
), waiting AS MATERIALIZED (
    SELECT w.receiver, w.lap, e.ids,
           r.down_since IS NOT NULL OR r.ready_at > :paced_since AS slow
    FROM walk w
    LEFT JOIN LATERAL (  -- OFFSET 0: looked up a receiver at a time, as the walk comes
        SELECT * FROM delivery_destinations d WHERE d.key = w.receiver OFFSET 0) r ON true
    CROSS JOIN LATERAL (
        SELECT array_agg(s.id ORDER BY s.next_attempt_at, s.enqueued_at, s.id) AS ids
        FROM (
            SELECT q.id, q.next_attempt_at, q.enqueued_at
            FROM delivery_queue q
            LEFT JOIN delivery_destinations x
                   ON x.key = q.destination AND x.key <> q.receiver
            WHERE q.receiver = w.receiver AND q.status = 'pending'
              AND q.next_attempt_at <= :now AND q.held_by IS NULL
              AND (CAST(:channels AS jsonb) IS NULL
                   OR q.channel IN (SELECT jsonb_array_elements_text(CAST(:channels AS jsonb))))
              AND (r.disabled_at IS NULL OR q.restarted_at > r.disabled_at)
              AND (x.key IS NULL OR (
                    (x.paused_until IS NULL OR x.paused_until <= :now)
                AND (x.disabled_at IS NULL OR q.restarted_at > x.disabled_at)))
            ORDER BY q.next_attempt_at, q.enqueued_at, q.id
            LIMIT :limit
        ) s
    ) e
    WHERE e.ids IS NOT NULL
      AND (r.key IS NULL OR (
            (r.paused_until IS NULL OR r.paused_until <= :now)
        AND (r.ready_at IS NULL OR r.ready_at <= :now)
        AND (r.down_since IS NULL OR r.next_probe_at <= :now)))
    LIMIT :limit  -- in the walk's order, which every step above keeps: the walk stops here
), turns AS (
    SELECT w.receiver, w.lap, t.id, t.turn,
           CASE WHEN w.slow THEN 1
                ELSE greatest(:per_round, (:limit + n.waiting - 1) / n.waiting)
           END AS share
    FROM waiting w CROSS JOIN (SELECT count(*) AS waiting FROM waiting) n
    CROSS JOIN LATERAL unnest(w.ids) WITH ORDINALITY AS t(id, turn)
)
UPDATE delivery_queue
SET status = 'in_flight', attempts = attempts + 1, lease_until = :lease_until,
    next_attempt_at = :lease_until, request_left_at = NULL, updated_at = :now
WHERE status = 'pending' AND id = ANY (ARRAY(  -- = ANY (ARRAY(...)): by primary key
    SELECT id FROM turns WHERE turn <= share
    ORDER BY turn, lap, receiver
    LIMIT :limit
))
RETURNING *

-- name: probing @sqlite
-- In the claim's transaction: a failing receiver whose probe was claimed is not probed
-- again until the probe's lease ends (its outcome sets the next one).
UPDATE delivery_destinations SET next_probe_at = :lease_until, updated_at = :now
WHERE down_since IS NOT NULL AND key IN (SELECT value FROM json_each(:keys))

-- name: probing @postgres
UPDATE delivery_destinations SET next_probe_at = :lease_until, updated_at = :now
WHERE down_since IS NOT NULL AND key IN (SELECT jsonb_array_elements_text(CAST(:keys AS jsonb)))

-- name: claim @sqlite
-- As claim @postgres; without LATERAL, a receiver's first :limit claimable entries are
-- a correlated subquery's JSON array, and their turns are numbered within the receiver.
WITH RECURSIVE ahead(receiver) AS (
    SELECT (SELECT min(receiver) FROM delivery_queue
            WHERE status = 'pending' AND held_by IS NULL AND receiver > :after)
  UNION ALL
    SELECT (SELECT min(q.receiver) FROM delivery_queue q
            WHERE q.status = 'pending' AND q.held_by IS NULL AND q.receiver > a.receiver)
    FROM ahead a WHERE a.receiver IS NOT NULL
), behind(receiver) AS (
    SELECT (SELECT min(receiver) FROM delivery_queue
            WHERE status = 'pending' AND held_by IS NULL)
  UNION ALL
    SELECT (SELECT min(q.receiver) FROM delivery_queue q
            WHERE q.status = 'pending' AND q.held_by IS NULL AND q.receiver > b.receiver)
    FROM behind b WHERE b.receiver <= :after
), walk AS (
    SELECT receiver, 0 AS lap FROM ahead WHERE receiver IS NOT NULL
  UNION ALL
    SELECT receiver, 1 AS lap FROM behind WHERE receiver <= :after
), waiting AS (
    SELECT receiver, lap, ids, slow FROM (
        SELECT w.receiver, w.lap,
               r.down_since IS NOT NULL OR r.ready_at > :paced_since AS slow,
               (SELECT json_group_array(s.id) FROM (
                    SELECT q.id
                    FROM delivery_queue q
                    LEFT JOIN delivery_destinations x
                           ON x.key = q.destination AND x.key <> q.receiver
                    WHERE q.receiver = w.receiver AND q.status = 'pending'
                      AND q.next_attempt_at <= :now AND q.held_by IS NULL
                      AND (:channels IS NULL
                           OR q.channel IN (SELECT value FROM json_each(:channels)))
                      AND (r.disabled_at IS NULL OR q.restarted_at > r.disabled_at)
                      AND (x.key IS NULL OR (
                            (x.paused_until IS NULL OR x.paused_until <= :now)
                        AND (x.disabled_at IS NULL OR q.restarted_at > x.disabled_at)))
                    ORDER BY q.next_attempt_at, q.enqueued_at, q.id
                    LIMIT :limit) s) AS ids
        FROM walk w
        LEFT JOIN delivery_destinations r ON r.key = w.receiver
        WHERE r.key IS NULL OR (
                (r.paused_until IS NULL OR r.paused_until <= :now)
            AND (r.ready_at IS NULL OR r.ready_at <= :now)
            AND (r.down_since IS NULL OR r.next_probe_at <= :now))
    )
    WHERE ids <> '[]'
    LIMIT :limit  -- in the walk's order: the walk stops here
), turns AS (
    SELECT w.receiver, w.lap, q.id,
           row_number() OVER (PARTITION BY w.receiver
                              ORDER BY q.next_attempt_at, q.enqueued_at, q.id) AS turn,
           CASE WHEN w.slow THEN 1
                ELSE max(:per_round, (:limit + n.waiting - 1) / n.waiting) END AS share
    FROM waiting w
    CROSS JOIN (SELECT count(*) AS waiting FROM waiting) n
    JOIN json_each(w.ids) j
    JOIN delivery_queue q ON q.id = j.value
)
UPDATE delivery_queue
SET status = 'in_flight', attempts = attempts + 1, lease_until = :lease_until,
    next_attempt_at = :lease_until, request_left_at = NULL, updated_at = :now
WHERE status = 'pending' AND id IN (
    SELECT id FROM turns WHERE turn <= share
    ORDER BY turn, lap, receiver
    LIMIT :limit
)
RETURNING *

-- name: requests_left @postgres
-- The requests of a batch of claimed attempts are about to leave (:entries, a JSON array
-- of [id, attempts]), in one statement: from here a lapsed lease is unknown. Not for an
-- entry whose destination or receiver an operator paused or disabled meanwhile: the
-- state rows are read by this statement, so nothing leaves for a destination once its
-- pause or disable is answered. The ids marked come back.
UPDATE delivery_queue q SET request_left_at = :now, unsent_lapses = 0
FROM jsonb_array_elements(CAST(:entries AS jsonb)) e
WHERE q.id = e ->> 0 AND q.status = 'in_flight' AND q.attempts = CAST(e ->> 1 AS integer)
  AND NOT EXISTS (
      SELECT 1 FROM delivery_destinations d
      WHERE d.key IN (q.destination, q.receiver)
        AND (d.paused_until > :now
             OR (d.disabled_at IS NOT NULL AND (q.restarted_at IS NULL
                                                OR q.restarted_at <= d.disabled_at))))
RETURNING q.id

-- name: requests_left @sqlite
UPDATE delivery_queue SET request_left_at = :now, unsent_lapses = 0
FROM json_each(:entries) AS e
WHERE delivery_queue.id = json_extract(e.value, '$[0]')
  AND delivery_queue.status = 'in_flight'
  AND delivery_queue.attempts = json_extract(e.value, '$[1]')
  AND NOT EXISTS (
      SELECT 1 FROM delivery_destinations d
      WHERE d.key IN (delivery_queue.destination, delivery_queue.receiver)
        AND (d.paused_until > :now
             OR (d.disabled_at IS NOT NULL AND (delivery_queue.restarted_at IS NULL
                                                OR delivery_queue.restarted_at <= d.disabled_at))))
RETURNING delivery_queue.id

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

-- name: ack @postgres
-- Acknowledged, after their sends returned: the entries of :entries (a JSON array of
-- [id, attempts, platform message id, duration ms]) in one statement, each still the
-- attempt it claimed. The ids acked come back.
UPDATE delivery_queue q
SET status = 'acked', platform_message_id = e ->> 2, duration_ms = CAST(e ->> 3 AS integer),
    lease_until = NULL, last_error = NULL, held_by = NULL, acked_at = :now, updated_at = :now
FROM jsonb_array_elements(CAST(:entries AS jsonb)) e
WHERE q.id = e ->> 0 AND q.status = 'in_flight' AND q.attempts = CAST(e ->> 1 AS integer)
RETURNING q.id

-- name: ack @sqlite
UPDATE delivery_queue
SET status = 'acked', platform_message_id = json_extract(e.value, '$[2]'),
    duration_ms = json_extract(e.value, '$[3]'), lease_until = NULL, last_error = NULL,
    held_by = NULL, acked_at = :now, updated_at = :now
FROM json_each(:entries) AS e
WHERE delivery_queue.id = json_extract(e.value, '$[0]') AND delivery_queue.status = 'in_flight'
  AND delivery_queue.attempts = json_extract(e.value, '$[1]')
RETURNING delivery_queue.id

-- name: nack
UPDATE delivery_queue
SET status = 'pending', next_attempt_at = :next_attempt_at, lease_until = NULL,
    last_error = :error, duration_ms = :duration_ms, held_by = NULL, updated_at = :now
WHERE id = :id AND status = 'in_flight' AND attempts = :attempts

-- name: nack_unknown
-- Sent, no answer: counted (attempt and unknown send), never failed; pending again only
-- when the policy allows one more send, else resting in 'unknown' for the operator.
UPDATE delivery_queue
SET status = :status, unknown_sends = unknown_sends + 1, next_attempt_at = :next_attempt_at,
    lease_until = NULL, last_error = :error, duration_ms = :duration_ms, held_by = NULL,
    updated_at = :now
WHERE id = :id AND status = 'in_flight' AND attempts = :attempts

-- name: fail
UPDATE delivery_queue
SET status = 'failed', last_error = :error, failure_reason = :reason, held_by = NULL,
    duration_ms = :duration_ms, lease_until = NULL, failed_at = :now, updated_at = :now
WHERE id = :id AND status = 'in_flight' AND attempts = :attempts

-- name: fail_given_back
-- Failed for good without counting the attempt it claimed: nothing judged the entry itself
-- (its destination is disabled, or failed for too long).
UPDATE delivery_queue
SET status = 'failed', attempts = attempts - 1, last_error = :error, failure_reason = :reason,
    held_by = NULL, duration_ms = :duration_ms, lease_until = NULL, request_left_at = NULL,
    failed_at = :now, updated_at = :now
WHERE id = :id AND status = 'in_flight' AND attempts = :attempts

-- name: release
-- Back to pending without counting the attempt it claimed: nothing judged this entry
-- (no adapter, the channel is down, the process is out of memory). last_error says why.
UPDATE delivery_queue
SET status = 'pending', attempts = attempts - 1, next_attempt_at = :next_attempt_at,
    lease_until = NULL, last_error = :error, held_by = :held_by, request_left_at = NULL,
    updated_at = :now
WHERE id = :id AND status = 'in_flight' AND attempts = :attempts

-- name: expire
-- Pending entries not delivered within the expiry: failed, reason expired, never deleted
-- here (pruning takes settled entries past the retention, like any failed entry). Nothing
-- whose destination or receiver is paused expires (the pause's end restarts its expiry).
UPDATE delivery_queue
SET status = 'failed', failure_reason = 'expired', failed_at = :now, updated_at = :now,
    last_error = 'expired: not delivered within ' || :expire_s || ' s'
        || CASE WHEN last_error IS NULL THEN '' ELSE '; last error: ' || last_error END
WHERE status = 'pending' AND COALESCE(started_at, enqueued_at) < :before
  AND NOT EXISTS (SELECT 1 FROM delivery_destinations d
                  WHERE d.key IN (delivery_queue.destination, delivery_queue.receiver)
                    AND d.paused_until > :now)
RETURNING receiver

-- name: expired_leases
-- Lapsed leases, a claim whole (its entries share its lease end, next_attempt_at while in
-- flight): every claim that ends among the first :limit lapsed entries. its_turn: no entry
-- of its claim still held comes before it in the order the drain sends a claim (enqueued_at,
-- id), so the sender reached it; those after it it never reached.
SELECT q.id, q.attempts, q.channel, q.unknown_sends, q.request_left_at, q.unsent_lapses,
       NOT EXISTS (
           SELECT 1 FROM delivery_queue p
           WHERE p.status = 'in_flight' AND p.next_attempt_at = q.next_attempt_at
             AND (p.enqueued_at < q.enqueued_at
                  OR (p.enqueued_at = q.enqueued_at AND p.id < q.id))) AS its_turn
FROM delivery_queue q
WHERE q.status = 'in_flight' AND q.next_attempt_at < :now
  AND q.next_attempt_at <= (
      SELECT max(page.next_attempt_at) FROM (
          SELECT next_attempt_at FROM delivery_queue
          WHERE status = 'in_flight' AND next_attempt_at < :now
          ORDER BY next_attempt_at LIMIT :limit) page)
ORDER BY q.next_attempt_at, q.enqueued_at, q.id

-- name: recover_lease
-- A lapsed lease whose request had left is a send that never reported back (the process
-- died or timed out): an unknown outcome, counted (:unknown 1); :status is pending when it
-- may be sent again, else unknown, so an entry that kills its sender every time cannot
-- loop. One whose request never left gives its attempt back (:given_back 1) and counts
-- an unsent lapse when its turn had come (:lapse 1); the policy fails the entry (:status
-- failed, :reason) at the limit.
UPDATE delivery_queue
SET status = :status, unknown_sends = unknown_sends + :unknown,
    attempts = attempts - :given_back, unsent_lapses = unsent_lapses + :lapse,
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
  AND (CAST(:destination AS text) IS NULL OR destination = :destination
       OR receiver = :destination)
ORDER BY enqueued_at DESC, id
LIMIT :limit

-- name: restart @sqlite
-- Every operator restart (redrive, send again, a replay): one statement resets what the
-- schedule and the expiry read, so an entry restarted after weeks is sent, on a new count.
-- :ids (a JSON array, a replay's batch), :id and :channel narrow it when given.
UPDATE delivery_queue
SET status = 'pending', attempts = 0, unknown_sends = 0, next_attempt_at = :now,
    started_at = :now, restarted_at = :now, lease_until = NULL, held_by = NULL, request_left_at = NULL,
    unsent_lapses = 0,
    last_error = NULL, failed_at = NULL, failure_reason = NULL, updated_at = :now
WHERE status = :from_status
  AND (CAST(:id AS text) IS NULL OR id = :id)
  AND (CAST(:channel AS text) IS NULL OR channel = :channel)
  AND (:ids IS NULL OR id IN (SELECT value FROM json_each(:ids)))
  AND (CAST(:destination AS text) IS NULL OR destination = :destination
       OR receiver = :destination)

-- name: restart @postgres
UPDATE delivery_queue
SET status = 'pending', attempts = 0, unknown_sends = 0, next_attempt_at = :now,
    started_at = :now, restarted_at = :now, lease_until = NULL, held_by = NULL, request_left_at = NULL,
    unsent_lapses = 0,
    last_error = NULL, failed_at = NULL, failure_reason = NULL, updated_at = :now
WHERE status = :from_status
  AND (CAST(:id AS text) IS NULL OR id = :id)
  AND (CAST(:channel AS text) IS NULL OR channel = :channel)
  AND (CAST(:ids AS jsonb) IS NULL  -- = ANY (ARRAY(...)): the primary key finds a batch
       OR id = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:ids AS jsonb)))))
  AND (CAST(:destination AS text) IS NULL OR destination = :destination
       OR receiver = :destination)

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
-- One page of a replay's window: the settled entries of :key (the destination or the
-- receiver they name) enqueued before :until (of :channel when given), after the last
-- page's (enqueued_at, id), the first page's being (:since, :after_id). Each side is one
-- range of its index (delivery_queue_destination_window_idx,
-- delivery_queue_receiver_window_idx), so a page reads the key's own entries and no
-- other's; a chat is its own receiver, so the two sides are merged by id.
SELECT * FROM delivery_queue
WHERE id IN (
    SELECT id FROM (
        SELECT id FROM delivery_queue
        WHERE destination = :key AND status IN ('acked', 'failed', 'unknown')
          AND (enqueued_at, id) > (:after_at, :after_id) AND enqueued_at < :until
          AND (CAST(:channel AS text) IS NULL OR channel = :channel)
        ORDER BY enqueued_at, id
        LIMIT :limit) AS of_destination
    UNION
    SELECT id FROM (
        SELECT id FROM delivery_queue
        WHERE receiver = :key AND status IN ('acked', 'failed', 'unknown')
          AND (enqueued_at, id) > (:after_at, :after_id) AND enqueued_at < :until
          AND (CAST(:channel AS text) IS NULL OR channel = :channel)
        ORDER BY enqueued_at, id
        LIMIT :limit) AS of_receiver)
ORDER BY enqueued_at, id
LIMIT :limit

-- name: purge
DELETE FROM delivery_queue WHERE id = :id AND status IN ('failed', 'unknown')

-- name: mark_delivered
UPDATE delivery_queue
SET status = 'acked', acked_at = :now, updated_at = :now, held_by = NULL,
    last_error = 'marked delivered by an operator; last error: ' || COALESCE(last_error, '')
WHERE id = :id AND status = 'unknown'

-- name: destinations_failing
SELECT * FROM delivery_destinations
WHERE down_since IS NOT NULL AND disabled_at IS NULL
ORDER BY down_since, key

-- name: destination_get
SELECT * FROM delivery_destinations WHERE key = :key

-- name: receiver_keys
-- The destinations view's receivers: the keys entries name as their receiver after
-- :after, in order, :limit of them, each found by one probe of delivery_queue_receiver_idx
-- (a skip scan), however many entries each has.
WITH RECURSIVE found(key, n) AS (
    SELECT (SELECT min(receiver) FROM delivery_queue WHERE receiver > CAST(:after AS text)), 1
    UNION ALL
    SELECT (SELECT min(receiver) FROM delivery_queue WHERE receiver > found.key), found.n + 1
    FROM found WHERE found.key IS NOT NULL AND found.n < :limit)
SELECT key FROM found WHERE key IS NOT NULL

-- name: destination_keys
-- ... and the keys Sluice holds a state for after :after, in order: every one, or those
-- that may be in :state (the view reads each row's state and keeps those that are).
SELECT key FROM delivery_destinations
WHERE key > CAST(:after AS text)
  AND (CAST(:state AS text) IS NULL
       OR (:state = 'failing' AND down_since IS NOT NULL)
       OR (:state = 'paused' AND paused_until > :now)
       OR (:state = 'disabled' AND disabled_at IS NOT NULL))
ORDER BY key
LIMIT :limit

-- name: prune_destinations
-- state-cleanup: the destination and receiver rows that hold nothing worth keeping (not
-- paused, disabled or failing, no rate override in force, no pace ahead), untouched since
-- :before, whose key no entry names any more (their entries pruned by the retention).
DELETE FROM delivery_destinations
WHERE key IN (
    SELECT d.key FROM delivery_destinations d
    WHERE d.updated_at < :before
      AND d.disabled_at IS NULL AND d.down_since IS NULL
      AND (d.paused_until IS NULL OR d.paused_until <= :now)
      AND (d.rate_until IS NULL OR d.rate_until <= :now)
      AND (d.ready_at IS NULL OR d.ready_at <= :now)
      AND NOT EXISTS (SELECT 1 FROM delivery_queue q WHERE q.destination = d.key)
      AND NOT EXISTS (SELECT 1 FROM delivery_queue q WHERE q.receiver = d.key)
    LIMIT :limit)

-- name: busiest_receivers
-- The console's busiest receivers: the most entries waiting or failed first.
SELECT receiver AS key FROM delivery_queue
WHERE status IN ('pending', 'failed')
GROUP BY receiver
ORDER BY count(*) DESC, receiver
LIMIT :limit

-- name: destinations_among @sqlite
SELECT * FROM delivery_destinations WHERE key IN (SELECT value FROM json_each(:keys))

-- name: destinations_among @postgres
-- = ANY (ARRAY(...)): the primary key finds them, however many rows the table holds
SELECT * FROM delivery_destinations
WHERE key = ANY (ARRAY(SELECT jsonb_array_elements_text(CAST(:keys AS jsonb))))

-- name: receiver_summary @sqlite
-- The destinations view, for the keys of :keys (a JSON array): per receiver (every entry
-- has one from its enqueue) and status, how many, one channel and recipient that go there
-- (its rates), and its last delivery.
SELECT receiver AS key, status, count(*) AS n, min(channel) AS channel,
       min(recipient) AS recipient, max(acked_at) AS last_acked
FROM delivery_queue
WHERE receiver IN (SELECT value FROM json_each(:keys))
GROUP BY receiver, status

-- name: receiver_summary @postgres
SELECT receiver AS key, status, count(*) AS n, min(channel) AS channel,
       min(recipient) AS recipient, max(acked_at) AS last_acked
FROM delivery_queue
WHERE receiver IN (SELECT jsonb_array_elements_text(:keys))
GROUP BY receiver, status

-- name: destination_summary @sqlite
-- ... and per destination of :keys that is not a receiver itself (a webhook URL an
-- operator or a 410 disabled, paused or rated).
SELECT destination AS key, status, count(*) AS n, min(channel) AS channel,
       min(recipient) AS recipient, max(acked_at) AS last_acked
FROM delivery_queue
WHERE destination <> receiver AND destination IN (SELECT value FROM json_each(:keys))
GROUP BY destination, status

-- name: destination_summary @postgres
SELECT destination AS key, status, count(*) AS n, min(channel) AS channel,
       min(recipient) AS recipient, max(acked_at) AS last_acked
FROM delivery_queue
WHERE destination <> receiver AND destination IN (SELECT jsonb_array_elements_text(:keys))
GROUP BY destination, status

-- name: receivers_waiting
-- Pending entries per failing receiver (what waits on it).
SELECT receiver AS key, count(*) AS n FROM delivery_queue
WHERE status = 'pending' AND receiver IN (SELECT key FROM delivery_destinations
                                          WHERE down_since IS NOT NULL AND disabled_at IS NULL)
GROUP BY receiver

-- name: paused_waiting
-- Pending entries whose destination or receiver is paused now.
SELECT count(*) AS n FROM delivery_queue q
WHERE q.status = 'pending' AND EXISTS (
    SELECT 1 FROM delivery_destinations d
    WHERE d.key IN (q.destination, q.receiver) AND d.paused_until > :now)

-- name: destination_failed_disabled
SELECT count(*) AS n FROM delivery_queue
WHERE (destination = :key OR receiver = :key) AND status = 'failed' AND failure_reason = 'destination_disabled'

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

-- name: destination_suspect
-- An entry's own failure (the receiver answered it): the receiver remembers the first such
-- entry of its streak; a second entry failing before a success makes it the receiver's.
INSERT INTO delivery_destinations (key, failures, suspect_entry, updated_at)
VALUES (:key, 0, :entry, :now)
ON CONFLICT (key) DO UPDATE
SET suspect_entry = COALESCE(delivery_destinations.suspect_entry, excluded.suspect_entry),
    updated_at = excluded.updated_at

-- name: give_back_attempt
-- The answered failure that began a receiver's streak turned out to be the receiver's (a
-- second entry failed before any success): the attempt it counted is given back.
UPDATE delivery_queue SET attempts = attempts - 1, updated_at = :now
WHERE id = :id AND status = 'pending' AND attempts > 0

-- name: destination_paced
-- No rate slot for the receiver before :until, or the provider asked to wait until then:
-- nothing of it is claimed before (a failing receiver's next probe waits for it too).
INSERT INTO delivery_destinations (key, failures, ready_at, updated_at)
VALUES (:key, 0, :until, :now)
ON CONFLICT (key) DO UPDATE
SET ready_at = CASE WHEN delivery_destinations.ready_at IS NULL
                         OR delivery_destinations.ready_at < excluded.ready_at
                    THEN excluded.ready_at ELSE delivery_destinations.ready_at END,
    next_probe_at = CASE WHEN delivery_destinations.down_since IS NULL
                         THEN delivery_destinations.next_probe_at
                         ELSE excluded.ready_at END,
    updated_at = excluded.updated_at

-- name: next_ready
-- The earliest moment a receiver whose due entries wait only for its rate may send again:
-- a drain with nothing else to claim waits for it within its budget.
SELECT min(r.ready_at) AS at FROM delivery_destinations r
WHERE r.ready_at > :now AND r.down_since IS NULL AND r.disabled_at IS NULL
  AND (r.paused_until IS NULL OR r.paused_until <= :now)
  AND EXISTS (SELECT 1 FROM delivery_queue q
              WHERE q.status = 'pending' AND q.receiver = r.key AND q.held_by IS NULL
                AND q.next_attempt_at <= r.ready_at)

-- name: destination_up
-- With unhold, in one transaction: a destination that is up holds nothing; its row keeps
-- what an operator set and when it last took an entry.
UPDATE delivery_destinations
SET down_since = NULL, failures = 0, next_probe_at = NULL, suspect_entry = NULL, last_success_at = :now,
    updated_at = :now
WHERE key = :key

-- The entries of one destination, for an operator's change or a disable: those the drain
-- has seen (destination, or held_by naming it) and those not yet seen for a recipient it
-- has (same channel and recipient as one of its entries).

-- name: destination_entries
-- The entries of one destination or receiver (an operator's change, its preview).
SELECT status, count(*) AS n FROM delivery_queue
WHERE status IN ('pending', 'in_flight') AND (destination = :key OR receiver = :key)
GROUP BY status

-- name: fail_destination
-- Disabled: its pending entries fail at once, attempts untouched, nothing sent (those an
-- operator restarted after :disabled_at go once, as asked): redriven (or sent again) once
-- it is enabled. Their effect records stay as they are.
UPDATE delivery_queue
SET status = 'failed', failure_reason = 'destination_disabled', failed_at = :now,
    updated_at = :now, held_by = NULL, lease_until = NULL,
    last_error = 'not sent: destination ' || :key || ' is disabled: ' || :reason
        || CASE WHEN last_error IS NULL THEN '' ELSE '; last error: ' || last_error END
WHERE status = 'pending' AND (destination = :key OR receiver = :key)
  AND (restarted_at IS NULL OR restarted_at <= :disabled_at)

-- name: disabled_with_pending
-- The disabled destinations and receivers that pending entries still name.
SELECT d.key, d.disabled_at, d.disabled_reason FROM delivery_destinations d
WHERE d.disabled_at IS NOT NULL
  AND (EXISTS (SELECT 1 FROM delivery_queue q WHERE q.status = 'pending' AND q.destination = d.key)
       OR EXISTS (SELECT 1 FROM delivery_queue q WHERE q.status = 'pending' AND q.receiver = d.key))

-- name: restart_expiry
-- A pause ended (resumed, or its time came): its entries are due at once (a failing
-- receiver's still wait for its probe: the claim reads it) and their expiry is read from now.
UPDATE delivery_queue SET started_at = :now, next_attempt_at = :now, updated_at = :now
WHERE status = 'pending' AND (destination = :key OR receiver = :key)

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
  AND (CAST(:destination AS text) IS NULL OR destination = :destination
       OR receiver = :destination)
