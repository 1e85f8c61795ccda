-- Issue 17: the webhook inbox on the embedded store. The twin of
-- migrations/postgres/20261202000003_webhook_inbox.sql with the outcomes added by
-- 20261203140001 and 20261204000004: the same columns, constraints and indexes, with the
-- embedded store's types (instants INTEGER microseconds since the Unix epoch, UUIDs 16-byte
-- BLOBs; see 20261202000001_payment_attempts.sql). STRICT rejects a value of the wrong type.
--
-- Provider events as received: verified, stored, acknowledged, then applied at our own pace by
-- the inbox worker. Rows are pruned by retention once processed and older than the longest
-- redelivery path (Stripe resends manually up to 30 days after an event).
CREATE TABLE webhook_inbox (
    -- The provider's event id: a redelivery of the same event is the same row.
    event_id          TEXT PRIMARY KEY NOT NULL,
    event_type        TEXT NOT NULL,
    -- id of the event's data.object, when it has one
    object_id         TEXT,
    -- the provider's `created` of the event
    event_created_at  INTEGER NOT NULL,
    -- the raw, verified body, byte for byte as signed
    payload           TEXT NOT NULL,
    received_at       INTEGER NOT NULL,
    -- a worker's claim on an unprocessed row; another worker may take it once it expires
    claim_owner       BLOB CHECK (claim_owner IS NULL OR length(claim_owner) = 16),
    claim_expires_at  INTEGER,
    claim_count       INTEGER NOT NULL DEFAULT 0,
    processed_at      INTEGER,
    outcome           TEXT CHECK (outcome IN (
                          'applied', 'duplicate', 'stale', 'unknown_object', 'conflict',
                          'unreadable', 'flagged', 'failed_after_success', 'disputed')),
    -- the attempt the event was mapped to, if any
    attempt_id        BLOB CHECK (attempt_id IS NULL OR length(attempt_id) = 16),
    detail            TEXT,
    CONSTRAINT webhook_inbox_claim_whole
        CHECK ((claim_owner IS NULL) = (claim_expires_at IS NULL)),
    CONSTRAINT webhook_inbox_processed_whole
        CHECK ((processed_at IS NULL) = (outcome IS NULL))
) STRICT;

-- The worker and the depth/age metrics read only unprocessed rows: small however large the table.
CREATE INDEX webhook_inbox_unprocessed
    ON webhook_inbox (received_at)
    WHERE processed_at IS NULL;

-- Retention deletes processed rows oldest first.
CREATE INDEX webhook_inbox_processed
    ON webhook_inbox (received_at)
    WHERE processed_at IS NOT NULL;

-- The first event processed for each (object, event type): a second, distinct event for the same
-- change is a duplicate. Pruned with the inbox.
CREATE TABLE webhook_dedup (
    object_id    TEXT NOT NULL,
    event_type   TEXT NOT NULL,
    event_id     TEXT NOT NULL,
    recorded_at  INTEGER NOT NULL,
    PRIMARY KEY (object_id, event_type)
) STRICT;

CREATE INDEX webhook_dedup_recorded ON webhook_dedup (recorded_at);
