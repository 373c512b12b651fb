-- Destinations as a first-class view (shared/sluice/delivery/destinations.py).
--
-- A row of delivery_destinations is no longer only a failing destination: it is any
-- destination Sluice holds a state for. down_since (with failures, next_probe_at) is set
-- while it fails, from its first transient failure until its next success; paused_until
-- while an operator pauses it (its entries wait, nothing counted, nothing expires);
-- disabled_at and disabled_reason once it is disabled (a 410, a chat gone, days failing
-- without a success, or an operator); rate_limit per rate_period_s seconds (1 or 60)
-- until rate_until, an operator's override of its rate. A destination state that lapses
-- (a pause, an override) needs no operator: readers compare with the time, and each drain
-- clears what has lapsed. Who changed it is in admin_audit, one row a change.
-- SQLite cannot drop a NOT NULL: the table is rebuilt, its rows kept.
CREATE TABLE delivery_destinations_0025 (
    key text PRIMARY KEY,
    down_since timestamptz NULL,
    failures integer NOT NULL DEFAULT 0,
    last_error text NULL,
    next_probe_at timestamptz NULL,
    updated_at timestamptz NOT NULL,
    paused_until timestamptz NULL,
    paused_at timestamptz NULL,
    disabled_at timestamptz NULL,
    disabled_reason text NULL,
    rate_limit double precision NULL,
    rate_period_s integer NULL,
    rate_until timestamptz NULL,
    last_success_at timestamptz NULL
);
INSERT INTO delivery_destinations_0025 (key, down_since, failures, last_error, next_probe_at,
                                        updated_at)
SELECT key, down_since, failures, last_error, next_probe_at, updated_at
FROM delivery_destinations;
DROP TABLE delivery_destinations;
ALTER TABLE delivery_destinations_0025 RENAME TO delivery_destinations;

-- The destination an entry goes to (its adapter's key), written by the drain the first
-- time it takes the entry: what the destinations view counts, the list filters on, and a
-- pause or a disable finds an entry by.
ALTER TABLE delivery_queue ADD COLUMN destination text NULL;
CREATE INDEX IF NOT EXISTS delivery_queue_destination_idx
    ON delivery_queue (destination, status) WHERE destination IS NOT NULL;
-- Entries held by a failing destination name it already.
UPDATE delivery_queue SET destination = held_by
WHERE held_by IS NOT NULL AND held_by NOT LIKE 'unconfigured:%';
