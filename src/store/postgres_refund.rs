//! PostgreSQL's refund statements: the pending refund through `insert_pending_refund`
//! (migration 20261204000003), and a page of charges' refund totals.

use std::collections::HashMap;

use sqlx::postgres::PgDatabaseError;
use uuid::Uuid;

use super::postgres::{PostgresStore, unavailable};
use super::refund::{NewRefund, REFUND_TOTALS_PARENTS_MAX, RefundInsertOutcome, RefundTotals, totals_from_rows, refusal_from_code};
use super::row::attempt_from_row;
use super::{StoreError, micros_of};
use crate::domain::{AttemptId, ChargeSelector};

/// The function's refusals: SQLSTATE class `CG`, subclass `R`.
const REFUSAL_PREFIX: &str = "CGR";

impl PostgresStore {
    pub(super) async fn insert_pending_refund_statement(
        &self,
        new: &NewRefund,
    ) -> Result<RefundInsertOutcome, StoreError> {
        let metadata = serde_json::to_value(new.metadata.entries())
            .map_err(|error| StoreError::Corrupt(error.to_string()))?;
        let (charge_id, charge_operation_key) = match &new.charge {
            ChargeSelector::AttemptId(id) => (Some(id.as_uuid()), None),
            ChargeSelector::OperationKey(key) => (None, Some(key.as_str())),
        };
        let row = sqlx::query(
            "SELECT * FROM insert_pending_refund(
                $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)",
        )
        .bind(new.id.as_uuid())
        .bind(new.consumer.as_str())
        .bind(new.operation_key.as_str())
        .bind(charge_id)
        .bind(charge_operation_key)
        .bind(new.amount_minor)
        .bind(new.reason.map(|reason| reason.as_str()))
        .bind(metadata)
        .bind(new.fingerprint.as_str())
        .bind(new.provider)
        .bind(new.idempotency_key.as_str())
        .bind(new.time.now)
        .bind(new.time.shift_micros())
        .bind(new.lease_owner.as_uuid())
        .bind(micros_of(new.lease_duration))
        .bind(micros_of(new.recovery_grace))
        .fetch_optional(self.pool())
        .await;
        let row = match row {
            Ok(row) => row,
            Err(sqlx::Error::Database(error)) if error.code().is_some_and(|code| code.starts_with(REFUSAL_PREFIX)) => {
                let code = error.code().unwrap_or_default().into_owned();
                let detail = error
                    .try_downcast_ref::<PgDatabaseError>()
                    .and_then(PgDatabaseError::detail)
                    .unwrap_or_default()
                    .to_owned();
                return refusal_from_code(&code, &detail)
                    .map(RefundInsertOutcome::Refused)
                    .ok_or_else(|| StoreError::Corrupt(format!("unreadable refund refusal {code} {detail:?}")));
            }
            Err(error) => return Err(unavailable(error)),
        };
        let Some(row) = row else {
            return Err(StoreError::Corrupt(format!(
                "insert of refund operation {:?} conflicted but no row holds it",
                new.operation_key.as_str()
            )));
        };
        let attempt = attempt_from_row(&row)?;
        Ok(if attempt.id == new.id { RefundInsertOutcome::Inserted(attempt) } else { RefundInsertOutcome::Existing(attempt) })
    }

    pub(super) async fn refund_totals_statement(
        &self,
        charge_ids: &[AttemptId],
    ) -> Result<HashMap<AttemptId, RefundTotals>, StoreError> {
        assert!(charge_ids.len() <= REFUND_TOTALS_PARENTS_MAX, "refund totals for {} charges", charge_ids.len());
        if charge_ids.is_empty() {
            return Ok(HashMap::new());
        }
        let ids: Vec<Uuid> = charge_ids.iter().map(|id| id.as_uuid()).collect();
        // Uses payment_attempts_parent; a failed refund (also one failed after it succeeded)
        // counts in neither sum.
        let rows = sqlx::query(
            "SELECT parent_attempt_id,
                    COALESCE(sum(amount_minor) FILTER (WHERE status = 'succeeded'), 0)::bigint
                        AS refunded_minor,
                    COALESCE(sum(amount_minor)
                             FILTER (WHERE status IN ('pending', 'requires_action')), 0)::bigint
                        AS pending_minor
             FROM payment_attempts
             WHERE parent_attempt_id = ANY($1)
             GROUP BY parent_attempt_id",
        )
        .bind(&ids)
        .fetch_all(self.pool())
        .await
        .map_err(unavailable)?;
        totals_from_rows(&rows)
    }
}
