-- bench/batch_statements.sh: 4 first attempts inserted by the batch function, then their 4 results written by one UPDATE … FROM unnest (a simplified finish: same indexes touched, the trigger fired), as two transactions, as group commit runs them today; the script also runs these statements inside BEGIN … COMMIT.
\set k random(1, 9000000000000000000)
SELECT count(*) FROM insert_pending_first_attempts(ARRAY[gen_random_uuid(),gen_random_uuid(),gen_random_uuid(),gen_random_uuid()], ARRAY['c','c','c','c'], ARRAY['a'||:k,'b'||:k,'c'||:k,'d'||:k], ARRAY[100,100,100,100]::bigint[], ARRAY['usd','usd','usd','usd'], ARRAY['pm','pm','pm','pm'], ARRAY[NULL,NULL,NULL,NULL]::text[], ARRAY[NULL,NULL,NULL,NULL]::text[], ARRAY['{}','{}','{}','{}']::jsonb[], ARRAY['f','f','f','f'], ARRAY['stripe','stripe','stripe','stripe'], ARRAY['ka'||:k,'kb'||:k,'kc'||:k,'kd'||:k], ARRAY[now(),now(),now(),now()], ARRAY[0,0,0,0]::bigint[], ARRAY['00000000-0000-4000-8000-000000000001'::uuid,'00000000-0000-4000-8000-000000000001','00000000-0000-4000-8000-000000000001','00000000-0000-4000-8000-000000000001'], ARRAY[30000000,30000000,30000000,30000000]::bigint[], ARRAY[60000000,60000000,60000000,60000000]::bigint[], ARRAY[NULL,NULL,NULL,NULL]::text[]);
UPDATE payment_attempts SET
    status = CASE WHEN status = ANY(string_to_array(r.r_sources_text, ',')) THEN r.r_status ELSE status END,
    provider_payment_id = COALESCE(provider_payment_id, r.r_payment_id),
    provider_status = r.r_status,
    next_check_at = now() + (r.r_shift_us) * interval '1 microsecond',
    lease_owner = NULL, lease_expires_at = NULL, check_count = check_count + 1, provider_calls = provider_calls + 1,
    updated_at = now()
FROM unnest(ARRAY['c','c','c','c'], ARRAY['a'||:k,'b'||:k,'c'||:k,'d'||:k], ARRAY['succeeded','succeeded','succeeded','succeeded'], ARRAY['pending,requires_action','pending,requires_action','pending,requires_action','pending,requires_action'], ARRAY['pi_a'||:k,'pi_b'||:k,'pi_c'||:k,'pi_d'||:k], ARRAY[0,0,0,0]::bigint[]) WITH ORDINALITY AS r(r_consumer, r_op, r_status, r_sources_text, r_payment_id, r_shift_us, r_ord)
WHERE payment_attempts.consumer = r.r_consumer AND payment_attempts.operation_key = r.r_op AND payment_attempts.generation = 0 AND payment_attempts.lease_owner = '00000000-0000-4000-8000-000000000001'
RETURNING r.r_ord, payment_attempts.*;
