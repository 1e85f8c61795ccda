//! `InboxStore` on PostgreSQL. The settle of one event is one short transaction (no provider
//! call happens inside it): claim check, de-duplication key, guarded attempt update, processed
//! mark — so a worker killed at any point leaves either all of it or none of it.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{Postgres, Row, Transaction};

use super::inbox::{
    Claim, InboxEvent, InboxInsert, InboxOutcome, InboxStats, InboxStore, NewInboxEvent,
    PaymentUpdate, PruneCounts, RefundEventOutcome, RefundUpdate, SettleEvent, Settlement,
};
use super::postgres::{status_names, unavailable};
use super::row::optional_attempt;
use super::{AttemptStore, CallerTime, PostgresStore, StoreError, micros_of};
use crate::domain::{Attempt, AttemptId, AttemptKind, AttemptStatus};

#[async_trait]
impl InboxStore for PostgresStore {
    async fn insert_event(&self, event: &NewInboxEvent) -> Result<InboxInsert, StoreError> {
        let inserted = sqlx::query(
            "INSERT INTO webhook_inbox (
                event_id, event_type, object_id, event_created_at, payload, received_at)
             VALUES ($1, $2, $3, $4, $5, now() + $6 * interval '1 microsecond')
             ON CONFLICT (event_id) DO NOTHING",
        )
        .bind(&event.event_id)
        .bind(&event.event_type)
        .bind(event.object_id.as_deref())
        .bind(event.event_created_at)
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
        // SKIP LOCKED: concurrent workers take different rows instead of queueing on the same
        // ones; the claim then keeps the rows theirs after this statement commits. The clock is
        // the database's (see `Claim`).
        let rows = sqlx::query(
            "WITH clock AS (SELECT now() + $3 * interval '1 microsecond' AS database_now)
             UPDATE webhook_inbox
             SET claim_owner = $1,
                 claim_expires_at = clock.database_now + $2 * interval '1 microsecond',
                 claim_count = claim_count + 1
             FROM clock
             WHERE event_id IN (
                SELECT event_id FROM webhook_inbox, clock
                WHERE processed_at IS NULL
                  AND (claim_expires_at IS NULL OR claim_expires_at <= clock.database_now)
                ORDER BY received_at, event_id
                LIMIT $4
                FOR UPDATE OF webhook_inbox SKIP LOCKED)
             RETURNING event_id, event_type, object_id, event_created_at, payload, received_at,
                       claim_count",
        )
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
        // The attempt that last sent the object: an intent re-confirmed by later attempts of its
        // operation (issue 16) is named by each of them (provider_payment_id once answered,
        // confirms_payment_id from the start), and its news is the latest one's; an earlier
        // attempt keeps its decline. A canceled intent is named by no later attempt (the next
        // one creates its own), so its events never move one.
        let by_object = sqlx::query(
            "SELECT * FROM payment_attempts
             WHERE kind = 'charge' AND (provider_payment_id = $1 OR confirms_payment_id = $1)
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
            "SELECT * FROM payment_attempts WHERE provider_payment_id = $1 AND kind = 'refund'
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
        let mut tx = self.pool().begin().await.map_err(unavailable)?;
        // The settle's one instant, read off the database's clock with the claim check (`now()`
        // is the transaction's start): every column it writes carries it.
        let held: Option<DateTime<Utc>> = sqlx::query_scalar(
            "SELECT now() + $3 * interval '1 microsecond' FROM webhook_inbox
             WHERE event_id = $1 AND claim_owner = $2 AND processed_at IS NULL
             FOR UPDATE",
        )
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
             SET processed_at = $2, outcome = $3, attempt_id = $4, detail = $5,
                 claim_owner = NULL, claim_expires_at = NULL
             WHERE event_id = $1",
        )
        .bind(&settle.event_id)
        .bind(now)
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
        let row = sqlx::query(
            "SELECT count(*) AS unprocessed, min(received_at) AS oldest,
                    now() + $1 * interval '1 microsecond' AS database_now
             FROM webhook_inbox WHERE processed_at IS NULL",
        )
        .bind(time.shift_micros())
        .fetch_one(self.pool())
        .await
        .map_err(unavailable)?;
        let unprocessed: i64 = row.try_get("unprocessed").map_err(unavailable)?;
        Ok(InboxStats {
            unprocessed: u64::try_from(unprocessed).unwrap_or_default(),
            oldest_unprocessed_received_at: row.try_get("oldest").map_err(unavailable)?,
            database_now: row.try_get("database_now").map_err(unavailable)?,
        })
    }

    async fn prune_processed(
        &self,
        retention: chrono::Duration,
        time: CallerTime,
        batch_max: u32,
    ) -> Result<PruneCounts, StoreError> {
        let cutoff_shift_us = time.shift_micros().saturating_sub(micros_of(retention));
        // Bounded deletes, each its own short statement, so retention never holds many row
        // locks; SKIP LOCKED keeps it off rows a worker is settling.
        let inbox = self
            .delete_batch(
                "DELETE FROM webhook_inbox WHERE event_id IN (
                    SELECT event_id FROM webhook_inbox
                    WHERE processed_at IS NOT NULL
                      AND received_at < now() + $1 * interval '1 microsecond'
                    ORDER BY received_at LIMIT $2 FOR UPDATE SKIP LOCKED)",
                cutoff_shift_us,
                batch_max,
            )
            .await?;
        let dedup = self
            .delete_batch(
                "DELETE FROM webhook_dedup WHERE (object_id, event_type) IN (
                    SELECT object_id, event_type FROM webhook_dedup
                    WHERE recorded_at < now() + $1 * interval '1 microsecond'
                    ORDER BY recorded_at LIMIT $2 FOR UPDATE SKIP LOCKED)",
                cutoff_shift_us,
                batch_max,
            )
            .await?;
        Ok(PruneCounts {
            inbox_rows: inbox,
            dedup_rows: dedup,
        })
    }
}

