//! `InboxStore` on SQLite (issue 17), with the PostgreSQL store's guarantees (`postgres_inbox.rs`).
//! What stands in for PostgreSQL's row locks is SQLite's one write lock: a claim is one `UPDATE`
//! statement, which takes the write lock before it reads, so concurrent claimers (connections of
//! one pool, or other processes on the same file) run one after another and each sees the claims
//! of the one before — no `SKIP LOCKED` is needed, no row goes to two workers. The settle of one
//! event is one `BEGIN IMMEDIATE` transaction (the write lock taken before the claim check):
//! claim check, de-duplication key, guarded attempt update, processed mark commit together or
//! not at all, so a worker killed at any point leaves all of it or none of it. No provider call
//! happens inside it.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::sqlite::SqliteRow;
use sqlx::{Row, Sqlite, Transaction};

use super::inbox::{
    Claim, InboxEvent, InboxInsert, InboxOutcome, InboxStats, InboxStore, NewInboxEvent,
    PaymentUpdate, PruneCounts, RefundEventOutcome, RefundUpdate, SettleEvent, Settlement,
};
use super::row::optional_attempt;
use super::sqlite::{
    DATABASE_NOW_1, DATABASE_NOW_3, DATABASE_NOW_6, SqliteStore, append_review_reason, database_instant,
    instant_from_micros, micros, status_list, unavailable,
};
use super::{AttemptStore, CallerTime, StoreError, micros_of};
use crate::domain::{Attempt, AttemptId, AttemptKind, AttemptStatus};

