//! The one mapping from chargeguard's errors to gRPC status. Internal details are logged here
//! and never returned; every status carries a stable code in `chargeguard-error-code`.

use tonic::{Code, Status};

use super::auth::AuthError;
use super::{ATTEMPT_ID_METADATA, ERROR_CODE_METADATA};
use crate::domain::{AttemptId, InvalidField};
use crate::orchestrator::OrchestratorError;
use crate::store::{RefundRefusal, StoreError};

fn status(code: Code, error_code: &'static str, message: String, attempt: Option<AttemptId>) -> Status {
    let mut status = Status::new(code, message);
    status.metadata_mut().insert(ERROR_CODE_METADATA, error_code.parse().expect("ascii literal"));
    if let Some(attempt) = attempt
        && let Ok(value) = attempt.to_string().parse()
    {
        status.metadata_mut().insert(ATTEMPT_ID_METADATA, value);
    }
    status
}

pub fn invalid_field(error: InvalidField) -> Status {
    status(Code::InvalidArgument, "invalid_argument", format!("invalid {}: {}", error.field, error.reason), None)
}

/// A request message over `server.grpc_request_bytes_max`, refused while it was decoded: no
/// handler ran, so nothing was written or charged.
pub fn request_too_large(limit_bytes: usize, found_bytes: u64) -> Status {
    let message = format!(
        "the request message is {found_bytes} bytes, over the limit of {limit_bytes} bytes \
         (server.grpc_request_bytes_max); nothing was written or charged"
    );
    status(Code::ResourceExhausted, "request_too_large", message, None)
}

pub fn unauthenticated(error: AuthError) -> Status {
    status(Code::Unauthenticated, "unauthenticated", error.to_string(), None)
}

pub fn from_orchestrator(error: OrchestratorError) -> Status {
    match error {
        OrchestratorError::FingerprintMismatch { attempt_id, .. } => {
            status(Code::FailedPrecondition, "operation_mismatch", error.to_string(), Some(attempt_id))
        }
        OrchestratorError::OutcomeUnknown { attempt_id, .. } => {
            status(Code::Unavailable, "outcome_unknown", error.to_string(), Some(attempt_id))
        }
        OrchestratorError::ProviderReplaysFailure { attempt_id } => {
            status(Code::Unavailable, "provider_failure_replayed", error.to_string(), Some(attempt_id))
        }
        OrchestratorError::NotFlagged { attempt_id } => {
            status(Code::FailedPrecondition, "not_flagged", error.to_string(), Some(attempt_id))
        }
        OrchestratorError::InProgress { attempt_id } => {
            status(Code::Unavailable, "in_progress", error.to_string(), Some(attempt_id))
        }
        OrchestratorError::NeedsReview { attempt_id, .. } => {
            status(Code::FailedPrecondition, "needs_review", error.to_string(), Some(attempt_id))
        }
        OrchestratorError::PreviousAttemptInProgress { attempt_id, .. } => {
            status(Code::Unavailable, "in_progress", error.to_string(), Some(attempt_id))
        }
        OrchestratorError::PreviousCancelUnfinished { attempt_id, .. } => {
            status(Code::Unavailable, "in_progress", error.to_string(), Some(attempt_id))
        }
        OrchestratorError::OperationAlreadySucceeded { attempt_id, .. } => {
            status(Code::FailedPrecondition, "operation_already_succeeded", error.to_string(), Some(attempt_id))
        }
        OrchestratorError::AttemptOutOfOrder { .. } => {
            status(Code::FailedPrecondition, "attempt_out_of_order", error.to_string(), None)
        }
        OrchestratorError::NotFound => status(Code::NotFound, "not_found", "no such attempt".to_owned(), None),
        OrchestratorError::RefundRefused(ref refusal) => {
            // No refund attempt exists, so no attempt id is attached; the message names the charge.
            let (code, error_code) = match refusal {
                // Another consumer's charge is answered exactly like no charge at all.
                RefundRefusal::ChargeNotFound => (Code::NotFound, "not_found"),
                RefundRefusal::ChargeNotSucceeded { .. } => (Code::FailedPrecondition, "charge_not_succeeded"),
                RefundRefusal::ChargeFullyRefunded { .. } => (Code::FailedPrecondition, "charge_fully_refunded"),
                RefundRefusal::ExceedsCharge { .. } => (Code::FailedPrecondition, "refund_exceeds_charge"),
            };
            status(code, error_code, error.to_string(), None)
        }
        OrchestratorError::InvalidPageToken => invalid_field(InvalidField::new("page_token", "is not a token this service issued")),
        OrchestratorError::Store(StoreError::Unavailable(detail)) => {
            tracing::warn!(error = %detail, "database unavailable");
            status(Code::Unavailable, "unavailable", "the database is unavailable; retry later".to_owned(), None)
        }
        OrchestratorError::Store(StoreError::Corrupt(detail)) => {
            tracing::error!(error = %detail, "corrupt attempt row");
            status(Code::Internal, "internal", "internal error".to_owned(), None)
        }
    }
}

