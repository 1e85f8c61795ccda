-- Issue 14: no clock, outage or configuration change may keep a key window open or change what
-- is re-sent under a key.
--
-- * return_url: fixed when the row is written and sent with every create under its key, so a
--   changed configuration never alters a re-send (SEMANTICS.md invariant 10).
-- * create_sent_until: the end (database time) of the last lease under which a create could be
--   sent; with key_window_started_at it bounds the created range a lookup lists to seconds.
-- * create_replays_failure: the provider saved a failed answer for the key and replays it.
-- * lookup_cursor: a lookup's list position ('after:<id>' or 'complete'), so it resumes.
-- * action_started_at: when the row entered requires_action.
-- * review_history: reasons an operator cleared with `attempt recheck`, kept for the record.
ALTER TABLE payment_attempts
    ADD COLUMN return_url TEXT,
    ADD COLUMN create_sent_until TIMESTAMPTZ,
    ADD COLUMN create_replays_failure BOOLEAN NOT NULL DEFAULT false,
    ADD COLUMN lookup_cursor TEXT,
    ADD COLUMN action_started_at TIMESTAMPTZ,
    ADD COLUMN review_history TEXT;

-- Rows written before: every create under their key was sent inside the safe window.
UPDATE payment_attempts SET action_started_at = created_at WHERE status = 'requires_action';

-- insert_pending now reads the database's clock itself: the key window starts at the earliest of
-- the caller's and the database's readings, and the lease and the first check are counted from
-- the database's reading at the moment the row is written (not from before the caller waited
-- for a pooled connection). p_shift_us moves the database's reading with the whole system's
-- clock in tests (zero in the service).
DROP FUNCTION insert_pending_attempt(
    uuid, text, text, bigint, text, text, text, text, jsonb, text, text, text, integer,
    timestamptz, uuid, timestamptz, timestamptz);

CREATE FUNCTION insert_pending_attempt(
    p_id uuid, p_consumer text, p_operation_key text, p_amount_minor bigint, p_currency text,
    p_payment_method text, p_customer text, p_description text, p_metadata jsonb,
    p_fingerprint text, p_provider text, p_idempotency_key text, p_generation integer,
    p_process_now timestamptz, p_shift_us bigint, p_lease_owner uuid, p_lease_us bigint,
    p_grace_us bigint, p_return_url text)
RETURNS SETOF payment_attempts
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := now() + p_shift_us * interval '1 microsecond';
BEGIN
    RETURN QUERY
        SELECT * FROM payment_attempts
        WHERE consumer = p_consumer AND operation_key = p_operation_key;
    IF FOUND THEN
        RETURN;
    END IF;
    RETURN QUERY
        INSERT INTO payment_attempts (
            id, consumer, operation_key, kind, amount_minor, currency, payment_method,
            customer, description, metadata, fingerprint, status, provider,
            idempotency_key, generation, key_window_started_at, create_sent_until, return_url,
            lease_owner, lease_expires_at, next_check_at, created_at, updated_at)
        VALUES (
            p_id, p_consumer, p_operation_key, 'charge', p_amount_minor, p_currency,
            p_payment_method, p_customer, p_description, p_metadata, p_fingerprint, 'pending',
            p_provider, p_idempotency_key, p_generation, LEAST(p_process_now, v_now),
            v_now + p_lease_us * interval '1 microsecond', p_return_url, p_lease_owner,
            v_now + p_lease_us * interval '1 microsecond',
            v_now + p_grace_us * interval '1 microsecond', v_now, v_now)
        ON CONFLICT DO NOTHING
        RETURNING *;
    IF FOUND THEN
        RETURN;
    END IF;
    -- A concurrent insert of the operation committed after the first SELECT's snapshot; the
    -- INSERT waited for it and did nothing. This statement's new snapshot sees that row.
    RETURN QUERY
        SELECT * FROM payment_attempts
        WHERE consumer = p_consumer AND operation_key = p_operation_key;
END
$$;
