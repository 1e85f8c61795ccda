-- The embedded twin of migrations/postgres/20261204000001_refunds_and_attempt_numbers.sql.
-- SQLite cannot change a table's CHECK or UNIQUE constraints in place, so the table is rebuilt
-- with the new ones (SQLite's documented procedure: new table, copy, drop, rename, indexes).
-- Every row and every value is carried over as it is; rows are never deleted.
CREATE TABLE payment_attempts_rebuilt (
    id                    BLOB PRIMARY KEY NOT NULL CHECK (length(id) = 16),
    consumer              TEXT NOT NULL,
    operation_key         TEXT NOT NULL,
    kind                  TEXT NOT NULL CHECK (kind IN ('charge', 'refund')),
    amount_minor          INTEGER NOT NULL CHECK (amount_minor > 0),
    currency              TEXT NOT NULL,
    payment_method        TEXT NOT NULL,
    customer              TEXT,
    description           TEXT,
    metadata              TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(metadata)),
    fingerprint           TEXT NOT NULL,
    status                TEXT NOT NULL
                          CHECK (status IN ('pending', 'requires_action', 'succeeded', 'failed')),
    provider              TEXT NOT NULL,
    provider_payment_id   TEXT,
    provider_status       TEXT,
    idempotency_key       TEXT NOT NULL,
    generation            INTEGER NOT NULL DEFAULT 0 CHECK (generation >= 0),
    failure_code          TEXT,
    failure_message       TEXT,
    next_action_type      TEXT,
    next_action_url       TEXT,
    review_reason         TEXT,
    provider_calls        INTEGER NOT NULL DEFAULT 0,
    key_window_started_at INTEGER NOT NULL,
    lease_owner           BLOB CHECK (lease_owner IS NULL OR length(lease_owner) = 16),
    lease_expires_at      INTEGER,
    check_count           INTEGER NOT NULL DEFAULT 0,
    next_check_at         INTEGER NOT NULL,
    last_error            TEXT,
    created_at            INTEGER NOT NULL,
    updated_at            INTEGER NOT NULL,
    return_url            TEXT,
    create_sent_until     INTEGER,
    create_replays_failure INTEGER NOT NULL DEFAULT 0 CHECK (create_replays_failure IN (0, 1)),
    lookup_cursor         TEXT,
    action_started_at     INTEGER,
    review_history        TEXT,
    parent_attempt_id     BLOB REFERENCES payment_attempts_rebuilt (id)
                          CHECK (parent_attempt_id IS NULL OR length(parent_attempt_id) = 16),
    refund_reason         TEXT
                          CHECK (refund_reason IN ('duplicate', 'fraudulent', 'requested_by_customer')),
    confirms_payment_id   TEXT,
    failed_after_success_at INTEGER,
    CONSTRAINT payment_attempts_operation_unique UNIQUE (consumer, operation_key, generation),
    CONSTRAINT payment_attempts_idempotency_key_unique UNIQUE (idempotency_key),
    CONSTRAINT payment_attempts_lease_whole
        CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL)),
    CONSTRAINT payment_attempts_refund_parent
        CHECK ((kind = 'refund') = (parent_attempt_id IS NOT NULL)),
    CONSTRAINT payment_attempts_refund_reason_only_on_refunds
        CHECK (refund_reason IS NULL OR kind = 'refund'),
    CONSTRAINT payment_attempts_failed_after_success_only_on_refunds
        CHECK (failed_after_success_at IS NULL OR (kind = 'refund' AND status = 'failed'))
) STRICT;

INSERT INTO payment_attempts_rebuilt (
    id, consumer, operation_key, kind, amount_minor, currency, payment_method, customer,
    description, metadata, fingerprint, status, provider, provider_payment_id, provider_status,
    idempotency_key, generation, failure_code, failure_message, next_action_type,
    next_action_url, review_reason, provider_calls, key_window_started_at, lease_owner,
    lease_expires_at, check_count, next_check_at, last_error, created_at, updated_at, return_url,
    create_sent_until, create_replays_failure, lookup_cursor, action_started_at, review_history)
SELECT
    id, consumer, operation_key, kind, amount_minor, currency, payment_method, customer,
    description, metadata, fingerprint, status, provider, provider_payment_id, provider_status,
    idempotency_key, generation, failure_code, failure_message, next_action_type,
    next_action_url, review_reason, provider_calls, key_window_started_at, lease_owner,
    lease_expires_at, check_count, next_check_at, last_error, created_at, updated_at, return_url,
    create_sent_until, create_replays_failure, lookup_cursor, action_started_at, review_history
FROM payment_attempts;

DROP TABLE payment_attempts;
ALTER TABLE payment_attempts_rebuilt RENAME TO payment_attempts;

-- The indexes of 20261202000001 and 20261202000002, re-created on the rebuilt table, and the
-- new one on a charge's refunds.
CREATE INDEX payment_attempts_unfinished_due
    ON payment_attempts (next_check_at)
    WHERE status IN ('pending', 'requires_action');
CREATE INDEX payment_attempts_provider_payment_id
    ON payment_attempts (provider_payment_id)
    WHERE provider_payment_id IS NOT NULL;
CREATE INDEX payment_attempts_consumer_created
    ON payment_attempts (consumer, created_at DESC, id DESC);
CREATE INDEX payment_attempts_created ON payment_attempts (created_at);
CREATE INDEX payment_attempts_unfinished_created
    ON payment_attempts (created_at)
    WHERE status IN ('pending', 'requires_action');
CREATE INDEX payment_attempts_parent
    ON payment_attempts (parent_attempt_id)
    WHERE parent_attempt_id IS NOT NULL;
