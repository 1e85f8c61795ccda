-- insert_pending (src/store/postgres.rs) as one function: the row that holds the operation, or
-- else the new pending row, in one round trip. As one plain statement (a CTE that reads, then
-- inserts when nothing was read) every call paid the executor start-up of the INSERT and of the
-- CTE's result store even when it only read: measured with pgbench on the same database, a
-- duplicate cost PostgreSQL 88 µs of CPU that way and 48 µs through this function, a new row
-- 302 µs and 146 µs. Each statement in a PL/pgSQL function keeps its own cached plan and runs
-- only when reached.
--
-- The caller tells "inserted now" from "existing" by the id: only the row it proposed has p_id.
CREATE FUNCTION insert_pending_attempt(
    p_id uuid, p_consumer text, p_operation_key text, p_amount_minor bigint, p_currency text,
    p_payment_method text, p_customer text, p_description text, p_metadata jsonb,
    p_fingerprint text, p_provider text, p_idempotency_key text, p_generation integer,
    p_now timestamptz, p_lease_owner uuid, p_lease_expires_at timestamptz,
    p_next_check_at timestamptz)
RETURNS SETOF payment_attempts
LANGUAGE plpgsql AS $$
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
            idempotency_key, generation, key_window_started_at, lease_owner,
            lease_expires_at, next_check_at, created_at, updated_at)
        VALUES (
            p_id, p_consumer, p_operation_key, 'charge', p_amount_minor, p_currency,
            p_payment_method, p_customer, p_description, p_metadata, p_fingerprint, 'pending',
            p_provider, p_idempotency_key, p_generation, p_now, p_lease_owner,
            p_lease_expires_at, p_next_check_at, p_now, p_now)
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
