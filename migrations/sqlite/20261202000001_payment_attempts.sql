-- The embedded (SQLite) twin of migrations/postgres/20261202000001_payment_attempts.sql: the
-- same columns, constraints and indexes. Two things differ, both because SQLite has no such
-- types:
--   * instants are INTEGER microseconds since the Unix epoch (UTC), so that `<`, `<=` and
--     ORDER BY compare them as numbers, at PostgreSQL's precision (timestamptz is microseconds);
--   * UUIDs are 16-byte BLOBs, which SQLite compares with memcmp, as PostgreSQL orders uuid.
-- STRICT makes SQLite reject a value of the wrong type instead of storing it anyway.
--
-- payment_attempts is a financial record: rows are never deleted, by retention or otherwise.
CREATE TABLE payment_attempts (
    id                    BLOB PRIMARY KEY NOT NULL CHECK (length(id) = 16),
    consumer              TEXT NOT NULL,
    operation_key         TEXT NOT NULL,
    kind                  TEXT NOT NULL CHECK (kind IN ('charge')),
    amount_minor          INTEGER NOT NULL CHECK (amount_minor > 0),
    currency              TEXT NOT NULL,
    payment_method        TEXT NOT NULL,
    customer              TEXT,
    description           TEXT,
    -- a JSON object of string values, as PostgreSQL's JSONB column holds it
    metadata              TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(metadata)),
    -- sha256 of every parameter that must match when the operation is requested again
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
    -- when the current idempotency key may first have reached the provider
    key_window_started_at INTEGER NOT NULL,
    lease_owner           BLOB CHECK (lease_owner IS NULL OR length(lease_owner) = 16),
    lease_expires_at      INTEGER,
    check_count           INTEGER NOT NULL DEFAULT 0,
    next_check_at         INTEGER NOT NULL,
    last_error            TEXT,
    created_at            INTEGER NOT NULL,
    updated_at            INTEGER NOT NULL,
    CONSTRAINT payment_attempts_operation_unique UNIQUE (consumer, operation_key),
    CONSTRAINT payment_attempts_idempotency_key_unique UNIQUE (idempotency_key),
    CONSTRAINT payment_attempts_lease_whole
        CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL))
) STRICT;

-- Recovery scans only unfinished rows, by when they are due: small however large the table.
-- SQLite uses a partial index only for a query whose WHERE repeats this condition literally,
-- which is why the store writes the unfinished statuses into its SQL rather than binding them.
CREATE INDEX payment_attempts_unfinished_due
    ON payment_attempts (next_check_at)
    WHERE status IN ('pending', 'requires_action');

-- Webhooks and reports find attempts by the provider's object id.
CREATE INDEX payment_attempts_provider_payment_id
    ON payment_attempts (provider_payment_id)
    WHERE provider_payment_id IS NOT NULL;

-- ListAttempts: one consumer's attempts, newest first.
CREATE INDEX payment_attempts_consumer_created
    ON payment_attempts (consumer, created_at DESC, id DESC);

-- Reports read a period across consumers.
CREATE INDEX payment_attempts_created ON payment_attempts (created_at);
