-- Issue 21: group commit's two batch functions plan once per connection (plan_cache_mode =
-- force_generic_plan), and that one plan was made from whatever the table looked like at the
-- connection's first batch. On a new table (one that ANALYZE has not seen yet) the planner
-- judged reading the whole table cheapest, and the connection kept that plan until ANALYZE
-- invalidated it: autovacuum gets there within a minute or so, and until then every batch read
-- the whole table (a fresh database, 16 callers for 10 s: 2,668 sequential scans reading 7.9M
-- rows for 5,800 charges; BENCHMARKS.md, "Group commit", ninth round).
--
-- Both functions find at most batch_max rows by a unique key, so one index lookup per row is
-- the right plan at any size of the table:
-- - insert_pending_first_attempts' read of the rows it did not write looks each operation up
--   in a LATERAL subquery. Its `IN (SELECT … FROM unnest(…))` had two plans the planner could
--   prefer on a table it thought tiny: a sequential scan, or a walk of the whole operation
--   index on `generation = 0` alone.
-- - finish_rounds' UPDATE … FROM unnest(…) cannot be written so, and gets settings that hold
--   only while it runs and leave the planner nothing but the nested loop over the primary key.
ALTER FUNCTION finish_rounds SET enable_seqscan = off;
ALTER FUNCTION finish_rounds SET enable_hashjoin = off;
ALTER FUNCTION finish_rounds SET enable_mergejoin = off;

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
