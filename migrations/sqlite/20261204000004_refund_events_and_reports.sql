-- Twin of the PostgreSQL migration of the same name: a succeeded attempt never leaves
-- succeeded, except a refund the provider reported failed after it had succeeded, and only
-- with failed_after_success_at set. (The webhook inbox and report staging changes of that
-- migration have no SQLite counterpart: webhooks and reports are PostgreSQL only.)
CREATE TRIGGER payment_attempts_keep_succeeded
    BEFORE UPDATE OF status ON payment_attempts
    WHEN OLD.status = 'succeeded' AND NEW.status <> 'succeeded'
         AND NOT (OLD.kind = 'refund' AND NEW.kind = 'refund' AND NEW.status = 'failed'
                  AND NEW.failed_after_success_at IS NOT NULL)
BEGIN
    SELECT RAISE(ABORT, 'a succeeded attempt leaves succeeded only as a refund the provider failed');
END;