impl PostgresStore {
    /// Runs one bounded delete taking `$1` (the cutoff's distance from the database's clock, in
    /// microseconds) and `$2` (batch size); returns rows deleted.
    async fn delete_batch(
        &self,
        sql: &'static str,
        cutoff_shift_us: i64,
        batch_max: u32,
    ) -> Result<u64, StoreError> {
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
/// event that holds it (this one when it was first). A concurrent insert of the same key waits
/// for the other transaction, so exactly one event is ever first.
async fn record_dedup_key(
    tx: &mut Transaction<'_, Postgres>,
    object_id: &str,
    event_type: &str,
    event_id: &str,
    now: DateTime<Utc>,
) -> Result<String, StoreError> {
    let row = sqlx::query(
        "INSERT INTO webhook_dedup (object_id, event_type, event_id, recorded_at)
         VALUES ($1, $2, $3, $4)
         ON CONFLICT (object_id, event_type) DO UPDATE SET event_id = webhook_dedup.event_id
         RETURNING event_id",
    )
    .bind(object_id)
    .bind(event_type)
    .bind(event_id)
    .bind(now)
    .fetch_one(&mut **tx)
    .await
    .map_err(unavailable)?;
    row.try_get("event_id").map_err(unavailable)
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

async fn apply_settlement(
    tx: &mut Transaction<'_, Postgres>,
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
            sqlx::query(
                "UPDATE payment_attempts
                 SET review_reason = append_review_reason(review_reason, $2), updated_at = $3
                 WHERE id = $1",
            )
            .bind(attempt_id.as_uuid())
            .bind(review_reason)
            .bind(now)
            .execute(&mut **tx)
            .await
            .map_err(unavailable)?;
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
            sqlx::query(
                "UPDATE payment_attempts
                 SET review_reason = append_review_reason(review_reason, $2), updated_at = $3
                 WHERE id = $1 AND kind = 'charge'",
            )
            .bind(attempt_id.as_uuid())
            .bind(review_reason)
            .bind(now)
            .execute(&mut **tx)
            .await
            .map_err(unavailable)?;
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
    tx: &mut Transaction<'_, Postgres>,
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

/// A refund attempt moves forward exactly like a payment (`status = ANY(allowed sources)`), and
/// binds the provider's refund id if it had none.
async fn apply_refund_update(
    tx: &mut Transaction<'_, Postgres>,
    update: &RefundUpdate,
    now: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let moved = sqlx::query(
        "UPDATE payment_attempts SET
            status = $2,
            provider_payment_id = COALESCE(provider_payment_id, $3),
            provider_status = $4,
            failure_code = $5,
            failure_message = $6,
            review_reason = append_review_reason(review_reason, $9),
            updated_at = $7
         WHERE id = $1 AND kind = 'refund' AND status = ANY($8)
           AND (provider_payment_id IS NULL OR provider_payment_id = $3)",
    )
    .bind(update.attempt_id.as_uuid())
    .bind(update.status.as_str())
    .bind(&update.provider_refund_id)
    .bind(&update.provider_status)
    .bind(update.failure.as_ref().map(|failure| failure.code.as_str()))
    .bind(update.failure.as_ref().map(|failure| failure.message.as_str()))
    .bind(now)
    .bind(status_names(&update.status.allowed_sources()))
    .bind(update.review_reason.as_deref())
    .execute(&mut **tx)
    .await
    .map_err(unavailable)?;
    Ok(moved.rows_affected() == 1)
}

/// The one move out of `succeeded` (SEMANTICS invariant 8's exception, ARCHITECTURE.md): a
/// refund attempt, bound to this very provider refund, that the provider now reports failed.
/// Guarded by kind, status and the refund id, so no charge and no other refund can take it.
async fn fail_succeeded_refund(
    tx: &mut Transaction<'_, Postgres>,
    update: &RefundUpdate,
    now: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let moved = sqlx::query(
        "UPDATE payment_attempts SET
            status = 'failed',
            provider_status = $3,
            failure_code = $4,
            failure_message = $5,
            failed_after_success_at = $6,
            updated_at = $6
         WHERE id = $1 AND kind = 'refund' AND status = 'succeeded'
           AND provider_payment_id = $2",
    )
    .bind(update.attempt_id.as_uuid())
    .bind(&update.provider_refund_id)
    .bind(&update.provider_status)
    .bind(update.failure.as_ref().map(|failure| failure.code.as_str()))
    .bind(update.failure.as_ref().map(|failure| failure.message.as_str()))
    .bind(now)
    .execute(&mut **tx)
    .await
    .map_err(unavailable)?;
    Ok(moved.rows_affected() == 1)
}

/// The monotonic guard lives here, in the database: the row moves only from a state the target
/// state may be reached from, whatever the worker believed when it decided. It takes no lease:
/// a provider round that finishes later writes through its own guard and cannot undo this.
async fn apply_payment_update(
    tx: &mut Transaction<'_, Postgres>,
    update: &PaymentUpdate,
    now: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let moved = sqlx::query(
        "UPDATE payment_attempts SET
            status = $2,
            provider_payment_id = COALESCE(provider_payment_id, $3),
            provider_status = $4,
            failure_code = $5,
            failure_message = $6,
            next_action_type = $7,
            next_action_url = $8,
            review_reason = append_review_reason(review_reason, $9),
            action_started_at = CASE WHEN $2 = 'requires_action' AND status <> 'requires_action'
                                     THEN $10 ELSE action_started_at END,
            updated_at = $10
         WHERE id = $1 AND status = ANY($11)
           AND (provider_payment_id IS NULL OR provider_payment_id = $3)",
    )
    .bind(update.attempt_id.as_uuid())
    .bind(update.status.as_str())
    .bind(&update.provider_payment_id)
    .bind(&update.provider_status)
    .bind(update.failure.as_ref().map(|failure| failure.code.as_str()))
    .bind(
        update
            .failure
            .as_ref()
            .map(|failure| failure.message.as_str()),
    )
    .bind(
        update
            .next_action
            .as_ref()
            .map(|action| action.kind.as_str()),
    )
    .bind(
        update
            .next_action
            .as_ref()
            .and_then(|action| action.redirect_url.as_deref()),
    )
    .bind(update.review_reason.as_deref())
    .bind(now)
    .bind(status_names(&update.status.allowed_sources()))
    .execute(&mut **tx)
    .await
    .map_err(unavailable)?;
    Ok(moved.rows_affected() == 1)
}

/// Flags a `failed` attempt with `reason` (added to an earlier reason, never replacing it); the
/// status stays `failed` (states only move forward: the money question goes to a person).
/// `false` when the attempt is not failed, or already carries this reason.
async fn flag_if_failed(
    tx: &mut Transaction<'_, Postgres>,
    attempt_id: AttemptId,
    reason: &str,
    now: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let flagged = sqlx::query(
        "UPDATE payment_attempts
         SET review_reason = append_review_reason(review_reason, $2), updated_at = $3
         WHERE id = $1 AND status = $4
           AND position($2 IN COALESCE(review_reason, '')) = 0",
    )
    .bind(attempt_id.as_uuid())
    .bind(reason)
    .bind(now)
    .bind(AttemptStatus::Failed.as_str())
    .execute(&mut **tx)
    .await
    .map_err(unavailable)?;
    Ok(flagged.rows_affected() == 1)
}

fn inbox_event_from_row(row: &PgRow) -> Result<InboxEvent, StoreError> {
    let event_id: String = row.try_get("event_id").map_err(unavailable)?;
    let corrupt =
        |error: sqlx::Error| StoreError::Corrupt(format!("inbox event {event_id}: {error}"));
    let claim_count: i32 = row.try_get("claim_count").map_err(corrupt)?;
    Ok(InboxEvent {
        event_type: row.try_get("event_type").map_err(corrupt)?,
        object_id: row.try_get("object_id").map_err(corrupt)?,
        event_created_at: row.try_get("event_created_at").map_err(corrupt)?,
        payload: row.try_get("payload").map_err(corrupt)?,
        received_at: row.try_get("received_at").map_err(corrupt)?,
        claim_count: u32::try_from(claim_count).unwrap_or_default(),
        event_id,
    })
}
