//! Turns one `payment_attempts` row into an `Attempt`, the same way for every backend. Each
//! backend says only how it reads a column of each kind (PostgreSQL has `timestamptz` and
//! `uuid`; SQLite stores integer microseconds and 16-byte blobs); every value is checked here,
//! once, so that a row one backend accepts the other accepts too.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::StoreError;
use crate::domain::{
    Attempt, AttemptId, AttemptKind, AttemptStatus, ChargeParams, ConsumerName, Currency,
    CustomerId, Description, Failure, Fingerprint, IdempotencyKey, Lease, LeaseOwner, Metadata,
    ListProgress, NextAction, OperationKey, PaymentMethodId, RefundReason,
};

const PROGRESS_AFTER: &str = "after:";
const PROGRESS_COMPLETE: &str = "complete";

/// `lookup_cursor` as stored: NULL before a listing started.
pub(super) fn encode_progress(progress: &ListProgress) -> Option<String> {
    match progress {
        ListProgress::NotStarted => None,
        ListProgress::After(cursor) => Some(format!("{PROGRESS_AFTER}{cursor}")),
        ListProgress::Complete => Some(PROGRESS_COMPLETE.to_owned()),
    }
}

fn decode_progress(stored: Option<String>) -> Result<ListProgress, String> {
    match stored.as_deref() {
        None => Ok(ListProgress::NotStarted),
        Some(PROGRESS_COMPLETE) => Ok(ListProgress::Complete),
        Some(value) => value
            .strip_prefix(PROGRESS_AFTER)
            .filter(|cursor| !cursor.is_empty())
            .map(|cursor| ListProgress::After(cursor.to_owned()))
            .ok_or_else(|| format!("unreadable lookup_cursor {value:?}")),
    }
}

pub(super) type ColumnError = Box<dyn std::error::Error + Send + Sync>;

/// How one backend reads the columns of a `payment_attempts` row. `None` is SQL NULL.
pub(super) trait AttemptColumns {
    fn uuid(&self, column: &str) -> Result<Option<Uuid>, ColumnError>;
    fn text(&self, column: &str) -> Result<Option<String>, ColumnError>;
    fn time(&self, column: &str) -> Result<Option<DateTime<Utc>>, ColumnError>;
    /// A non-negative counter (`generation`, `provider_calls`, `check_count`).
    fn count(&self, column: &str) -> Result<i64, ColumnError>;
    fn flag(&self, column: &str) -> Result<bool, ColumnError>;
    fn amount_minor(&self) -> Result<i64, ColumnError>;
    fn metadata(&self) -> Result<BTreeMap<String, String>, ColumnError>;
}

fn corrupt(id: Uuid, what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("attempt {id}: {what}"))
}

pub(super) fn optional_attempt(
    row: Option<impl AttemptColumns>,
) -> Result<Option<Attempt>, StoreError> {
    row.as_ref().map(attempt_from_row).transpose()
}

