-- The claim's own index: a receiver's claimable entries (pending, not set aside) in the
-- order the claim takes them. With the receiver fixed by equality, the claim reads its
-- first entries straight off this index whatever the table's statistics say; with
-- (receiver, next_attempt_at) the planner could prefer the queue-wide due index when its
-- statistics were stale (after a bulk enqueue) and filter every due entry of every other
-- receiver, once per receiver: a claim among 3,000 chats took 10 s. The walk from one
-- receiver to the next reads the same index, so a receiver whose entries are all set
-- aside is not walked.
DROP INDEX IF EXISTS delivery_queue_receiver_due_idx;
CREATE INDEX IF NOT EXISTS delivery_queue_claim_idx
    ON delivery_queue (receiver, next_attempt_at, enqueued_at, id)
    WHERE status = 'pending' AND held_by IS NULL;