#[async_trait]
impl InboxStore for SqliteStore {
    async fn insert_event(&self, event: &NewInboxEvent) -> Result<InboxInsert, StoreError> {
        let inserted = sqlx::query(&format!(
            "INSERT INTO webhook_inbox (
                event_id, event_type, object_id, event_created_at, payload, received_at)
             VALUES (?1, ?2, ?3, ?4, ?5, {DATABASE_NOW_6})
             ON CONFLICT (event_id) DO NOTHING",
        ))
        .bind(&event.event_id)
        .bind(&event.event_type)
        .bind(event.object_id.as_deref())
        .bind(micros(event.event_created_at))
        .bind(&event.payload)
        .bind(event.time.shift_micros())
        .execute(self.pool())
        .await
        .map_err(unavailable)?;
        Ok(if inserted.rows_affected() == 1 {
            InboxInsert::Inserted
        } else {
            InboxInsert::AlreadyReceived
        })
    }

    async fn claim_events(&self, claim: Claim, batch_max: u32) -> Result<Vec<InboxEvent>, StoreError> {
        // One statement: it takes the database's write lock before its subquery reads, so a
        // concurrent claimer waits (up to busy_timeout) and then sees these claims (as
        // `store::SqliteStore::claim_due` does for attempts). A behaviour test races two workers.
        // The clock is the database's (see `Claim`), as for attempts' leases.
        let rows = sqlx::query(&format!(
            "UPDATE webhook_inbox
             SET claim_owner = ?1, claim_expires_at = {DATABASE_NOW_3} + ?2, claim_count = claim_count + 1
             WHERE event_id IN (
                SELECT event_id FROM webhook_inbox
                WHERE processed_at IS NULL
                  AND (claim_expires_at IS NULL OR claim_expires_at <= {DATABASE_NOW_3})
                ORDER BY received_at, event_id
                LIMIT ?4)
             RETURNING event_id, event_type, object_id, event_created_at, payload, received_at,
                       claim_count"
        ))
        .bind(claim.owner.as_uuid())
        .bind(micros_of(claim.duration))
        .bind(claim.time.shift_micros())
        .bind(i64::from(batch_max))
        .fetch_all(self.pool())
        .await
        .map_err(unavailable)?;
        let mut events = rows
            .iter()
            .map(inbox_event_from_row)
            .collect::<Result<Vec<_>, _>>()?;
        // RETURNING has no order: process in arrival order.
        events.sort_by(|a, b| {
            a.received_at
                .cmp(&b.received_at)
                .then_with(|| a.event_id.cmp(&b.event_id))
        });
        Ok(events)
    }

    async fn find_attempt_for_payment(
        &self,
        provider_payment_id: &str,
        attempt_id: Option<AttemptId>,
    ) -> Result<Option<Attempt>, StoreError> {
        // The attempt that last sent the object (see the PostgreSQL statement for why).
        let by_object = sqlx::query(
            "SELECT * FROM payment_attempts
             WHERE kind = 'charge' AND (provider_payment_id = ?1 OR confirms_payment_id = ?1)
             ORDER BY generation DESC, created_at DESC LIMIT 1",
        )
        .bind(provider_payment_id)
        .fetch_optional(self.pool())
        .await
        .map_err(unavailable)
        .and_then(optional_attempt)?;
        match (by_object, attempt_id) {
            (Some(attempt), _) => Ok(Some(attempt)),
            (None, Some(attempt_id)) => AttemptStore::find_by_id(self, None, attempt_id).await,
            (None, None) => Ok(None),
        }
    }

    async fn find_attempt_for_refund(
        &self,
        provider_refund_id: &str,
        attempt_id: Option<AttemptId>,
    ) -> Result<Option<Attempt>, StoreError> {
        let by_object = sqlx::query(
            "SELECT * FROM payment_attempts WHERE provider_payment_id = ?1 AND kind = 'refund'
             ORDER BY created_at LIMIT 1",
        )
        .bind(provider_refund_id)
        .fetch_optional(self.pool())
        .await
        .map_err(unavailable)
        .and_then(optional_attempt)?;
        if by_object.is_some() {
            return Ok(by_object);
        }
        let Some(attempt_id) = attempt_id else {
            return Ok(None);
        };
        let named = AttemptStore::find_by_id(self, None, attempt_id).await?;
        Ok(named.filter(|attempt| attempt.kind == AttemptKind::Refund))
    }

    async fn settle_event(&self, settle: &SettleEvent) -> Result<Option<InboxOutcome>, StoreError> {
        // BEGIN IMMEDIATE: the write lock before the claim check, PostgreSQL's FOR UPDATE of the
        // inbox row (and of every attempt row this transaction may touch).
        let mut tx = self
            .pool()
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(unavailable)?;
        // The settle's one instant, read off the database's clock with the claim check: every
        // column it writes carries it.
        let held: Option<i64> = sqlx::query_scalar(&format!(
            "SELECT {DATABASE_NOW_3} FROM webhook_inbox
             WHERE event_id = ?1 AND claim_owner = ?2 AND processed_at IS NULL",
        ))
        .bind(&settle.event_id)
        .bind(settle.owner.as_uuid())
        .bind(settle.time.shift_micros())
        .fetch_optional(&mut *tx)
        .await
        .map_err(unavailable)?;
        let Some(now) = held else {
            tx.rollback().await.map_err(unavailable)?;
            return Ok(None);
        };
        let now = database_instant(now)?;
        let first_event = match &settle.dedup_key {
            Some((object_id, event_type)) => {
                Some(record_dedup_key(&mut tx, object_id, event_type, &settle.event_id, now).await?)
            }
            None => None,
        };
        let (outcome, attempt_id, detail) = match first_event {
            Some(first) if first != settle.event_id => (
                InboxOutcome::Duplicate,
                settlement_attempt(&settle.settlement),
                Some(format!("duplicate of {first}")),
            ),
            _ => apply_settlement(&mut tx, &settle.settlement, now).await?,
        };
        sqlx::query(
            "UPDATE webhook_inbox
             SET processed_at = ?2, outcome = ?3, attempt_id = ?4, detail = ?5,
                 claim_owner = NULL, claim_expires_at = NULL
             WHERE event_id = ?1",
        )
        .bind(&settle.event_id)
        .bind(micros(now))
        .bind(outcome.as_str())
        .bind(attempt_id.map(AttemptId::as_uuid))
        .bind(detail)
        .execute(&mut *tx)
        .await
        .map_err(unavailable)?;
        tx.commit().await.map_err(unavailable)?;
        Ok(Some(outcome))
    }

    async fn inbox_stats(&self, time: CallerTime) -> Result<InboxStats, StoreError> {
        let row = sqlx::query(&format!(
            "SELECT count(*) AS unprocessed, min(received_at) AS oldest, {DATABASE_NOW_1} AS database_now
             FROM webhook_inbox WHERE processed_at IS NULL",
        ))
        .bind(time.shift_micros())
        .fetch_one(self.pool())
        .await
        .map_err(unavailable)?;
        let unprocessed: i64 = row.try_get("unprocessed").map_err(unavailable)?;
        let oldest: Option<i64> = row.try_get("oldest").map_err(unavailable)?;
        let database_now: i64 = row.try_get("database_now").map_err(unavailable)?;
        Ok(InboxStats {
            unprocessed: u64::try_from(unprocessed).unwrap_or_default(),
            oldest_unprocessed_received_at: oldest
                .map(instant_from_micros)
                .transpose()
                .map_err(|error| StoreError::Corrupt(format!("oldest inbox event: {error}")))?,
            database_now: database_instant(database_now)?,
        })
    }

    async fn prune_processed(
        &self,
        retention: chrono::Duration,
        time: CallerTime,
        batch_max: u32,
    ) -> Result<PruneCounts, StoreError> {
        let cutoff_shift_us = time.shift_micros().saturating_sub(micros_of(retention));
        // Bounded deletes, each its own short statement holding the write lock briefly. No
        // SKIP LOCKED: a settle in progress holds the write lock, and this waits for it.
        let inbox = self
            .delete_batch(&prune_inbox_sql(), cutoff_shift_us, batch_max)
            .await?;
        let dedup = self
            .delete_batch(&prune_dedup_sql(), cutoff_shift_us, batch_max)
            .await?;
        Ok(PruneCounts {
            inbox_rows: inbox,
            dedup_rows: dedup,
        })
    }
}