pub(super) fn attempt_from_row(row: &impl AttemptColumns) -> Result<Attempt, StoreError> {
    let id = row
        .uuid("id")
        .map_err(|error| StoreError::Unavailable(error.to_string()))?
        .ok_or_else(|| StoreError::Corrupt("attempt without an id".to_owned()))?;
    let get_optional_text = |column: &str| row.text(column).map_err(|error| corrupt(id, error));
    let get_text = |column: &str| -> Result<String, StoreError> {
        get_optional_text(column)?.ok_or_else(|| corrupt(id, format!("{column} is null")))
    };
    let get_optional_time = |column: &str| row.time(column).map_err(|error| corrupt(id, error));
    let get_time = |column: &str| -> Result<DateTime<Utc>, StoreError> {
        get_optional_time(column)?.ok_or_else(|| corrupt(id, format!("{column} is null")))
    };
    let get_count = |column: &str| -> Result<u32, StoreError> {
        let value = row.count(column).map_err(|error| corrupt(id, error))?;
        u32::try_from(value).map_err(|error| corrupt(id, format!("{column}: {error}")))
    };
    let metadata = row.metadata().map_err(|error| corrupt(id, error))?;
    let status_name = get_text("status")?;
    let kind_name = get_text("kind")?;
    let lease_owner = row
        .uuid("lease_owner")
        .map_err(|error| corrupt(id, error))?;
    let lease_expires_at = get_optional_time("lease_expires_at")?;
    let failure = match (
        get_optional_text("failure_code")?,
        get_optional_text("failure_message")?,
    ) {
        (Some(code), message) => Some(Failure {
            code,
            message: message.unwrap_or_default(),
        }),
        (None, _) => None,
    };
    let next_action = get_optional_text("next_action_type")?
        .map(|kind| -> Result<NextAction, StoreError> {
            Ok(NextAction {
                kind,
                redirect_url: get_optional_text("next_action_url")?,
            })
        })
        .transpose()?;
    let params = ChargeParams {
        amount_minor: row.amount_minor().map_err(|e| corrupt(id, e))?,
        currency: Currency::parse(&get_text("currency")?).map_err(|e| corrupt(id, e))?,
        payment_method: PaymentMethodId::parse(&get_text("payment_method")?)
            .map_err(|e| corrupt(id, e))?,
        customer: get_optional_text("customer")?
            .map(|customer| CustomerId::parse(&customer))
            .transpose()
            .map_err(|e| corrupt(id, e))?,
        description: get_optional_text("description")?
            .map(|description| Description::parse(&description))
            .transpose()
            .map_err(|e| corrupt(id, e))?,
        metadata: Metadata::from_stored(metadata),
    };
    Ok(Attempt {
        id: AttemptId::from_uuid(id),
        consumer: ConsumerName::parse(&get_text("consumer")?).map_err(|e| corrupt(id, e))?,
        operation_key: OperationKey::parse(&get_text("operation_key")?)
            .map_err(|e| corrupt(id, e))?,
        kind: AttemptKind::parse(&kind_name)
            .ok_or_else(|| corrupt(id, format!("unknown kind {kind_name:?}")))?,
        params,
        fingerprint: Fingerprint::from_stored(get_text("fingerprint")?),
        status: AttemptStatus::parse(&status_name)
            .ok_or_else(|| corrupt(id, format!("unknown status {status_name:?}")))?,
        provider: get_text("provider")?,
        provider_payment_id: get_optional_text("provider_payment_id")?,
        provider_status: get_optional_text("provider_status")?,
        idempotency_key: IdempotencyKey::from_stored(get_text("idempotency_key")?),
        generation: get_count("generation")?,
        parent_attempt_id: row
            .uuid("parent_attempt_id")
            .map_err(|error| corrupt(id, error))?
            .map(AttemptId::from_uuid),
        refund_reason: get_optional_text("refund_reason")?
            .map(|reason| {
                RefundReason::parse(&reason).ok_or_else(|| corrupt(id, format!("unknown refund_reason {reason:?}")))
            })
            .transpose()?,
        confirms_payment_id: get_optional_text("confirms_payment_id")?,
        failed_after_success_at: get_optional_time("failed_after_success_at")?,
        failure,
        next_action,
        review_reason: get_optional_text("review_reason")?,
        review_history: get_optional_text("review_history")?,
        provider_calls: get_count("provider_calls")?,
        key_window_started_at: get_time("key_window_started_at")?,
        create_sent_until: get_optional_time("create_sent_until")?,
        create_replays_failure: row
            .flag("create_replays_failure")
            .map_err(|error| corrupt(id, error))?,
        lookup_progress: decode_progress(get_optional_text("lookup_cursor")?)
            .map_err(|error| corrupt(id, error))?,
        return_url: get_optional_text("return_url")?,
        action_started_at: get_optional_time("action_started_at")?,
        lease: match (lease_owner, lease_expires_at) {
            (Some(owner), Some(expires_at)) => Some(Lease {
                owner: LeaseOwner::from_uuid(owner),
                expires_at,
            }),
            _ => None,
        },
        check_count: get_count("check_count")?,
        next_check_at: get_time("next_check_at")?,
        last_error: get_optional_text("last_error")?,
        created_at: get_time("created_at")?,
        updated_at: get_time("updated_at")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_progress_round_trips() {
        for progress in [
            ListProgress::NotStarted,
            ListProgress::After("pi_123".into()),
            ListProgress::Complete,
        ] {
            assert_eq!(decode_progress(encode_progress(&progress)), Ok(progress));
        }
        assert!(decode_progress(Some("after:".into())).is_err());
        assert!(decode_progress(Some("pi_1".into())).is_err());
    }
}
