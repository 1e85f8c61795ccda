-- Issue 21: group commit inserts the first attempts (generation 0) of many operations as one
-- set-based statement. One call of insert_pending_attempt per row costs PostgreSQL about twice
-- the CPU of one INSERT … SELECT over all rows (measured with pgbench: BENCHMARKS.md, "Group
-- commit"), so a batch no longer calls it row by row.
--
-- Each row is answered as insert_pending_attempt would answer it alone:
-- - its own new pending row, when the INSERT wrote it;
-- - else the attempt already there (a duplicate, an in-progress attempt, a mismatch, or a
--   concurrent insert of the same operation that committed after the INSERT's snapshot: the
--   INSERT waited for it and did nothing, and the second query's new snapshot sees it).
-- Two rows of one operation in one call: the INSERT writes one of them (ON CONFLICT DO NOTHING
-- skips a row that conflicts with one this statement wrote), the other finds it, as the second
-- of two calls in a row would.
-- The rows come back once each; the caller finds each row's answer by (consumer, operation_key).
-- Later attempts (generation > 0) check the rule on the earlier attempt row by row, through
-- insert_pending_attempt.
CREATE FUNCTION insert_pending_first_attempts(
    p_id uuid[], p_consumer text[], p_operation_key text[], p_amount_minor bigint[],
    p_currency text[], p_payment_method text[], p_customer text[], p_description text[],
    p_metadata jsonb[], p_fingerprint text[], p_provider text[], p_idempotency_key text[],
    p_process_now timestamptz[], p_shift_us bigint[], p_lease_owner uuid[], p_lease_us bigint[],
    p_grace_us bigint[], p_return_url text[])
RETURNS SETOF payment_attempts
LANGUAGE plpgsql
-- Both queries have one good plan whatever the arrays hold (an insert from unnest; index scans
-- of the operation key per element), so plan them once per connection, not per call: custom
-- plans were 12 % of PostgreSQL's CPU per charge in a profile of the benchmark.
SET plan_cache_mode = force_generic_plan
AS $$
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
            ORDER BY t.ord
        ) AS u
        ON CONFLICT DO NOTHING
        RETURNING *;
    -- The rows this call did not write: a new snapshot, so a concurrent insert's row is seen.
    RETURN QUERY
        SELECT a.*
        FROM payment_attempts a
        WHERE (a.consumer, a.operation_key) IN (
                SELECT k.consumer, k.operation_key
                FROM unnest(p_consumer, p_operation_key) AS k(consumer, operation_key))
          AND a.generation = 0
          AND a.id <> ALL (p_id);
END
$$;