/// One batch of processed inbox rows received before the cutoff (`?1`: its distance from the
/// database's clock, microseconds), at most `?2`.
fn prune_inbox_sql() -> String {
    format!(
        "DELETE FROM webhook_inbox WHERE event_id IN (
            SELECT event_id FROM webhook_inbox
            WHERE processed_at IS NOT NULL AND received_at < {DATABASE_NOW_1}
            ORDER BY received_at LIMIT ?2)"
    )
}

/// One batch of de-duplication keys recorded before the cutoff, as [`prune_inbox_sql`].
fn prune_dedup_sql() -> String {
    format!(
        "DELETE FROM webhook_dedup WHERE (object_id, event_type) IN (
            SELECT object_id, event_type FROM webhook_dedup
            WHERE recorded_at < {DATABASE_NOW_1}
            ORDER BY recorded_at LIMIT ?2)"
    )
}

impl SqliteStore {
    /// Runs one bounded delete taking `?1` (the cutoff's distance from the database's clock, in
    /// microseconds) and `?2` (batch size); returns rows deleted.
    async fn delete_batch(&self, sql: &str, cutoff_shift_us: i64, batch_max: u32) -> Result<u64, StoreError> {
        let deleted = sqlx::query(sql)
            .bind(cutoff_shift_us)
            .bind(i64::from(batch_max))
            .execute(self.pool())
            .await
            .map_err(unavailable)?;
        Ok(deleted.rows_affected())
    }
}

/// Records `(object, type)` for this event unless another event holds it; returns the id of the
/// event that holds it (this one when it was first). Under the transaction's write lock nobody
/// else can insert the key between the insert and the read.
async fn record_dedup_key(
    tx: &mut Transaction<'_, Sqlite>,
    object_id: &str,
    event_type: &str,
    event_id: &str,
    now: DateTime<Utc>,
) -> Result<String, StoreError> {
    sqlx::query(
        "INSERT INTO webhook_dedup (object_id, event_type, event_id, recorded_at)
         VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (object_id, event_type) DO NOTHING",
    )
    .bind(object_id)
    .bind(event_type)
    .bind(event_id)
    .bind(micros(now))
    .execute(&mut **tx)
    .await
    .map_err(unavailable)?;
    sqlx::query_scalar(
        "SELECT event_id FROM webhook_dedup WHERE object_id = ?1 AND event_type = ?2",
    )
    .bind(object_id)
    .bind(event_type)
    .fetch_one(&mut **tx)
    .await
    .map_err(unavailable)
}

fn settlement_attempt(settlement: &Settlement) -> Option<AttemptId> {
    match settlement {
        Settlement::Apply(update) => Some(update.attempt_id),
        Settlement::Flag { attempt_id, .. } | Settlement::Dispute { attempt_id, .. } => {
            Some(*attempt_id)
        }
        Settlement::Refunds(updates) => updates.first().map(|update| update.attempt_id),
        Settlement::Record { .. } => None,
    }
}

