-- What chargeguard runs against PostgreSQL for one new charge, as two transactions:
-- insert_pending (a call of the function insert_pending_attempt, migrations/postgres), then
-- finish_round (src/store/postgres.rs). A unit test (src/bench/pgbench_drift.rs)
-- fails when these statements and the service's drift apart. bench/run.sh passes the constant
-- values with -D (see PGBENCH_VALUES there).
--
-- Differences pgbench forces; none changes the work of a statement:
-- - pgbench cannot make a UUID: gen_random_uuid() stands for the id and the lease owner, and
--   finish_round's id and owner are read back from insert_pending's RETURNING.
-- - pgbench cannot bind NULL: :absent sends the text 'null' where the service binds NULL.
-- - the caller's timestamp is the literal 'now' (the service binds its clock's instant); the
--   statements read the database's clock themselves.
-- - operation and idempotency keys are one random 63-bit number (the service's benchmark keys
--   are strings of about 30 and 71 characters).
\set key random(1, 9000000000000000000)
\set absent NULL
\set amount 1000
\set generation 0
\set calls 1
\set zero 0
\set lease_us 30000000
\set grace_us 60000000
SELECT * FROM insert_pending_attempt(
                gen_random_uuid(), :consumer, :key, :amount, :currency, :payment_method, :absent, :description, :metadata, :fingerprint, :provider, :key, :generation, :now, :zero, gen_random_uuid(), :lease_us, :grace_us, :absent)
\gset inserted_
UPDATE payment_attempts SET
                failure_code = CASE WHEN status = ANY(:unfinished) THEN :absent ELSE failure_code END,
                failure_message = CASE WHEN status = ANY(:unfinished) THEN :absent ELSE failure_message END,
                next_action_type = CASE WHEN status = ANY(:unfinished) THEN :absent ELSE next_action_type END,
                next_action_url = CASE WHEN status = ANY(:unfinished) THEN :absent ELSE next_action_url END,
                provider_status = CASE WHEN status = ANY(:unfinished) THEN COALESCE(:succeeded, provider_status)
                                       ELSE provider_status END,
                action_started_at = CASE WHEN status = ANY(:unfinished) AND :succeeded = 'requires_action'
                                         THEN now() + :zero * interval '1 microsecond'
                                         ELSE action_started_at END,
                status = CASE WHEN status = ANY(:unfinished) THEN :succeeded ELSE status END,
                provider_payment_id = COALESCE(provider_payment_id, :inserted_idempotency_key),
                review_reason = append_review_reason(review_reason, :absent::text),
                provider_calls = provider_calls + :calls,
                check_count = check_count + 1,
                next_check_at = now() + (:zero::bigint + :zero::bigint) * interval '1 microsecond',
                last_error = :absent,
                create_replays_failure = create_replays_failure OR :false,
                lookup_cursor = CASE WHEN :false THEN :absent ELSE lookup_cursor END,
                lease_owner = NULL,
                lease_expires_at = NULL,
                updated_at = now() + :zero * interval '1 microsecond'
             WHERE id = :inserted_id AND lease_owner = :inserted_lease_owner
             RETURNING *;
