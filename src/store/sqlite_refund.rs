//! SQLite's refund statements. The PostgreSQL function's steps run in one `BEGIN IMMEDIATE`
//! transaction: it takes the database's one write lock before its first read, so no other
//! refund of the charge (no other write at all) can come between the sum and the insert — the
//! embedded counterpart of the charge's `FOR UPDATE`.

use std::collections::HashMap;

use sqlx::sqlite::SqliteRow;

use super::refund::{NewRefund, REFUND_TOTALS_PARENTS_MAX, RefundInsertOutcome, RefundRefusal, RefundTotals, totals_from_rows};
use super::row::attempt_from_row;
use super::sqlite::{SqliteStore, unavailable};
use super::{StoreError, micros_of};
use crate::domain::{AttemptId, AttemptStatus, ChargeSelector};

const OPERATION_ROW: &str = "SELECT * FROM payment_attempts WHERE consumer = ?1 AND operation_key = ?2
     ORDER BY generation DESC LIMIT 1";

impl SqliteStore {
    pub(super) async fn insert_pending_refund_transaction(
        &self,
        new: &NewRefund,
    ) -> Result<RefundInsertOutcome, StoreError> {
        let metadata = serde_json::to_string(new.metadata.entries())
            .map_err(|error| StoreError::Corrupt(error.to_string()))?;
        let mut transaction = self.pool().begin_with("BEGIN IMMEDIATE").await.map_err(unavailable)?;
        let existing = sqlx::query(OPERATION_ROW)
            .bind(new.consumer.as_str())
            .bind(new.operation_key.as_str())
            .fetch_optional(&mut *transaction)
            .await
            .map_err(unavailable)?;
        if let Some(row) = existing {
            // Dropping the transaction rolls back a read-only transaction: nothing to keep.
            return Ok(RefundInsertOutcome::Existing(attempt_from_row(&row)?));
        }
        let parent: Option<SqliteRow> = match &new.charge {
            ChargeSelector::AttemptId(id) => sqlx::query(
                "SELECT * FROM payment_attempts WHERE id = ?1 AND consumer = ?2 AND kind = 'charge'",
            )
            .bind(id.as_uuid())
            .bind(new.consumer.as_str()),
            ChargeSelector::OperationKey(key) => sqlx::query(
                "SELECT * FROM payment_attempts
                 WHERE consumer = ?2 AND operation_key = ?1 AND kind = 'charge'
                 ORDER BY (status = 'succeeded') DESC, generation DESC LIMIT 1",
            )
            .bind(key.as_str())
            .bind(new.consumer.as_str()),
        }
        .fetch_optional(&mut *transaction)
        .await
        .map_err(unavailable)?;
        let Some(parent) = parent.map(|row| attempt_from_row(&row)).transpose()? else {
            return Ok(RefundInsertOutcome::Refused(RefundRefusal::ChargeNotFound));
        };
        if parent.status != AttemptStatus::Succeeded {
            return Ok(RefundInsertOutcome::Refused(RefundRefusal::ChargeNotSucceeded {
                charge_attempt_id: parent.id,
                status: parent.status,
            }));
        }
        let held: i64 = sqlx::query_scalar(
            "SELECT COALESCE(sum(amount_minor), 0) FROM payment_attempts
             WHERE parent_attempt_id = ?1 AND status IN ('pending', 'requires_action', 'succeeded')",
        )
        .bind(parent.id.as_uuid())
        .fetch_one(&mut *transaction)
        .await
        .map_err(unavailable)?;
        let left = parent.params.amount_minor - held;
        if left <= 0 {
            return Ok(RefundInsertOutcome::Refused(RefundRefusal::ChargeFullyRefunded {
                charge_attempt_id: parent.id,
                charged_minor: parent.params.amount_minor,
            }));
        }
        let amount = new.amount_minor.unwrap_or(left);
        if amount > left {
            return Ok(RefundInsertOutcome::Refused(RefundRefusal::ExceedsCharge {
                charge_attempt_id: parent.id,
                requested_minor: amount,
                refundable_minor: left,
            }));
        }
        // ?12 is the caller's clock, ?13 the shift of the database's.
        let inserted = sqlx::query(
            "WITH clock AS (SELECT (CAST(unixepoch('subsec') * 1000000 AS INTEGER) + ?13) AS database_now)
             INSERT INTO payment_attempts (
                id, consumer, operation_key, kind, parent_attempt_id, refund_reason, amount_minor,
                currency, payment_method, metadata, fingerprint, status, provider, idempotency_key,
                generation, key_window_started_at, create_sent_until, lease_owner,
                lease_expires_at, next_check_at, created_at, updated_at)
             SELECT ?1, ?2, ?3, 'refund', ?4, ?5, ?6, ?7, ?8, ?9, ?10, 'pending', ?11, ?14, 0,
                    min(?12, database_now), database_now + ?16, ?15, database_now + ?16,
                    database_now + ?17, database_now, database_now
             FROM clock WHERE true
             ON CONFLICT DO NOTHING
             RETURNING *",
        )
        .bind(new.id.as_uuid())
        .bind(new.consumer.as_str())
        .bind(new.operation_key.as_str())
        .bind(parent.id.as_uuid())
        .bind(new.reason.map(|reason| reason.as_str()))
        .bind(amount)
        .bind(parent.params.currency.code())
        .bind(parent.params.payment_method.as_str())
        .bind(metadata)
        .bind(new.fingerprint.as_str())
        .bind(new.provider)
        .bind(new.time.now.timestamp_micros())
        .bind(new.time.shift_micros())
        .bind(new.idempotency_key.as_str())
        .bind(new.lease_owner.as_uuid())
        .bind(micros_of(new.lease_duration))
        .bind(micros_of(new.recovery_grace))
        .fetch_optional(&mut *transaction)
        .await
        .map_err(unavailable)?;
        let Some(row) = inserted else {
            return Err(StoreError::Corrupt(format!(
                "insert of refund operation {:?} conflicted inside its write transaction",
                new.operation_key.as_str()
            )));
        };
        let attempt = attempt_from_row(&row)?;
        transaction.commit().await.map_err(unavailable)?;
        Ok(RefundInsertOutcome::Inserted(attempt))
    }

    pub(super) async fn refund_totals_statement(
        &self,
        charge_ids: &[AttemptId],
    ) -> Result<HashMap<AttemptId, RefundTotals>, StoreError> {
        assert!(charge_ids.len() <= REFUND_TOTALS_PARENTS_MAX, "refund totals for {} charges", charge_ids.len());
        if charge_ids.is_empty() {
            return Ok(HashMap::new());
        }
        // One placeholder per id (ids are 16-byte blobs; SQLite has no array parameter), bounded
        // by REFUND_TOTALS_PARENTS_MAX, far under SQLite's parameter limit.
        let placeholders = vec!["?"; charge_ids.len()].join(", ");
        let sql = format!(
            "SELECT parent_attempt_id,
                    COALESCE(sum(CASE WHEN status = 'succeeded' THEN amount_minor END), 0)
                        AS refunded_minor,
                    COALESCE(sum(CASE WHEN status IN ('pending', 'requires_action')
                                      THEN amount_minor END), 0) AS pending_minor
             FROM payment_attempts
             WHERE parent_attempt_id IN ({placeholders})
             GROUP BY parent_attempt_id"
        );
        let mut query = sqlx::query(&sql);
        for id in charge_ids {
            query = query.bind(id.as_uuid());
        }
        let rows = query.fetch_all(self.pool()).await.map_err(unavailable)?;
        totals_from_rows(&rows)
    }
}
