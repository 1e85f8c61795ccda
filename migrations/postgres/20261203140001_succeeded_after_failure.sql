-- Issue 14: the provider may report money moved for an attempt chargeguard answered failed (a
-- declined PaymentIntent confirmed again later). The event flags the attempt ('flagged'), and
-- review reasons accumulate: a later reason never hides an earlier one.
ALTER TABLE webhook_inbox DROP CONSTRAINT webhook_inbox_outcome_check;
ALTER TABLE webhook_inbox ADD CONSTRAINT webhook_inbox_outcome_check CHECK (outcome IN (
    'applied', 'duplicate', 'stale', 'unknown_object', 'conflict', 'unreadable', 'flagged'));

-- earlier + '; ' + reason. A reason already present is not added again (a redelivered or
-- distinct duplicate event repeats its text), and the whole stays under 8192 characters: past
-- that the row keeps what it has (it is flagged already; the inbox row's detail holds the new
-- reason).
CREATE FUNCTION append_review_reason(earlier text, reason text)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN reason IS NULL OR reason = '' THEN earlier
        WHEN earlier IS NULL OR earlier = '' THEN left(reason, 8192)
        WHEN position(reason IN earlier) > 0 THEN earlier
        WHEN length(earlier) + 2 + length(reason) > 8192 THEN earlier
        ELSE earlier || '; ' || reason
    END
$$;
