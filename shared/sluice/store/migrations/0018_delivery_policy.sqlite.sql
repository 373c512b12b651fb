-- One delivery policy (shared/sluice/delivery/policy.py).
--
-- request_left_at: set when the request of the claimed attempt leaves (cleared by every
-- claim and release), so a lapsed lease tells a send that may have happened (unknown,
-- counted) from one that never started (the attempt given back).
-- unsent_lapses: leases that lapsed in a row before the request left (a sender killed
-- between the claim and the send): the attempt is given back each time, and the fifth
-- fails the entry (lease_lost), so an entry that kills its sender cannot stall the queue.
-- started_at: what expiry reads, the enqueue or the operator's last restart (redrive,
-- send again); NULL reads enqueued_at, which stays the entry's first enqueue.
ALTER TABLE delivery_queue ADD COLUMN request_left_at timestamptz NULL;
ALTER TABLE delivery_queue ADD COLUMN started_at timestamptz NULL;
ALTER TABLE delivery_queue ADD COLUMN unsent_lapses integer NOT NULL DEFAULT 0;

-- The claim reads due entries that wait on nothing; held entries (a failing destination,
-- an unconfigured channel) are out of this index, so a dead destination's backlog costs
-- the claim nothing. One probe a step takes the oldest entry a destination holds.
CREATE INDEX IF NOT EXISTS delivery_queue_due_idx
    ON delivery_queue (next_attempt_at, enqueued_at, id)
    WHERE status = 'pending' AND held_by IS NULL;
CREATE INDEX IF NOT EXISTS delivery_queue_held_due_idx
    ON delivery_queue (held_by, enqueued_at, id)
    WHERE status = 'pending' AND held_by IS NOT NULL;

-- Entries held by a destination that is no longer failing were claimable before; they
-- would now wait for a probe that never comes.
UPDATE delivery_queue SET held_by = NULL
WHERE status = 'pending' AND held_by IS NOT NULL
  AND held_by NOT IN (SELECT key FROM delivery_destinations);
