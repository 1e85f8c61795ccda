-- Mirrors migrations/postgres/20261202000002_unfinished_created_index.sql.
-- The sweep reports the age of the oldest unfinished attempt after every pass; this keeps that
-- a single index probe however many unfinished rows a provider outage leaves behind.
CREATE INDEX payment_attempts_unfinished_created
    ON payment_attempts (created_at)
    WHERE status IN ('pending', 'requires_action');
