//! Pure types and rules of chargeguard. Nothing in here does IO, reads a clock or a random
//! generator: callers pass instants and ids in. Values are validated once, at construction, so a
//! value of one of these types is known to be valid.

mod attempt;
mod attempt_number;
mod charge_request;
mod currency;
#[cfg(test)]
pub(crate) mod fixtures;
mod idempotency;
mod operation;
mod provider_payment;
mod provider_refund;
mod recovery;
mod refund_request;
mod refund_resolution;
pub mod review;

pub use attempt::{
    Attempt, AttemptId, AttemptKind, AttemptStatus, Failure, Lease, LeaseOwner, ListProgress,
    NextAction, RefundReason,
};
pub use attempt_number::{ATTEMPT_NUMBER_MAX, Admission, AttemptNumber, admit};
pub use charge_request::{
    ChargeParams, ChargeRequest, Description, Fingerprint, Metadata, PaymentMethodId, CustomerId,
    METADATA_KEY_LENGTH_MAX, METADATA_KEYS_MAX, METADATA_VALUE_LENGTH_MAX, RESERVED_METADATA_PREFIX,
};
pub use currency::Currency;
pub use idempotency::{IdempotencyKey, derive_idempotency_key};
pub use operation::{ConsumerName, OperationKey};
pub use provider_payment::{PaymentSnapshot, ProviderPaymentStatus, Resolution, resolve_snapshot};
pub use provider_refund::{RefundSnapshot, RefundStatus};
pub use refund_request::{ChargeSelector, RefundRequest};
pub use refund_resolution::resolve_refund_snapshot;
pub use recovery::{
    CLOCK_SKEW_TOLERANCE, ClockReadings, KeyAge, KeyWindow, LookupResolution,
    PROVIDER_KEY_RETENTION, RecoveryStep, choose_recovery_step, lookup_created_range,
    resolve_confirmed, resolve_lookup,
};
pub use review::{
    DISPUTE, SUCCEEDED_AFTER_FAILURE, dispute_reason, shows_money_moved,
    succeeded_after_failure_reason,
};

/// Why a value from outside could not become a domain value. `field` names the request field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct InvalidField {
    pub field: &'static str,
    pub reason: String,
}

impl InvalidField {
    pub fn new(field: &'static str, reason: impl Into<String>) -> Self {
        Self { field, reason: reason.into() }
    }
}
