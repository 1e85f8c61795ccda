-- bench/batch_statements.sh: one batch-insert form, 4 rows a transaction unless named otherwise.
\set k random(1, 9000000000000000000)
SELECT u.g, a.* FROM generate_series(1,4) WITH ORDINALITY u(g) CROSS JOIN LATERAL insert_pending_attempt(gen_random_uuid(), 'bench', 'op-' || :k || '-' || u.g, 1000, 'usd', 'pm_card_visa', NULL, NULL, '{}'::jsonb, 'fp', 'stripe', 'key-' || :k || '-' || u.g, 0, now(), 0, gen_random_uuid(), 30000000, 60000000, NULL) a;
