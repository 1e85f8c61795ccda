-- What chargeguard runs against PostgreSQL for one new charge, as two transactions:
-- insert_pending, then finish_round (src/store/postgres.rs). A unit test (src/bench/pgbench_drift.rs)
-- fails when these statements and the service's drift apart. bench/run.sh passes the constant
-- values with -D (see PGBENCH_VALUES there).
--
-- Differences pgbench forces; none changes the work of a statement:
-- - pgbench cannot make a UUID: gen_random_uuid() stands for the id and the lease owner, and
--   finish_round's id and owner are read back from insert_pending's RETURNING.
-- - pgbench cannot bind NULL: :absent sends the text 'null' where the service binds NULL.
-- - timestamps are the literal 'now' (the service binds its clock's instant).
-- - operation and idempotency keys are one random 63-bit number (the service's benchmark keys
--   are strings of about 30 and 71 characters).
\set key random(1, 9000000000000000000)
\set absent NULL
\set amount 1000
\set generation 0
\set calls 1
WITH existing AS (
                SELECT * FROM payment_attempts WHERE consumer = :consumer AND operation_key = :key),
             inserted AS (
                INSERT INTO payment_attempts (
                    id, consumer, operation_key, kind, amount_minor, currency, payment_method,
                    customer, description, metadata, fingerprint, status, provider,
                    idempotency_key, generation, key_window_started_at, lease_owner,
                    lease_expires_at, next_check_at, created_at, updated_at)
                SELECT gen_random_uuid(), :consumer, :key, 'charge', :amount, :currency, :payment_method, :absent, :description, :metadata, :fingerprint, 'pending', :provider, :key,
                       :generation, :now, gen_random_uuid(), :now, :now, :now, :now
                WHERE NOT EXISTS (SELECT FROM existing)
                ON CONFLICT DO NOTHING
                RETURNING *)
             SELECT false AS inserted_now, existing.* FROM existing
             UNION ALL
             SELECT true, inserted.* FROM inserted
\gset inserted_
UPDATE payment_attempts SET
                failure_code = CASE WHEN status = ANY(:unfinished) THEN :absent ELSE failure_code END,
                failure_message = CASE WHEN status = ANY(:unfinished) THEN :absent ELSE failure_message END,
                next_action_type = CASE WHEN status = ANY(:unfinished) THEN :absent ELSE next_action_type END,
                next_action_url = CASE WHEN status = ANY(:unfinished) THEN :absent ELSE next_action_url END,
                provider_status = CASE WHEN status = ANY(:unfinished) THEN COALESCE(:succeeded, provider_status)
                                       ELSE provider_status END,
                status = CASE WHEN status = ANY(:unfinished) THEN :succeeded ELSE status END,
                provider_payment_id = COALESCE(provider_payment_id, :inserted_idempotency_key),
                review_reason = COALESCE(:absent, review_reason),
                provider_calls = provider_calls + :calls,
                check_count = check_count + 1,
                next_check_at = :now,
                last_error = :absent,
                lease_owner = NULL,
                lease_expires_at = NULL,
                updated_at = :now
             WHERE id = :inserted_id AND lease_owner = :inserted_lease_owner
             RETURNING *;
