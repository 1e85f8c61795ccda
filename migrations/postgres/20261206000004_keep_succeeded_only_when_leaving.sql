-- Issue 21: the trigger that keeps a succeeded attempt succeeded (migration 20261204000004)
-- called its PL/pgSQL function for every change of status, although the function can only
-- refuse a row that leaves succeeded. A WHEN condition is evaluated by the executor without
-- calling the function, so now only such a row calls it; every other row (every charge's
-- pending → succeeded or failed) is written as before without the call. What is refused is
-- unchanged: the function still decides, for exactly the rows it could refuse. PostgreSQL's CPU
-- per charge, pgbench on a seeded table: 4 charges per transaction 166-180 µs against
-- 173-199 µs, one charge per transaction (the per-charge SQL) 404-424 µs against 427-447 µs
-- (BENCHMARKS.md, "Group commit", tenth round).
DROP TRIGGER payment_attempts_keep_succeeded ON payment_attempts;
CREATE TRIGGER payment_attempts_keep_succeeded
    BEFORE UPDATE OF status ON payment_attempts
    FOR EACH ROW
    WHEN (OLD.status = 'succeeded' AND NEW.status IS DISTINCT FROM 'succeeded')
    EXECUTE FUNCTION payment_attempts_keep_succeeded();
