-- Issue 21: group commit's finish batch (the results of many callers' rounds) as a function
-- whose plan is made once per connection. Sent as a prepared statement, PostgreSQL planned
-- `UPDATE … FROM unnest($1, …)` again at every execution: the plan cache never switched to the
-- generic plan (its estimate for an unnest of unknown length is higher than the custom plans'),
-- and planning took 0.2–0.3 ms per batch against ~0.06 ms of execution for 4 rows (EXPLAIN
-- ANALYZE EXECUTE, BENCHMARKS.md "Group commit"). The generic plan is the same nested loop over
-- the primary key. The statement is the one src/store/postgres_group.rs sent, its parameters
-- named; each result row carries its request's ordinal (1-based) and the row as updated.
-- Each SET reads the row's value before the update (`status`), as the single statement does; the
-- allowed sources of each row's new status travel as one comma-separated text (an array of
-- arrays does not unnest row by row).
CREATE FUNCTION finish_rounds(
    p_id uuid[], p_owner uuid[], p_status text[], p_sources text[], p_payment_id text[],
    p_provider_status text[], p_failure_code text[], p_failure_message text[],
    p_action_type text[], p_action_url text[], p_review_reason text[], p_calls integer[],
    p_next_check_us bigint[], p_last_error text[], p_shift_us bigint[],
    p_replays_failure boolean[], p_unfinished text[], p_has_lookup boolean[],
    p_lookup_cursor text[])
RETURNS TABLE (batch_ordinal bigint, attempt payment_attempts)
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN QUERY
        UPDATE payment_attempts SET
            failure_code = CASE WHEN status = ANY(r.r_sources) THEN r.r_failure_code ELSE failure_code END,
            failure_message = CASE WHEN status = ANY(r.r_sources) THEN r.r_failure_message ELSE failure_message END,
            next_action_type = CASE WHEN status = ANY(r.r_sources) THEN r.r_action_type ELSE next_action_type END,
            next_action_url = CASE WHEN status = ANY(r.r_sources) THEN r.r_action_url ELSE next_action_url END,
            provider_status = CASE WHEN status = ANY(p_unfinished) THEN COALESCE(r.r_provider_status, provider_status)
                                   ELSE provider_status END,
            action_started_at = CASE WHEN status = ANY(r.r_sources) AND r.r_status = 'requires_action'
                                     THEN now() + r.r_shift_us * interval '1 microsecond'
                                     ELSE action_started_at END,
            status = CASE WHEN status = ANY(r.r_sources) THEN r.r_status ELSE status END,
            provider_payment_id = COALESCE(provider_payment_id, r.r_payment_id),
            review_reason = append_review_reason(review_reason, r.r_review_reason),
            provider_calls = provider_calls + r.r_calls,
            check_count = check_count + 1,
            next_check_at = now() + (r.r_shift_us + r.r_next_check_us) * interval '1 microsecond',
            last_error = r.r_last_error,
            create_replays_failure = create_replays_failure OR r.r_replays_failure,
            lookup_cursor = CASE WHEN r.r_has_lookup THEN r.r_lookup_cursor ELSE lookup_cursor END,
            lease_owner = NULL,
            lease_expires_at = NULL,
            updated_at = now() + r.r_shift_us * interval '1 microsecond'
         FROM (SELECT u.*, string_to_array(u.r_sources_text, ',') AS r_sources
               FROM unnest(p_id, p_owner, p_status, p_sources, p_payment_id,
                           p_provider_status, p_failure_code, p_failure_message, p_action_type, p_action_url,
                           p_review_reason, p_calls, p_next_check_us, p_last_error,
                           p_shift_us, p_replays_failure, p_has_lookup, p_lookup_cursor)
                    WITH ORDINALITY AS u(r_id, r_owner, r_status, r_sources_text,
                           r_payment_id, r_provider_status, r_failure_code,
                           r_failure_message, r_action_type, r_action_url, r_review_reason,
                           r_calls, r_next_check_us, r_last_error, r_shift_us,
                           r_replays_failure, r_has_lookup, r_lookup_cursor, r_ordinal)) AS r
         WHERE payment_attempts.id = r.r_id AND payment_attempts.lease_owner = r.r_owner
        RETURNING r.r_ordinal, payment_attempts;
END;
$$;