/// The review-reason appends of a flag (`Conflict`, any attempt) and of a dispute (charges only).
const FLAG_ANY: &str = concat!(
    "UPDATE payment_attempts SET review_reason = ",
    append_review_reason!("2"),
    ", updated_at = ?3 WHERE id = ?1"
);
const FLAG_CHARGE: &str = concat!(
    "UPDATE payment_attempts SET review_reason = ",
    append_review_reason!("2"),
    ", updated_at = ?3 WHERE id = ?1 AND kind = 'charge'"
);

async fn append_reason(
    tx: &mut Transaction<'_, Sqlite>,
    statement: &'static str,
    attempt_id: AttemptId,
    review_reason: &str,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    sqlx::query(statement)
        .bind(attempt_id.as_uuid())
        .bind(review_reason)
        .bind(micros(now))
        .execute(&mut **tx)
        .await
        .map_err(unavailable)?;
    Ok(())
}

async fn apply_settlement(
    tx: &mut Transaction<'_, Sqlite>,
    settlement: &Settlement,
    now: DateTime<Utc>,
) -> Result<(InboxOutcome, Option<AttemptId>, Option<String>), StoreError> {
    match settlement {
        Settlement::Apply(update) => {
            if apply_payment_update(tx, update, now).await? {
                return Ok((InboxOutcome::Applied, Some(update.attempt_id), None));
            }
            if let Some(reason) = &update.review_reason_if_failed
                && flag_if_failed(tx, update.attempt_id, reason, now).await?
            {
                return Ok((
                    InboxOutcome::Flagged,
                    Some(update.attempt_id),
                    Some(reason.clone()),
                ));
            }
            Ok((InboxOutcome::Stale, Some(update.attempt_id), None))
        }
        Settlement::Flag {
            attempt_id,
            review_reason,
        } => {
            append_reason(tx, FLAG_ANY, *attempt_id, review_reason, now).await?;
            Ok((
                InboxOutcome::Conflict,
                Some(*attempt_id),
                Some(review_reason.clone()),
            ))
        }
        Settlement::Refunds(updates) => apply_refund_updates(tx, updates, now).await,
        Settlement::Dispute {
            attempt_id,
            review_reason,
        } => {
            // Only charges are disputed; the reason is appended once however often it arrives.
            append_reason(tx, FLAG_CHARGE, *attempt_id, review_reason, now).await?;
            Ok((
                InboxOutcome::Disputed,
                Some(*attempt_id),
                Some(review_reason.clone()),
            ))
        }
        Settlement::Record { outcome, detail } => Ok((*outcome, None, detail.clone())),
    }
}

/// Applies each refund's move; the event's outcome is the strongest that happened
/// (failed after success, then applied, else stale).
async fn apply_refund_updates(
    tx: &mut Transaction<'_, Sqlite>,
    updates: &[RefundUpdate],
    now: DateTime<Utc>,
) -> Result<(InboxOutcome, Option<AttemptId>, Option<String>), StoreError> {
    let mut event = RefundEventOutcome::default();
    for update in updates {
        if apply_refund_update(tx, update, now).await? {
            event.moved();
        } else if update.status == AttemptStatus::Failed && fail_succeeded_refund(tx, update, now).await? {
            event.failed_after_success(update);
        }
    }
    Ok(event.finish(updates))
}

/// A refund attempt moves forward exactly like a payment (`status IN (allowed sources)`), and
/// binds the provider's refund id if it had none.
async fn apply_refund_update(
    tx: &mut Transaction<'_, Sqlite>,
    update: &RefundUpdate,
    now: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let moved = sqlx::query(concat!(
        "UPDATE payment_attempts SET
            status = ?2,
            provider_payment_id = COALESCE(provider_payment_id, ?3),
            provider_status = ?4,
            failure_code = ?5,
            failure_message = ?6,
            review_reason = ",
        append_review_reason!("9"),
        ",
            updated_at = ?7
         WHERE id = ?1 AND kind = 'refund' AND status IN (SELECT value FROM json_each(?8))
           AND (provider_payment_id IS NULL OR provider_payment_id = ?3)"
    ))
    .bind(update.attempt_id.as_uuid())
    .bind(update.status.as_str())
    .bind(&update.provider_refund_id)
    .bind(&update.provider_status)
    .bind(update.failure.as_ref().map(|failure| failure.code.as_str()))
    .bind(update.failure.as_ref().map(|failure| failure.message.as_str()))
    .bind(micros(now))
    .bind(status_list(&update.status.allowed_sources()))
    .bind(update.review_reason.as_deref())
    .execute(&mut **tx)
    .await
    .map_err(unavailable)?;
    Ok(moved.rows_affected() == 1)
}