pub fn permission_denied(message: String) -> Status {
    status(Code::PermissionDenied, "permission_denied", message, None)
}

pub fn from_report(error: crate::report::ReportError) -> Status {
    use crate::report::ReportError;
    match error {
        ReportError::Period(error) => status(Code::InvalidArgument, "invalid_argument", error.to_string(), None),
        ReportError::Store(store) => from_orchestrator(OrchestratorError::Store(store)),
        ReportError::Provider { .. } => {
            tracing::warn!(%error, "report failed at the provider");
            status(Code::Unavailable, "provider_unavailable", "the provider could not be listed; retry later".to_owned(), None)
        }
        ReportError::TooManyPages { .. } => status(Code::ResourceExhausted, "report_too_large", error.to_string(), None),
    }
}

/// Metadata key of the wait a refused caller should leave before trying again, in whole seconds
/// as HTTP's `Retry-After`; `chargeguard-retry-after-ms` carries it exactly.
pub const RETRY_AFTER_METADATA: &str = "retry-after";
pub const RETRY_AFTER_MS_METADATA: &str = "chargeguard-retry-after-ms";

/// A consumer over its rate or its calls in flight: refused before anything was read, written
/// or charged.
pub fn consumer_limited(refusal: &super::limits::LimitRefusal) -> Status {
    use super::limits::LimitRefusal;
    let retry_after = refusal.retry_after();
    let (error_code, message) = match refusal {
        LimitRefusal::Rate { consumer, .. } => (
            "rate_limited",
            format!("consumer {consumer} is over its requests_per_second_max/burst_max; retry after {} ms; nothing was written or charged", retry_after.as_millis()),
        ),
        LimitRefusal::InFlight { consumer, calls_in_flight_max } => (
            "too_many_calls_in_flight",
            format!("consumer {consumer} already has {calls_in_flight_max} calls in flight (calls_in_flight_max); nothing was written or charged"),
        ),
    };
    let mut status = status(Code::ResourceExhausted, error_code, message, None);
    let seconds = retry_after.as_millis().div_ceil(1_000).max(1);
    status.metadata_mut().insert(RETRY_AFTER_METADATA, seconds.to_string().parse().expect("digits"));
    status.metadata_mut().insert(RETRY_AFTER_MS_METADATA, retry_after.as_millis().to_string().parse().expect("digits"));
    status
}

/// A request tonic could not decode (not protobuf, a bad frame): the caller's fault, refused
/// before any handler ran.
pub fn undecodable_request() -> Status {
    status(
        Code::InvalidArgument,
        "undecodable_request",
        "the request message is not a valid protobuf message of this method's request type; nothing was written or charged".to_owned(),
        None,
    )
}
