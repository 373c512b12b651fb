-- A replay (shared/sluice/delivery/replay.py) reads one destination's or receiver's settled
-- entries of a window, oldest first, a page at a time: one range of one of these indexes
-- a page, whatever the other destinations hold in the same window. They replace the
-- window index of every destination together (0026), which made a replay read them all.
CREATE INDEX IF NOT EXISTS delivery_queue_destination_window_idx
    ON delivery_queue (destination, enqueued_at, id)
    WHERE status IN ('acked', 'failed', 'unknown');
CREATE INDEX IF NOT EXISTS delivery_queue_receiver_window_idx
    ON delivery_queue (receiver, enqueued_at, id)
    WHERE status IN ('acked', 'failed', 'unknown');
DROP INDEX IF EXISTS delivery_queue_window_idx;