/// The one move out of `succeeded` (ARCHITECTURE.md): a refund attempt, bound to this very
/// provider refund, that the provider now reports failed. Guarded by kind, status and the refund
/// id; the `payment_attempts_keep_succeeded` trigger allows it only with
/// `failed_after_success_at` set.
async fn fail_succeeded_refund(
    tx: &mut Transaction<'_, Sqlite>,
    update: &RefundUpdate,
    now: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let moved = sqlx::query(
        "UPDATE payment_attempts SET
            status = 'failed',
            provider_status = ?3,
            failure_code = ?4,
            failure_message = ?5,
            failed_after_success_at = ?6,
            updated_at = ?6
         WHERE id = ?1 AND kind = 'refund' AND status = 'succeeded'
           AND provider_payment_id = ?2",
    )
    .bind(update.attempt_id.as_uuid())
    .bind(&update.provider_refund_id)
    .bind(&update.provider_status)
    .bind(update.failure.as_ref().map(|failure| failure.code.as_str()))
    .bind(update.failure.as_ref().map(|failure| failure.message.as_str()))
    .bind(micros(now))
    .execute(&mut **tx)
    .await
    .map_err(unavailable)?;
    Ok(moved.rows_affected() == 1)
}

/// The monotonic guard, in the database: the row moves only from a state the target state may
/// be reached from, whatever the worker believed. Every expression in SET reads the row as it
/// was before the update (`action_started_at` compares the old status). No lease is taken.
async fn apply_payment_update(
    tx: &mut Transaction<'_, Sqlite>,
    update: &PaymentUpdate,
    now: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let moved = sqlx::query(concat!(
        "UPDATE payment_attempts SET
            status = ?2,
            provider_payment_id = COALESCE(provider_payment_id, ?3),
            provider_status = ?4,
            failure_code = ?5,
            failure_message = ?6,
            next_action_type = ?7,
            next_action_url = ?8,
            review_reason = ",
        append_review_reason!("9"),
        ",
            action_started_at = CASE WHEN ?2 = 'requires_action' AND status <> 'requires_action'
                                     THEN ?10 ELSE action_started_at END,
            updated_at = ?10
         WHERE id = ?1 AND status IN (SELECT value FROM json_each(?11))
           AND (provider_payment_id IS NULL OR provider_payment_id = ?3)"
    ))
    .bind(update.attempt_id.as_uuid())
    .bind(update.status.as_str())
    .bind(&update.provider_payment_id)
    .bind(&update.provider_status)
    .bind(update.failure.as_ref().map(|failure| failure.code.as_str()))
    .bind(update.failure.as_ref().map(|failure| failure.message.as_str()))
    .bind(update.next_action.as_ref().map(|action| action.kind.as_str()))
    .bind(
        update
            .next_action
            .as_ref()
            .and_then(|action| action.redirect_url.as_deref()),
    )
    .bind(update.review_reason.as_deref())
    .bind(micros(now))
    .bind(status_list(&update.status.allowed_sources()))
    .execute(&mut **tx)
    .await
    .map_err(unavailable)?;
    Ok(moved.rows_affected() == 1)
}

/// Flags a `failed` attempt with `reason` (added to an earlier reason, never replacing it); the
/// status stays `failed`. `false` when the attempt is not failed, or already carries this reason.
async fn flag_if_failed(
    tx: &mut Transaction<'_, Sqlite>,
    attempt_id: AttemptId,
    reason: &str,
    now: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let flagged = sqlx::query(concat!(
        "UPDATE payment_attempts SET review_reason = ",
        append_review_reason!("2"),
        ", updated_at = ?3
         WHERE id = ?1 AND status = ?4
           AND instr(COALESCE(review_reason, ''), ?2) = 0"
    ))
    .bind(attempt_id.as_uuid())
    .bind(reason)
    .bind(micros(now))
    .bind(AttemptStatus::Failed.as_str())
    .execute(&mut **tx)
    .await
    .map_err(unavailable)?;
    Ok(flagged.rows_affected() == 1)
}

