-- bench/batch_statements.sh: the single-row statement, one row a transaction (the unbatched path).
\set k random(1, 9000000000000000000)
SELECT * FROM insert_pending_attempt(gen_random_uuid(), 'bench', 'op-' || :k, 1000, 'usd', 'pm_card_visa', NULL, NULL, '{}'::jsonb, 'fp', 'stripe', 'key-' || :k, 0, now(), 0, gen_random_uuid(), 30000000, 60000000, NULL);
