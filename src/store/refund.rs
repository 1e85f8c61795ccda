//! What the store needs to write a refund's pending row and to show a charge's refunds. The
//! inserting statement decides whether the charge can give the amount back, under the charge's
//! row lock (PostgreSQL: `insert_pending_refund`, migration 20261204000003; SQLite: one
//! `BEGIN IMMEDIATE` transaction), so concurrent refunds can never together exceed it.

use crate::domain::{
    AttemptId, AttemptStatus, ChargeSelector, ConsumerName, Fingerprint, IdempotencyKey,
    LeaseOwner, Metadata, OperationKey, RefundReason,
};

use std::collections::HashMap;

use super::{CallerTime, StoreError};

/// A pending refund about to be committed, leased to the caller that inserts it.
#[derive(Debug, Clone)]
pub struct NewRefund {
    pub id: AttemptId,
    pub consumer: ConsumerName,
    pub operation_key: OperationKey,
    pub charge: ChargeSelector,
    /// `None`: what is left to refund, decided by the statement.
    pub amount_minor: Option<i64>,
    pub reason: Option<RefundReason>,
    pub metadata: Metadata,
    pub fingerprint: Fingerprint,
    pub provider: &'static str,
    /// Derived from the refund's own operation, never from the charge's.
    pub idempotency_key: IdempotencyKey,
    pub lease_owner: LeaseOwner,
    pub lease_duration: chrono::Duration,
    pub recovery_grace: chrono::Duration,
    pub time: CallerTime,
}

/// Why no refund row was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefundRefusal {
    /// No charge of this consumer by that id or operation key.
    ChargeNotFound,
    ChargeNotSucceeded { charge_attempt_id: AttemptId, status: AttemptStatus },
    /// The charge's pending and succeeded refunds already add up to what was charged.
    ChargeFullyRefunded { charge_attempt_id: AttemptId, charged_minor: i64 },
    ExceedsCharge { charge_attempt_id: AttemptId, requested_minor: i64, refundable_minor: i64 },
}

#[derive(Debug)]
pub enum RefundInsertOutcome {
    Inserted(crate::domain::Attempt),
    /// The refund operation was recorded before (or its key names another attempt): untouched.
    Existing(crate::domain::Attempt),
    Refused(RefundRefusal),
}

/// A charge's refunds by state: what came back, and what is on its way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RefundTotals {
    /// Sum of succeeded refunds.
    pub refunded_minor: i64,
    /// Sum of refunds pending or awaiting action.
    pub pending_minor: i64,
}

/// Charge ids one `refund_totals` call sums for: a page of attempts is at most this long.
pub const REFUND_TOTALS_PARENTS_MAX: usize = 1_000;

/// Reads `refund_totals`' rows (`parent_attempt_id`, `refunded_minor`, `pending_minor`), the
/// same on both backends.
pub(super) fn totals_from_rows<R>(rows: &[R]) -> Result<HashMap<AttemptId, RefundTotals>, StoreError>
where
    R: sqlx::Row,
    for<'r> uuid::Uuid: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    &'static str: sqlx::ColumnIndex<R>,
{
    rows.iter()
        .map(|row| -> Result<(AttemptId, RefundTotals), sqlx::Error> {
            let totals = RefundTotals { refunded_minor: row.try_get("refunded_minor")?, pending_minor: row.try_get("pending_minor")? };
            Ok((AttemptId::from_uuid(row.try_get("parent_attempt_id")?), totals))
        })
        .collect::<Result<_, _>>()
        .map_err(|error| StoreError::Corrupt(format!("refund totals: {error}")))
}

/// Reads the refusal a store encoded as (code, detail): the PostgreSQL function's SQLSTATE and
/// DETAIL, or the same pair built by the SQLite transaction.
pub(super) fn refusal_from_code(code: &str, detail: &str) -> Option<RefundRefusal> {
    let parts: Vec<&str> = detail.split(' ').collect();
    let id = || -> Option<AttemptId> { parts.first()?.parse::<uuid::Uuid>().ok().map(AttemptId::from_uuid) };
    let number = |index: usize| -> Option<i64> { parts.get(index)?.parse().ok() };
    Some(match code {
        "CGR01" => RefundRefusal::ChargeNotFound,
        "CGR02" => RefundRefusal::ChargeNotSucceeded {
            charge_attempt_id: id()?,
            status: AttemptStatus::parse(parts.get(1)?)?,
        },
        "CGR03" => RefundRefusal::ChargeFullyRefunded { charge_attempt_id: id()?, charged_minor: number(1)? },
        "CGR04" => RefundRefusal::ExceedsCharge {
            charge_attempt_id: id()?,
            requested_minor: number(1)?,
            refundable_minor: number(2)?,
        },
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_codes_read_back() {
        let id = uuid::Uuid::nil();
        assert_eq!(refusal_from_code("CGR01", ""), Some(RefundRefusal::ChargeNotFound));
        assert_eq!(
            refusal_from_code("CGR02", &format!("{id} failed")),
            Some(RefundRefusal::ChargeNotSucceeded { charge_attempt_id: AttemptId::from_uuid(id), status: AttemptStatus::Failed })
        );
        assert_eq!(
            refusal_from_code("CGR04", &format!("{id} 700 300")),
            Some(RefundRefusal::ExceedsCharge { charge_attempt_id: AttemptId::from_uuid(id), requested_minor: 700, refundable_minor: 300 })
        );
        assert_eq!(refusal_from_code("23505", ""), None);
        assert_eq!(refusal_from_code("CGR03", "garbage"), None);
    }
}