fn inbox_event_from_row(row: &SqliteRow) -> Result<InboxEvent, StoreError> {
    let event_id: String = row.try_get("event_id").map_err(unavailable)?;
    let corrupt = |error: String| StoreError::Corrupt(format!("inbox event {event_id}: {error}"));
    let instant = |column: &str| -> Result<DateTime<Utc>, StoreError> {
        let value: i64 = row.try_get(column).map_err(|error| corrupt(error.to_string()))?;
        instant_from_micros(value).map_err(|error| corrupt(format!("{column}: {error}")))
    };
    let claim_count: i64 = row
        .try_get("claim_count")
        .map_err(|error| corrupt(error.to_string()))?;
    Ok(InboxEvent {
        event_type: row.try_get("event_type").map_err(|error| corrupt(error.to_string()))?,
        object_id: row.try_get("object_id").map_err(|error| corrupt(error.to_string()))?,
        event_created_at: instant("event_created_at")?,
        payload: row.try_get("payload").map_err(|error| corrupt(error.to_string()))?,
        received_at: instant("received_at")?,
        claim_count: u32::try_from(claim_count).unwrap_or_default(),
        event_id,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::store::sqlite::SqliteStoreOptions;

    async fn migrated_store(dir: &std::path::Path) -> SqliteStore {
        let options = SqliteStoreOptions {
            connections_max: 1,
            acquire_timeout: Duration::from_secs(5),
            busy_timeout: Duration::from_secs(5),
        };
        let store = SqliteStore::open(SqliteStore::file(&dir.join("unit.sqlite")), &options).await.unwrap();
        store.migrate().await.unwrap();
        store
    }

    /// The lines of `EXPLAIN QUERY PLAN statement`, its `parameters` bound to zero.
    async fn plan_details(store: &SqliteStore, statement: &str, parameters: usize) -> Vec<String> {
        let mut query = sqlx::query_as::<_, (i64, i64, i64, String)>(statement);
        for _ in 0..parameters {
            query = query.bind(0_i64);
        }
        let plan = query.fetch_all(store.pool()).await.unwrap();
        plan.into_iter().map(|(_, _, _, detail)| detail).collect()
    }

    #[tokio::test]
    async fn the_claim_and_the_gauges_read_only_unprocessed_rows_through_their_partial_index() {
        let dir = tempfile::tempdir().unwrap();
        let store = migrated_store(dir.path()).await;
        for statement in [
            "EXPLAIN QUERY PLAN SELECT event_id FROM webhook_inbox
             WHERE processed_at IS NULL AND (claim_expires_at IS NULL OR claim_expires_at <= ?1)
             ORDER BY received_at, event_id LIMIT 10",
            "EXPLAIN QUERY PLAN SELECT count(*), min(received_at) FROM webhook_inbox
             WHERE processed_at IS NULL AND ?1 IS NOT NULL",
        ] {
            let details = plan_details(&store, statement, 1).await;
            assert!(
                details.iter().any(|detail| detail.contains("webhook_inbox_unprocessed")),
                "{statement}: {details:?}"
            );
        }
    }

    /// Retention's cutoff is an expression of the database's clock, constant in its statement:
    /// each delete still walks its table's time index rather than the whole table.
    #[tokio::test]
    async fn retention_reads_only_rows_older_than_its_cutoff_through_the_time_indexes() {
        let dir = tempfile::tempdir().unwrap();
        let store = migrated_store(dir.path()).await;
        for (delete, range_on_index) in [
            (prune_inbox_sql(), "USING INDEX webhook_inbox_processed (received_at<"),
            (prune_dedup_sql(), "USING INDEX webhook_dedup_recorded (recorded_at<"),
        ] {
            let statement = format!("EXPLAIN QUERY PLAN {delete}");
            let details = plan_details(&store, &statement, 2).await;
            assert!(
                details.iter().any(|detail| detail.contains(range_on_index)),
                "{statement}: {details:?}"
            );
        }
    }
}
