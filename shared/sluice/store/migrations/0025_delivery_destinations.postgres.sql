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
ALTER TABLE delivery_destinations ALTER COLUMN down_since DROP NOT NULL;
ALTER TABLE delivery_destinations ALTER COLUMN next_probe_at DROP NOT NULL;
ALTER TABLE delivery_destinations ALTER COLUMN failures SET DEFAULT 0;
ALTER TABLE delivery_destinations ADD COLUMN IF NOT EXISTS paused_until timestamptz NULL;
ALTER TABLE delivery_destinations ADD COLUMN IF NOT EXISTS paused_at timestamptz NULL;
ALTER TABLE delivery_destinations ADD COLUMN IF NOT EXISTS disabled_at timestamptz NULL;
ALTER TABLE delivery_destinations ADD COLUMN IF NOT EXISTS disabled_reason text NULL;
ALTER TABLE delivery_destinations ADD COLUMN IF NOT EXISTS rate_limit double precision NULL;
ALTER TABLE delivery_destinations ADD COLUMN IF NOT EXISTS rate_period_s integer NULL;
ALTER TABLE delivery_destinations ADD COLUMN IF NOT EXISTS rate_until timestamptz NULL;
ALTER TABLE delivery_destinations ADD COLUMN IF NOT EXISTS last_success_at timestamptz NULL;

-- The destination an entry goes to (its adapter's key), written by the drain the first
-- time it takes the entry: what the destinations view counts, the list filters on, and a
-- pause or a disable finds an entry by.
ALTER TABLE delivery_queue ADD COLUMN IF NOT EXISTS destination text NULL;
CREATE INDEX IF NOT EXISTS delivery_queue_destination_idx
    ON delivery_queue (destination, status) WHERE destination IS NOT NULL;
-- Entries held by a failing destination name it already.
UPDATE delivery_queue SET destination = held_by
WHERE held_by IS NOT NULL AND held_by NOT LIKE 'unconfigured:%';
