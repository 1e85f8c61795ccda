-- payment_attempts is a financial record: rows are never deleted, by retention or otherwise.
CREATE TABLE payment_attempts (
    id                    UUID PRIMARY KEY,
    consumer              TEXT NOT NULL,
    operation_key         TEXT NOT NULL,
    kind                  TEXT NOT NULL CHECK (kind IN ('charge')),
    amount_minor          BIGINT NOT NULL CHECK (amount_minor > 0),
    currency              TEXT NOT NULL,
    payment_method        TEXT NOT NULL,
    customer              TEXT,
    description           TEXT,
    metadata              JSONB NOT NULL DEFAULT '{}'::jsonb,
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
    key_window_started_at TIMESTAMPTZ NOT NULL,
    lease_owner           UUID,
    lease_expires_at      TIMESTAMPTZ,
    check_count           INTEGER NOT NULL DEFAULT 0,
    next_check_at         TIMESTAMPTZ NOT NULL,
    last_error            TEXT,
    created_at            TIMESTAMPTZ NOT NULL,
    updated_at            TIMESTAMPTZ NOT NULL,
    CONSTRAINT payment_attempts_operation_unique UNIQUE (consumer, operation_key),
    CONSTRAINT payment_attempts_idempotency_key_unique UNIQUE (idempotency_key),
    CONSTRAINT payment_attempts_lease_whole
        CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL))
);

-- Recovery scans only unfinished rows, by when they are due: small however large the table.
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
