-- Issue 16: attempt n + 1 of an operation, written only when the rule allows it, in the same
-- statement that checks the rule (so two concurrent callers can never create attempt n + 1
-- twice, or n + 1 and n + 2).
--
-- insert_pending_attempt keeps its signature; p_generation (attempt number - 1) now selects the
-- attempt:
-- 1. attempt n (this generation) exists: return it (duplicate, reconcile or mismatch, as before);
-- 2. a later attempt (generation > 0) needs the operation's latest earlier charge attempt, locked
--    FOR UPDATE so that a concurrent decision of it (a round's finish, a webhook) is waited for
--    and seen. It is returned, and nothing is written, when it is not the one just before, not
--    decided, succeeded, or flagged succeeded_after_failure; or when its intent is still payable
--    and the new attempt changes what a confirm cannot (amount, currency, customer): the caller
--    cancels that intent, records the cancel on it, and calls again. No earlier attempt: nothing
--    is returned (out of order). The store's `domain::admit` classifies what is returned by
--    the same rule.
-- 3. else insert; confirms_payment_id is the earlier attempt's intent when it is still payable
--    (not canceled), which this attempt confirms again with its own key and payment method.
DROP FUNCTION insert_pending_attempt(
    uuid, text, text, bigint, text, text, text, text, jsonb, text, text, text, integer,
    timestamptz, bigint, uuid, bigint, bigint, text);

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
    v_latest payment_attempts%ROWTYPE;
    v_confirms text;
BEGIN
    RETURN QUERY
        SELECT * FROM payment_attempts
        WHERE consumer = p_consumer AND operation_key = p_operation_key
          AND generation = p_generation;
    IF FOUND THEN
        RETURN;
    END IF;
    IF p_generation > 0 THEN
        SELECT * INTO v_latest FROM payment_attempts
        WHERE consumer = p_consumer AND operation_key = p_operation_key AND kind = 'charge'
          AND generation < p_generation
        ORDER BY generation DESC
        LIMIT 1
        FOR UPDATE;
        IF NOT FOUND THEN
            RETURN;
        END IF;
        IF v_latest.status <> 'failed'
           OR v_latest.generation <> p_generation - 1
           OR COALESCE(v_latest.review_reason, '') LIKE '%succeeded_after_failure%' THEN
            RETURN NEXT v_latest;
            RETURN;
        END IF;
        IF v_latest.provider_payment_id IS NOT NULL
           AND v_latest.provider_status IS DISTINCT FROM 'canceled' THEN
            IF v_latest.amount_minor <> p_amount_minor OR v_latest.currency <> p_currency
               OR v_latest.customer IS DISTINCT FROM p_customer THEN
                RETURN NEXT v_latest;
                RETURN;
            END IF;
            v_confirms := v_latest.provider_payment_id;
        END IF;
    END IF;
    RETURN QUERY
        INSERT INTO payment_attempts (
            id, consumer, operation_key, kind, amount_minor, currency, payment_method,
            customer, description, metadata, fingerprint, status, provider,
            idempotency_key, generation, confirms_payment_id, key_window_started_at,
            create_sent_until, return_url, lease_owner, lease_expires_at, next_check_at,
            created_at, updated_at)
        VALUES (
            p_id, p_consumer, p_operation_key, 'charge', p_amount_minor, p_currency,
            p_payment_method, p_customer, p_description, p_metadata, p_fingerprint, 'pending',
            p_provider, p_idempotency_key, p_generation, v_confirms, LEAST(p_process_now, v_now),
            v_now + p_lease_us * interval '1 microsecond', p_return_url, p_lease_owner,
            v_now + p_lease_us * interval '1 microsecond',
            v_now + p_grace_us * interval '1 microsecond', v_now, v_now)
        ON CONFLICT DO NOTHING
        RETURNING *;
    IF FOUND THEN
        RETURN;
    END IF;
    -- A concurrent insert of this attempt committed after the first SELECT's snapshot; the
    -- INSERT waited for it and did nothing. This statement's new snapshot sees that row.
    RETURN QUERY
        SELECT * FROM payment_attempts
        WHERE consumer = p_consumer AND operation_key = p_operation_key
          AND generation = p_generation;
END
$$;

-- A webhook for an intent finds the latest attempt naming it, by provider_payment_id or by
-- confirms_payment_id (an attempt that confirms it again and has no answer recorded yet).
CREATE INDEX payment_attempts_confirms_payment_id
    ON payment_attempts (confirms_payment_id)
    WHERE confirms_payment_id IS NOT NULL;

-- Reports: attempts of one operation are one business operation. A re-confirmed intent is
-- linked to the latest attempt that confirmed it; a succeeded attempt's row carries what the
-- other attempts of its operation hold (two succeeded attempts, or an earlier attempt's object
-- that is not canceled, is a double charge).
ALTER TABLE report_provider_payments DROP CONSTRAINT report_provider_payments_linked_by_check;
ALTER TABLE report_provider_payments ADD CONSTRAINT report_provider_payments_linked_by_check
    CHECK (linked_by IN ('metadata', 'provider_payment_id', 'confirms_payment_id'));
ALTER TABLE report_rows
    ADD COLUMN operation_succeeded_attempts INTEGER NOT NULL DEFAULT 0,
    ADD COLUMN operation_earlier_live_objects INTEGER NOT NULL DEFAULT 0;
