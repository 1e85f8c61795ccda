-- Issue 15, events and reports. The webhook inbox and the report staging are PostgreSQL only;
-- the guard on payment_attempts has its SQLite twin.
--
-- * A succeeded attempt never leaves succeeded (SEMANTICS invariant 8), with one exception:
--   a refund the provider reported failed after it had succeeded moves to failed, and only with
--   failed_after_success_at set. The guarded updates already say so; this trigger makes the
--   table refuse any other move whoever writes it.
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
CREATE INDEX report_provider_refunds_attempt ON report_provider_refunds (run_id, attempt_id);

ALTER TABLE report_rows
    ADD COLUMN ours_refunded_minor BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN refunds JSONB NOT NULL DEFAULT '{}'::jsonb;

CREATE FUNCTION payment_attempts_keep_succeeded() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status = 'succeeded' AND NEW.status <> 'succeeded'
       AND NOT (OLD.kind = 'refund' AND NEW.kind = 'refund' AND NEW.status = 'failed'
                AND NEW.failed_after_success_at IS NOT NULL) THEN
        RAISE EXCEPTION 'attempt % is succeeded: only a refund the provider failed may leave succeeded', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER payment_attempts_keep_succeeded
    BEFORE UPDATE OF status ON payment_attempts
    FOR EACH ROW EXECUTE FUNCTION payment_attempts_keep_succeeded();
