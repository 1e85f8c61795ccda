-- The embedded twin of the report staging of migrations/postgres/20261202000004_report_staging.sql
-- with its later columns (20261204000002_attempt_numbers.sql: linked_by 'confirms_payment_id',
-- the operation's counts; 20261204000004_refund_events_and_reports.sql: a provider refund's
-- claimed attempt, ours refunded, the refund facts). payment_attempts is not changed.
--
-- A run streams the provider's objects into these tables page by page, joins them with the
-- charge attempts inside the database into report_rows (src/store/sqlite_report.rs), reads
-- report_rows back in bounded pages, and deletes its run at the end; the next run deletes runs
-- abandoned by a killed process (report_runs.started_at), their rows by ON DELETE CASCADE (the
-- store opens every connection with foreign_keys on).
--
-- What differs from PostgreSQL, because SQLite has no such thing: the tables are ordinary
-- (SQLite has no UNLOGGED; staging is written to the same file and WAL as the attempts);
-- instants are INTEGER microseconds, ids 16-byte BLOBs and JSON is TEXT, as in payment_attempts.
CREATE TABLE report_runs (
    run_id     BLOB PRIMARY KEY NOT NULL CHECK (length(run_id) = 16),
    started_at INTEGER NOT NULL
) STRICT;

CREATE TABLE report_provider_payments (
    run_id                BLOB NOT NULL REFERENCES report_runs (run_id) ON DELETE CASCADE,
    provider_payment_id   TEXT NOT NULL,
    -- the attempt this object belongs to (see the PostgreSQL migration); NULL for an orphan
    attempt_id            BLOB CHECK (attempt_id IS NULL OR length(attempt_id) = 16),
    linked_by             TEXT
                          CHECK (linked_by IN ('metadata', 'provider_payment_id', 'confirms_payment_id')),
    status                TEXT NOT NULL,
    amount_minor          INTEGER NOT NULL,
    amount_received_minor INTEGER NOT NULL,
    currency              TEXT NOT NULL,
    created_at            INTEGER NOT NULL,
    PRIMARY KEY (run_id, provider_payment_id),
    CHECK ((attempt_id IS NULL) = (linked_by IS NULL))
) STRICT;

CREATE INDEX report_provider_payments_attempt ON report_provider_payments (run_id, attempt_id);

CREATE TABLE report_provider_refunds (
    run_id              BLOB NOT NULL REFERENCES report_runs (run_id) ON DELETE CASCADE,
    provider_refund_id  TEXT NOT NULL,
    provider_payment_id TEXT,
    status              TEXT NOT NULL,
    amount_minor        INTEGER NOT NULL,
    currency            TEXT NOT NULL,
    created_at          INTEGER NOT NULL,
    -- the refund attempt that claims it; NULL when none does
    attempt_id          BLOB CHECK (attempt_id IS NULL OR length(attempt_id) = 16),
    PRIMARY KEY (run_id, provider_refund_id)
) STRICT;

CREATE INDEX report_provider_refunds_payment ON report_provider_refunds (run_id, provider_payment_id);
CREATE INDEX report_provider_refunds_attempt ON report_provider_refunds (run_id, attempt_id);

-- One row per charge attempt created in the period, or per orphan provider object created in
-- it; `seq` is the output order (by creation time).
CREATE TABLE report_rows (
    run_id                         BLOB NOT NULL REFERENCES report_runs (run_id) ON DELETE CASCADE,
    seq                            INTEGER NOT NULL,
    attempt_id                     BLOB,
    consumer                       TEXT,
    operation_key                  TEXT,
    attempt_status                 TEXT,
    amount_minor                   INTEGER,
    currency                       TEXT,
    provider_payment_id            TEXT,
    failure_code                   TEXT,
    review_reason                  TEXT,
    attempt_created_at             INTEGER,
    -- the provider objects of the row, oldest first, at most the listing bound of the run
    objects                        TEXT NOT NULL CHECK (json_valid(objects)),
    objects_total                  INTEGER NOT NULL,
    operation_succeeded_attempts   INTEGER NOT NULL DEFAULT 0,
    operation_earlier_live_objects INTEGER NOT NULL DEFAULT 0,
    ours_refunded_minor            INTEGER NOT NULL DEFAULT 0,
    refunds                        TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(refunds)),
    PRIMARY KEY (run_id, seq)
) STRICT;
