-- The embedded twin of migrations/postgres/20261203000001_clock_safe_key_window.sql (instants
-- as integer microseconds, the flag as 0/1). SQLite has no stored function: its store reads
-- the clock in the INSERT itself.
ALTER TABLE payment_attempts ADD COLUMN return_url TEXT;
ALTER TABLE payment_attempts ADD COLUMN create_sent_until INTEGER;
ALTER TABLE payment_attempts ADD COLUMN create_replays_failure INTEGER NOT NULL DEFAULT 0
    CHECK (create_replays_failure IN (0, 1));
ALTER TABLE payment_attempts ADD COLUMN lookup_cursor TEXT;
ALTER TABLE payment_attempts ADD COLUMN action_started_at INTEGER;
ALTER TABLE payment_attempts ADD COLUMN review_history TEXT;

UPDATE payment_attempts SET action_started_at = created_at WHERE status = 'requires_action';
