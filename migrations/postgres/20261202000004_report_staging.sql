-- Staging for reconciliation reports (src/report/), PostgreSQL only: the attempts table itself
-- is not changed, so this migration has no SQLite twin. A run streams the provider's objects into
-- these tables page by page, joins them with the charge attempts inside the database into
-- report_rows, reads report_rows back in bounded pages, and deletes its run at the end. So the
-- report's memory does not grow with the period, and both passes over the rows (summary, then
-- rows) read the same snapshot.
--
-- UNLOGGED: staging is rebuilt by re-running the report, so it is not worth WAL; a crash
-- empties these tables, which only loses runs that were in progress anyway. Runs abandoned by
-- a killed process are deleted by the next run (report_runs.started_at).

CREATE UNLOGGED TABLE report_runs (
    run_id     UUID PRIMARY KEY,
    started_at TIMESTAMPTZ NOT NULL
);

CREATE UNLOGGED TABLE report_provider_payments (
    run_id                UUID NOT NULL REFERENCES report_runs ON DELETE CASCADE,
    provider_payment_id   TEXT NOT NULL,
    -- the attempt this object belongs to: by its chargeguard_attempt_id metadata, else by the
    -- id the attempt recorded; NULL for an orphan
    attempt_id            UUID,
    linked_by             TEXT CHECK (linked_by IN ('metadata', 'provider_payment_id')),
    status                TEXT NOT NULL,
    amount_minor          BIGINT NOT NULL,
    amount_received_minor BIGINT NOT NULL,
    currency              TEXT NOT NULL,
    created_at            TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (run_id, provider_payment_id),
    CHECK ((attempt_id IS NULL) = (linked_by IS NULL))
);

CREATE INDEX report_provider_payments_attempt ON report_provider_payments (run_id, attempt_id);

CREATE UNLOGGED TABLE report_provider_refunds (
    run_id              UUID NOT NULL REFERENCES report_runs ON DELETE CASCADE,
    provider_refund_id  TEXT NOT NULL,
    provider_payment_id TEXT,
    status              TEXT NOT NULL,
    amount_minor        BIGINT NOT NULL,
    currency            TEXT NOT NULL,
    created_at          TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (run_id, provider_refund_id)
);

CREATE INDEX report_provider_refunds_payment ON report_provider_refunds (run_id, provider_payment_id);

-- One row per charge attempt created in the period, or per orphan provider object created in
-- it; `seq` is the output order (by creation time).
CREATE UNLOGGED TABLE report_rows (
    run_id              UUID NOT NULL REFERENCES report_runs ON DELETE CASCADE,
    seq                 BIGINT NOT NULL,
    attempt_id          UUID,
    consumer            TEXT,
    operation_key       TEXT,
    attempt_status      TEXT,
    amount_minor        BIGINT,
    currency            TEXT,
    provider_payment_id TEXT,
    failure_code        TEXT,
    review_reason       TEXT,
    attempt_created_at  TIMESTAMPTZ,
    -- the provider objects of the row, oldest first, at most the listing bound of the run
    objects             JSONB NOT NULL,
    objects_total       INTEGER NOT NULL,
    PRIMARY KEY (run_id, seq)
);
