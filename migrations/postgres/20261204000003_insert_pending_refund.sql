-- Issue 15: a refund's pending row is written by one statement that also decides whether the
-- charge can give that much back, under the charge's row lock, so that two concurrent refunds
-- of one charge can never together exceed it.
--
-- insert_pending_refund returns the row that holds the refund operation (an earlier or a
-- concurrent call's; the caller compares fingerprints), or the new pending refund row leased to
-- the caller. A refund that cannot be made raises, and nothing is written:
--   CGR01 no such charge of this consumer            (NOT_FOUND)
--   CGR02 the charge is not succeeded                (DETAIL: '<charge id> <status>')
--   CGR03 nothing left to refund                     (DETAIL: '<charge id> <charged>')
--   CGR04 more than what is left                     (DETAIL: '<charge id> <requested> <left>')
-- What is left is the charged amount less the charge's refunds that are pending, awaiting action
-- or succeeded; a failed refund (also one that failed after it succeeded) gave nothing back.
-- p_amount_minor NULL means what is left. p_shift_us moves the database's reading with the
-- whole system's clock in tests (zero in the service).
CREATE FUNCTION insert_pending_refund(
    p_id uuid, p_consumer text, p_operation_key text, p_charge_id uuid,
    p_charge_operation_key text, p_amount_minor bigint, p_reason text, p_metadata jsonb,
    p_fingerprint text, p_provider text, p_idempotency_key text, p_process_now timestamptz,
    p_shift_us bigint, p_lease_owner uuid, p_lease_us bigint, p_grace_us bigint)
RETURNS SETOF payment_attempts
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := now() + p_shift_us * interval '1 microsecond';
    v_parent payment_attempts%ROWTYPE;
    v_held bigint;
    v_left bigint;
    v_amount bigint;
BEGIN
    RETURN QUERY
        SELECT * FROM payment_attempts
        WHERE consumer = p_consumer AND operation_key = p_operation_key
        ORDER BY generation DESC LIMIT 1;
    IF FOUND THEN
        RETURN;
    END IF;
    -- The charge, the caller's own only; by operation key the operation's succeeded attempt
    -- (else its latest, to say why it cannot be refunded). Locked until this statement's
    -- transaction ends: every refund of one charge passes here one at a time.
    IF p_charge_id IS NOT NULL THEN
        SELECT * INTO v_parent FROM payment_attempts
        WHERE id = p_charge_id AND consumer = p_consumer AND kind = 'charge'
        FOR UPDATE;
    ELSE
        SELECT * INTO v_parent FROM payment_attempts
        WHERE consumer = p_consumer AND operation_key = p_charge_operation_key
          AND kind = 'charge'
        ORDER BY (status = 'succeeded') DESC, generation DESC
        LIMIT 1
        FOR UPDATE;
    END IF;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'charge_not_found' USING ERRCODE = 'CGR01';
    END IF;
    -- A concurrent call for this refund operation held the lock before us and committed: its
    -- row is visible to this new statement.
    RETURN QUERY
        SELECT * FROM payment_attempts
        WHERE consumer = p_consumer AND operation_key = p_operation_key
        ORDER BY generation DESC LIMIT 1;
    IF FOUND THEN
        RETURN;
    END IF;
    IF v_parent.status <> 'succeeded' THEN
        RAISE EXCEPTION 'charge_not_succeeded'
            USING ERRCODE = 'CGR02', DETAIL = v_parent.id::text || ' ' || v_parent.status;
    END IF;
    SELECT COALESCE(sum(amount_minor), 0) INTO v_held FROM payment_attempts
    WHERE parent_attempt_id = v_parent.id
      AND status IN ('pending', 'requires_action', 'succeeded');
    v_left := v_parent.amount_minor - v_held;
    IF v_left <= 0 THEN
        RAISE EXCEPTION 'charge_fully_refunded'
            USING ERRCODE = 'CGR03', DETAIL = v_parent.id::text || ' ' || v_parent.amount_minor;
    END IF;
    v_amount := COALESCE(p_amount_minor, v_left);
    IF v_amount > v_left THEN
        RAISE EXCEPTION 'refund_exceeds_charge'
            USING ERRCODE = 'CGR04', DETAIL = v_parent.id::text || ' ' || v_amount || ' ' || v_left;
    END IF;
    RETURN QUERY
        INSERT INTO payment_attempts (
            id, consumer, operation_key, kind, parent_attempt_id, refund_reason, amount_minor,
            currency, payment_method, metadata, fingerprint, status, provider, idempotency_key,
            generation, key_window_started_at, create_sent_until, lease_owner, lease_expires_at,
            next_check_at, created_at, updated_at)
        VALUES (
            p_id, p_consumer, p_operation_key, 'refund', v_parent.id, p_reason, v_amount,
            v_parent.currency, v_parent.payment_method, p_metadata, p_fingerprint, 'pending',
            p_provider, p_idempotency_key, 0, LEAST(p_process_now, v_now),
            v_now + p_lease_us * interval '1 microsecond', p_lease_owner,
            v_now + p_lease_us * interval '1 microsecond',
            v_now + p_grace_us * interval '1 microsecond', v_now, v_now)
        ON CONFLICT DO NOTHING
        RETURNING *;
    IF FOUND THEN
        RETURN;
    END IF;
    -- The operation key was taken meanwhile by a call that did not pass this charge's lock (a
    -- charge, or a refund of another charge): its row, for the caller's fingerprint check.
    RETURN QUERY
        SELECT * FROM payment_attempts
        WHERE consumer = p_consumer AND operation_key = p_operation_key
        ORDER BY generation DESC LIMIT 1;
END
$$;
