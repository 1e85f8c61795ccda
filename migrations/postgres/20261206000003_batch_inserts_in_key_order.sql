-- Issue 21: two replicas' insert batches never deadlock on each other.
--
-- A batch inserts its rows one after another, and each INSERT of an operation whose row another
-- uncommitted transaction has just written waits for that transaction. Two replicas whose
-- batches hold the same operations in different orders (a queue delivering one event to both,
-- a retry racing the first call) could each write one operation and then wait for the other's:
-- PostgreSQL breaks that cycle only after deadlock_timeout (1 s by default) by failing one whole
-- batch (40P01), whose callers all hear "unavailable, retry". Every batch now writes its rows in
-- one order, by (consumer, operation_key) in byte order (COLLATE "C", which every database has),
-- so of two batches that meet on several operations the later one waits for the first and never
-- holds a row the first needs. A request's answer never depended on the order (each finds the
-- row of its own operation), and two requests of one operation still go in request order.
--
-- - insert_pending_first_attempts (first attempts, set-based) is restated with that order, and
--   skips its second query when the INSERT wrote a row for every request: then no request is
--   answered by a row the call did not write (one generation-0 row per operation), and the
--   lookups would only find the rows just written.
-- - insert_pending_attempts (new) is the row-by-row batch of any attempts, later ones included,
--   that src/store/postgres_group.rs sent as a statement of its own: one insert_pending_attempt
--   per row in the same order, each row with its request's ordinal.
CREATE OR REPLACE FUNCTION insert_pending_first_attempts(
    p_id uuid[], p_consumer text[], p_operation_key text[], p_amount_minor bigint[],
    p_currency text[], p_payment_method text[], p_customer text[], p_description text[],
    p_metadata jsonb[], p_fingerprint text[], p_provider text[], p_idempotency_key text[],
    p_process_now timestamptz[], p_shift_us bigint[], p_lease_owner uuid[], p_lease_us bigint[],
    p_grace_us bigint[], p_return_url text[])
RETURNS SETOF payment_attempts
LANGUAGE plpgsql
-- Planned once per connection, not per call (custom plans were 12 % of PostgreSQL's CPU per
-- charge in a profile of the benchmark).
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_written bigint;
BEGIN
    RETURN QUERY
        INSERT INTO payment_attempts (
            id, consumer, operation_key, kind, amount_minor, currency, payment_method,
            customer, description, metadata, fingerprint, status, provider,
            idempotency_key, generation, confirms_payment_id, key_window_started_at,
            create_sent_until, return_url, lease_owner, lease_expires_at, next_check_at,
            created_at, updated_at)
        SELECT
            u.id, u.consumer, u.operation_key, 'charge', u.amount_minor, u.currency,
            u.payment_method, u.customer, u.description, u.metadata, u.fingerprint, 'pending',
            u.provider, u.idempotency_key, 0, NULL, LEAST(u.process_now, u.now),
            u.now + u.lease_us * interval '1 microsecond', u.return_url, u.lease_owner,
            u.now + u.lease_us * interval '1 microsecond',
            u.now + u.grace_us * interval '1 microsecond', u.now, u.now
        FROM (
            SELECT t.*, now() + t.shift_us * interval '1 microsecond' AS now
            FROM unnest(p_id, p_consumer, p_operation_key, p_amount_minor, p_currency,
                        p_payment_method, p_customer, p_description, p_metadata, p_fingerprint,
                        p_provider, p_idempotency_key, p_process_now, p_shift_us, p_lease_owner,
                        p_lease_us, p_grace_us, p_return_url)
                 WITH ORDINALITY AS t(id, consumer, operation_key, amount_minor, currency,
                        payment_method, customer, description, metadata, fingerprint, provider,
                        idempotency_key, process_now, shift_us, lease_owner, lease_us, grace_us,
                        return_url, ord)
            ORDER BY t.consumer COLLATE "C", t.operation_key COLLATE "C", t.ord
        ) AS u
        ON CONFLICT DO NOTHING
        RETURNING *;
    GET DIAGNOSTICS v_written = ROW_COUNT;
    IF v_written = cardinality(p_id) THEN
        RETURN;
    END IF;
    -- The rows this call did not write: a new snapshot, so a concurrent insert's row is seen.
    -- One lookup per operation (LATERAL … LIMIT 1 is not flattened into a join, so the only
    -- plan is the unique index's, whatever the table's statistics say).
    RETURN QUERY
        SELECT a.*
        FROM (SELECT DISTINCT k.consumer, k.operation_key
              FROM unnest(p_consumer, p_operation_key) AS k(consumer, operation_key)) AS k
        CROSS JOIN LATERAL (
            SELECT *
            FROM payment_attempts
            WHERE payment_attempts.consumer = k.consumer
              AND payment_attempts.operation_key = k.operation_key
              AND payment_attempts.generation = 0
              AND payment_attempts.id <> ALL (p_id)
            LIMIT 1) AS a;
END
$$;

-- Each call of insert_pending_attempt is its own query with its own snapshot (the function is
-- volatile), so a row sees what the rows before it wrote, as consecutive single inserts would.
CREATE FUNCTION insert_pending_attempts(
    p_id uuid[], p_consumer text[], p_operation_key text[], p_amount_minor bigint[],
    p_currency text[], p_payment_method text[], p_customer text[], p_description text[],
    p_metadata jsonb[], p_fingerprint text[], p_provider text[], p_idempotency_key text[],
    p_process_now timestamptz[], p_shift_us bigint[], p_lease_owner uuid[], p_lease_us bigint[],
    p_grace_us bigint[], p_return_url text[], p_generation integer[])
RETURNS TABLE (batch_ordinal bigint, attempt payment_attempts)
LANGUAGE plpgsql
AS $$
BEGIN
    RETURN QUERY
        SELECT u.ord, a
        FROM (
            SELECT t.*
            FROM unnest(p_id, p_consumer, p_operation_key, p_amount_minor, p_currency,
                        p_payment_method, p_customer, p_description, p_metadata, p_fingerprint,
                        p_provider, p_idempotency_key, p_process_now, p_shift_us, p_lease_owner,
                        p_lease_us, p_grace_us, p_return_url, p_generation)
                 WITH ORDINALITY AS t(id, consumer, operation_key, amount_minor, currency,
                        payment_method, customer, description, metadata, fingerprint, provider,
                        idempotency_key, process_now, shift_us, lease_owner, lease_us, grace_us,
                        return_url, generation, ord)
            ORDER BY t.consumer COLLATE "C", t.operation_key COLLATE "C", t.ord
        ) AS u
        CROSS JOIN LATERAL insert_pending_attempt(
            u.id, u.consumer, u.operation_key, u.amount_minor, u.currency, u.payment_method,
            u.customer, u.description, u.metadata, u.fingerprint, u.provider,
            u.idempotency_key, u.generation, u.process_now, u.shift_us, u.lease_owner,
            u.lease_us, u.grace_us, u.return_url) AS a;
END
$$;
