-- Issue 15, events and reports. PostgreSQL only: it changes the webhook inbox and the report
-- staging, not payment_attempts, so it has no SQLite twin (webhooks and reports are off there).
--
-- * Two inbox outcomes: 'failed_after_success' (the provider reported a succeeded refund
--   failed; the refund attempt moved to failed with failed_after_success_at) and 'disputed'
--   (a dispute flagged the charge attempt).
-- * Report staging: a provider refund's claimed refund attempt (by its chargeguard_attempt_id
--   metadata, else by the refund id a refund attempt recorded), and per row what we recorded of
--   the charge's refunds and what the provider lists, so the refund categories are classified
--   from the row alone.
ALTER TABLE webhook_inbox DROP CONSTRAINT webhook_inbox_outcome_check;
ALTER TABLE webhook_inbox ADD CONSTRAINT webhook_inbox_outcome_check CHECK (outcome IN (
    'applied', 'duplicate', 'stale', 'unknown_object', 'conflict', 'unreadable', 'flagged',
    'failed_after_success', 'disputed'));

ALTER TABLE report_provider_refunds ADD COLUMN attempt_id UUID;

ALTER TABLE report_rows
    ADD COLUMN ours_refunded_minor BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN refunds JSONB NOT NULL DEFAULT '{}'::jsonb;
