-- A webhook's destination key always names its port (shared/sluice/delivery/destinations.py,
-- webhook_receiver): webhook:<host>:443 for https://<host>/ as for https://<host>:443/, where
-- the key was webhook:<host>: when the URL named no port, so one receiver was two
-- destinations (two states, two rate limits, two pauses).
--
-- The entries: an old key takes the port of its entry's own URL's scheme (https 443, http
-- 80); recipients are stored canonical (lower-case scheme and host, IDNA, no trailing dot),
-- so only the port differs between the two forms. (SQLite: the same statements, its own
-- spelling of the later of two times.)
UPDATE delivery_queue
SET destination = destination
    || CASE WHEN lower(recipient) LIKE 'http://%' THEN '80' ELSE '443' END
WHERE channel = 'webhook' AND destination LIKE 'webhook:%:';
UPDATE delivery_queue
SET held_by = held_by || CASE WHEN lower(recipient) LIKE 'http://%' THEN '80' ELSE '443' END
WHERE channel = 'webhook' AND held_by LIKE 'webhook:%:';

-- The destinations: an old key moves to the key its entries now have, 80 when they are all
-- http, else 443 (https, and when no entry tells). When that key has a row of its own, the
-- two become one, the more restrictive kept: disabled over paused over ok (the disabled
-- one's time and reason), the later pause end (with its start), the failing one's probe
-- state (the longer failing when both fail), the slower rate override, the later success.
CREATE TEMP TABLE destination_keys_0027 AS
SELECT d.key AS old_key,
       d.key || CASE WHEN EXISTS (SELECT 1 FROM delivery_queue q
                                  WHERE q.destination = d.key || '80')
                      AND NOT EXISTS (SELECT 1 FROM delivery_queue q
                                      WHERE q.destination = d.key || '443')
                     THEN '80' ELSE '443' END AS new_key
FROM delivery_destinations d
WHERE d.key LIKE 'webhook:%:';

CREATE TEMP TABLE destinations_0027 AS
SELECT t.key,
       CASE WHEN t.down_since IS NULL OR o.down_since < t.down_since
            THEN o.down_since ELSE t.down_since END AS down_since,
       CASE WHEN t.down_since IS NULL OR o.down_since < t.down_since
            THEN o.failures ELSE t.failures END AS failures,
       CASE WHEN t.down_since IS NULL OR o.down_since < t.down_since
            THEN coalesce(o.last_error, t.last_error) ELSE t.last_error END AS last_error,
       CASE WHEN t.down_since IS NULL OR o.down_since < t.down_since
            THEN o.next_probe_at ELSE t.next_probe_at END AS next_probe_at,
       CASE WHEN t.updated_at IS NULL OR o.updated_at > t.updated_at
            THEN o.updated_at ELSE t.updated_at END AS updated_at,
       CASE WHEN o.paused_until > t.paused_until OR t.paused_until IS NULL
            THEN o.paused_until ELSE t.paused_until END AS paused_until,
       CASE WHEN o.paused_until > t.paused_until OR t.paused_until IS NULL
            THEN o.paused_at ELSE t.paused_at END AS paused_at,
       coalesce(t.disabled_at, o.disabled_at) AS disabled_at,
       CASE WHEN t.disabled_at IS NOT NULL THEN t.disabled_reason
            ELSE o.disabled_reason END AS disabled_reason,
       CASE WHEN t.rate_limit IS NULL OR o.rate_limit / o.rate_period_s
                                         < t.rate_limit / t.rate_period_s
            THEN coalesce(o.rate_limit, t.rate_limit) ELSE t.rate_limit END AS rate_limit,
       CASE WHEN t.rate_limit IS NULL OR o.rate_limit / o.rate_period_s
                                         < t.rate_limit / t.rate_period_s
            THEN coalesce(o.rate_period_s, t.rate_period_s)
            ELSE t.rate_period_s END AS rate_period_s,
       CASE WHEN t.rate_limit IS NULL OR o.rate_limit / o.rate_period_s
                                         < t.rate_limit / t.rate_period_s
            THEN coalesce(o.rate_until, t.rate_until) ELSE t.rate_until END AS rate_until,
       CASE WHEN t.last_success_at IS NULL OR o.last_success_at > t.last_success_at
            THEN o.last_success_at ELSE t.last_success_at END AS last_success_at
FROM destination_keys_0027 m
JOIN delivery_destinations o ON o.key = m.old_key
JOIN delivery_destinations t ON t.key = m.new_key;

DELETE FROM delivery_destinations
WHERE key IN (SELECT key FROM destinations_0027)
   OR key IN (SELECT old_key FROM destination_keys_0027
              WHERE new_key IN (SELECT key FROM destinations_0027));
INSERT INTO delivery_destinations (key, down_since, failures, last_error, next_probe_at,
                                   updated_at, paused_until, paused_at, disabled_at,
                                   disabled_reason, rate_limit, rate_period_s, rate_until,
                                   last_success_at)
SELECT key, down_since, failures, last_error, next_probe_at, updated_at, paused_until,
       paused_at, disabled_at, disabled_reason, rate_limit, rate_period_s, rate_until,
       last_success_at
FROM destinations_0027;
UPDATE delivery_destinations
SET key = (SELECT new_key FROM destination_keys_0027 WHERE old_key = delivery_destinations.key)
WHERE key IN (SELECT old_key FROM destination_keys_0027);

-- A host's rate slots under the old key (webhook:host:<host>:) are seconds ahead at most:
-- dropped, the canonical key's slots are the ones taken from now on.
DELETE FROM delivery_rate_limits WHERE key LIKE 'webhook:host:%:';
DROP TABLE destinations_0027;
DROP TABLE destination_keys_0027;
