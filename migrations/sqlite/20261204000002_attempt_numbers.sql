-- Twin of migrations/postgres/20261204000002_attempt_numbers.sql. The PostgreSQL function
-- insert_pending_attempt has no counterpart here: the SQLite store checks the attempt rule and
-- inserts in one BEGIN IMMEDIATE transaction (src/store/sqlite.rs). The index mirrors
-- PostgreSQL's, for the same lookup of an intent's latest attempt.
CREATE INDEX payment_attempts_confirms_payment_id
    ON payment_attempts (confirms_payment_id)
    WHERE confirms_payment_id IS NOT NULL;
