//! The one mapping from chargeguard's errors to gRPC status. Internal details are logged here
//! and never returned; every status carries a stable code in `chargeguard-error-code`.

use tonic::Status;
use tonic::metadata::MetadataValue;

use super::auth::AuthError;
use super::error_code::ErrorCode;
use super::{ATTEMPT_ID_METADATA, ERROR_CODE_METADATA};
use crate::domain::{AttemptId, InvalidField};
use crate::orchestrator::OrchestratorError;
use crate::store::{RefundRefusal, StoreError};

fn status(error_code: ErrorCode, message: String, attempt: Option<AttemptId>) -> Status {
    let mut status = Status::new(error_code.grpc_code(), message);
    status.metadata_mut().insert(ERROR_CODE_METADATA, MetadataValue::from_static(error_code.as_str()));
    if let Some(attempt) = attempt
        && let Ok(value) = attempt.to_string().parse()
    {
        status.metadata_mut().insert(ATTEMPT_ID_METADATA, value);
    }
    status
}

pub fn invalid_field(error: InvalidField) -> Status {
    status(ErrorCode::InvalidArgument, format!("invalid {}: {}", error.field, error.reason), None)
}

/// A request message over `server.grpc_request_bytes_max`, refused while it was decoded: no
/// handler ran, so nothing was written or charged.
pub fn request_too_large(limit_bytes: usize, found_bytes: u64) -> Status {
    let message = format!(
        "the request message is {found_bytes} bytes, over the limit of {limit_bytes} bytes \
         (server.grpc_request_bytes_max); nothing was written or charged"
    );
    status(ErrorCode::RequestTooLarge, message, None)
}

pub fn unauthenticated(error: AuthError) -> Status {
    status(ErrorCode::Unauthenticated, error.to_string(), None)
}

pub fn from_orchestrator(error: OrchestratorError) -> Status {
    match error {
        OrchestratorError::FingerprintMismatch { attempt_id, .. } => {
            status(ErrorCode::OperationMismatch, error.to_string(), Some(attempt_id))
        }
        OrchestratorError::OutcomeUnknown { attempt_id, .. } => {
            status(ErrorCode::OutcomeUnknown, error.to_string(), Some(attempt_id))
        }
        OrchestratorError::ProviderReplaysFailure { attempt_id } => {
            status(ErrorCode::ProviderFailureReplayed, error.to_string(), Some(attempt_id))
        }
        OrchestratorError::NotFlagged { attempt_id } => {
            status(ErrorCode::NotFlagged, error.to_string(), Some(attempt_id))
        }
        OrchestratorError::InProgress { attempt_id } => {
            status(ErrorCode::InProgress, error.to_string(), Some(attempt_id))
        }
        OrchestratorError::NeedsReview { attempt_id, .. } => {
            status(ErrorCode::NeedsReview, error.to_string(), Some(attempt_id))
        }
        OrchestratorError::PreviousAttemptInProgress { attempt_id, .. } => {
            status(ErrorCode::InProgress, error.to_string(), Some(attempt_id))
        }
        OrchestratorError::PreviousCancelUnfinished { attempt_id, .. } => {
            status(ErrorCode::InProgress, error.to_string(), Some(attempt_id))
        }
        OrchestratorError::OperationAlreadySucceeded { attempt_id, .. } => {
            status(ErrorCode::OperationAlreadySucceeded, error.to_string(), Some(attempt_id))
        }
        OrchestratorError::AttemptOutOfOrder { .. } => {
            status(ErrorCode::AttemptOutOfOrder, error.to_string(), None)
        }
        OrchestratorError::NotFound => status(ErrorCode::NotFound, "no such attempt".to_owned(), None),
        OrchestratorError::RefundRefused(ref refusal) => {
            // No refund attempt exists, so no attempt id is attached; the message names the charge.
            let error_code = match refusal {
                // Another consumer's charge is answered exactly like no charge at all.
                RefundRefusal::ChargeNotFound => ErrorCode::NotFound,
                RefundRefusal::ChargeNotSucceeded { .. } => ErrorCode::ChargeNotSucceeded,
                RefundRefusal::ChargeFullyRefunded { .. } => ErrorCode::ChargeFullyRefunded,
                RefundRefusal::ExceedsCharge { .. } => ErrorCode::RefundExceedsCharge,
            };
            status(error_code, error.to_string(), None)
        }
        OrchestratorError::InvalidPageToken => invalid_field(InvalidField::new("page_token", "is not a token this service issued")),
        OrchestratorError::Store(StoreError::Unavailable(detail)) => {
            tracing::warn!(error = %detail, "database unavailable");
            status(ErrorCode::Unavailable, "the database is unavailable; retry later".to_owned(), None)
        }
        OrchestratorError::Store(StoreError::Corrupt(detail)) => {
            tracing::error!(error = %detail, "corrupt attempt row");
            internal()
        }
    }
}

pub fn permission_denied(message: String) -> Status {
    status(ErrorCode::PermissionDenied, message, None)
}

pub fn from_report(error: crate::report::ReportError) -> Status {
    use crate::report::ReportError;
    match error {
        ReportError::Period(error) => status(ErrorCode::InvalidArgument, error.to_string(), None),
        ReportError::Store(store) => from_orchestrator(OrchestratorError::Store(store)),
        ReportError::Provider { .. } => {
            tracing::warn!(%error, "report failed at the provider");
            status(ErrorCode::ProviderUnavailable, "the provider could not be listed; retry later".to_owned(), None)
        }
        ReportError::TooManyPages { .. } => status(ErrorCode::ReportTooLarge, error.to_string(), None),
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
        LimitRefusal::Rate { consumer, .. } => (ErrorCode::RateLimited,
            format!("consumer {consumer} is over its requests_per_second_max/burst_max; retry after {} ms; nothing was written or charged", retry_after.as_millis()),
        ),
        LimitRefusal::InFlight { consumer, calls_in_flight_max } => (ErrorCode::TooManyCallsInFlight,
            format!("consumer {consumer} already has {calls_in_flight_max} calls in flight (calls_in_flight_max); nothing was written or charged"),
        ),
    };
    let mut status = status(error_code, message, None);
    let seconds = retry_after.as_millis().div_ceil(1_000).max(1);
    status.metadata_mut().insert(RETRY_AFTER_METADATA, seconds.to_string().parse().expect("digits"));
    status.metadata_mut().insert(RETRY_AFTER_MS_METADATA, retry_after.as_millis().to_string().parse().expect("digits"));
    status
}

/// A request tonic could not decode (not protobuf, a bad frame): the caller's fault, refused
/// before any handler ran.
pub fn undecodable_request() -> Status {
    status(ErrorCode::UndecodableRequest,
        "the request message is not a valid protobuf message of this method's request type; nothing was written or charged".to_owned(),
        None,
    )
}

/// A method this server does not serve as configured (e.g. no finance page): asking again
/// gets the same answer.
pub fn unimplemented(message: &str) -> Status {
    status(ErrorCode::Unimplemented, message.to_owned(), None)
}

/// A fault of this server, with no detail for the caller (the detail is logged by the caller
/// of this function).
pub fn internal() -> Status {
    status(ErrorCode::Internal, "internal error".to_owned(), None)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::time::Duration;

    use chargeguard_client::{Classification, classify};

    use super::*;
    use crate::domain::{AttemptStatus, ConsumerName, OperationKey};
    use crate::grpc::limits::LimitRefusal;
    use crate::provider::ProviderError;
    use crate::report::ReportError;

    /// The answer README.md ("Calling chargeguard from a consumer") documents for each code:
    /// `"reject"` or `"retry_later:<class>"`. A new code does not compile until it is decided here.
    fn documented(code: ErrorCode) -> &'static str {
        match code {
            ErrorCode::InvalidArgument
            | ErrorCode::UndecodableRequest
            | ErrorCode::RequestTooLarge
            | ErrorCode::Unauthenticated
            | ErrorCode::PermissionDenied
            | ErrorCode::NotFound
            | ErrorCode::OperationMismatch
            | ErrorCode::OperationAlreadySucceeded
            | ErrorCode::AttemptOutOfOrder
            | ErrorCode::NeedsReview
            | ErrorCode::NotFlagged
            | ErrorCode::ChargeNotSucceeded
            | ErrorCode::ChargeFullyRefunded
            | ErrorCode::RefundExceedsCharge
            | ErrorCode::ReportTooLarge
            | ErrorCode::Unimplemented
            | ErrorCode::Internal => "reject",
            ErrorCode::OutcomeUnknown | ErrorCode::ProviderFailureReplayed => "retry_later:outcome_unknown",
            ErrorCode::InProgress => "retry_later:in_progress",
            ErrorCode::Unavailable | ErrorCode::ProviderUnavailable => "retry_later:unavailable",
            ErrorCode::RateLimited | ErrorCode::TooManyCallsInFlight => "retry_later:resource_exhausted",
        }
    }

    /// One status from every constructor of this module, for every error it maps.
    fn every_status() -> Vec<Status> {
        let attempt_id = AttemptId::from_uuid(uuid::Uuid::now_v7());
        let operation_key = OperationKey::parse("order-1:charge").expect("valid key");
        let consumer = ConsumerName::parse("orders").expect("valid name");
        let orchestrator_errors = vec![
            OrchestratorError::FingerprintMismatch { operation_key: operation_key.clone(), attempt_id, fields: vec!["amount_minor"] },
            OrchestratorError::OutcomeUnknown { attempt_id, reason: "timeout".to_owned() },
            OrchestratorError::InProgress { attempt_id },
            OrchestratorError::ProviderReplaysFailure { attempt_id },
            OrchestratorError::NeedsReview { attempt_id, reason: "money moved".to_owned() },
            OrchestratorError::PreviousAttemptInProgress { operation_key: operation_key.clone(), attempt_id },
            OrchestratorError::OperationAlreadySucceeded { operation_key: operation_key.clone(), attempt_id },
            OrchestratorError::AttemptOutOfOrder { operation_key: operation_key.clone(), requested: 3, latest: Some(1) },
            OrchestratorError::PreviousCancelUnfinished { operation_key, attempt_id, reason: "timeout".to_owned() },
            OrchestratorError::NotFound,
            OrchestratorError::RefundRefused(RefundRefusal::ChargeNotFound),
            OrchestratorError::RefundRefused(RefundRefusal::ChargeNotSucceeded { charge_attempt_id: attempt_id, status: AttemptStatus::Pending }),
            OrchestratorError::RefundRefused(RefundRefusal::ChargeFullyRefunded { charge_attempt_id: attempt_id, charged_minor: 100 }),
            OrchestratorError::RefundRefused(RefundRefusal::ExceedsCharge { charge_attempt_id: attempt_id, requested_minor: 200, refundable_minor: 100 }),
            OrchestratorError::NotFlagged { attempt_id },
            OrchestratorError::InvalidPageToken,
            OrchestratorError::Store(StoreError::Unavailable("connection refused".to_owned())),
            OrchestratorError::Store(StoreError::Corrupt("bad row".to_owned())),
        ];
        let report_errors = vec![
            ReportError::Store(StoreError::Unavailable("connection refused".to_owned())),
            ReportError::Provider { listing: "charges", error: ProviderError::OutcomeUnknown("timeout".to_owned()) },
            ReportError::TooManyPages { listing: "charges", pages_max: 10 },
        ];
        let mut statuses = vec![
            invalid_field(InvalidField::new("amount_minor", "must be more than 0")),
            request_too_large(4_194_304, 5_000_000),
            unauthenticated(AuthError::Unknown),
            permission_denied("consumer orders may not read reports".to_owned()),
            consumer_limited(&LimitRefusal::Rate { consumer: consumer.clone(), retry_after: Duration::from_millis(1_250) }),
            consumer_limited(&LimitRefusal::InFlight { consumer, calls_in_flight_max: 8 }),
            undecodable_request(),
            unimplemented("this server has no finance page"),
            internal(),
        ];
        statuses.extend(orchestrator_errors.into_iter().map(from_orchestrator));
        statuses.extend(report_errors.into_iter().map(from_report));
        statuses
    }

    fn sent_code(status: &Status) -> ErrorCode {
        let sent = status.metadata().get(ERROR_CODE_METADATA).expect("every status carries a code").to_str().expect("ascii");
        ErrorCode::ALL.into_iter().find(|code| code.as_str() == sent).expect("a code of ErrorCode")
    }

    fn answer(classification: &Classification) -> String {
        match classification {
            Classification::Reject(_) => "reject".to_owned(),
            Classification::RetryLater(later) => format!("retry_later:{}", later.class),
        }
    }

    #[test]
    fn the_client_crate_knows_every_code_the_server_sends() {
        for code in ErrorCode::ALL {
            let client_code: chargeguard_client::ErrorCode =
                code.as_str().parse().unwrap_or_else(|_| panic!("chargeguard-client does not know {}", code.as_str()));
            assert_eq!(client_code.as_str(), code.as_str());
            assert_eq!(client_code.retryable(), documented(code) != "reject", "{}", code.as_str());
        }
        assert_eq!(chargeguard_client::ErrorCode::ALL.len(), ErrorCode::ALL.len(), "the client knows codes the server never sends");
    }

    #[test]
    fn the_client_classifies_every_status_the_server_builds_as_documented() {
        let mut covered = HashSet::new();
        for status in every_status() {
            let code = sent_code(&status);
            assert_eq!(status.code(), code.grpc_code(), "{status:?}");
            assert_eq!(answer(&classify(&status)), documented(code), "{status:?}");
            covered.insert(code);
        }
        let uncovered: Vec<_> = ErrorCode::ALL.into_iter().filter(|code| !covered.contains(code)).collect();
        assert!(uncovered.is_empty(), "no status in every_status() sends {uncovered:?}");
    }

    #[test]
    fn the_client_reads_the_attempt_and_the_retry_hint_the_server_sends() {
        let attempt_id = AttemptId::from_uuid(uuid::Uuid::now_v7());
        let Classification::Reject(rejection) =
            classify(&from_orchestrator(OrchestratorError::FingerprintMismatch {
                operation_key: OperationKey::parse("order-1:charge").expect("valid key"),
                attempt_id,
                fields: vec!["amount_minor"],
            }))
        else {
            panic!("operation_mismatch is rejected")
        };
        assert_eq!(rejection.attempt_id, Some(attempt_id.to_string()));

        let consumer = ConsumerName::parse("orders").expect("valid name");
        let limited = consumer_limited(&LimitRefusal::Rate { consumer, retry_after: Duration::from_millis(1_250) });
        let Classification::RetryLater(later) = classify(&limited) else { panic!("rate_limited is retried") };
        assert_eq!(later.after, Duration::from_millis(1_250));
        assert_eq!(later.code, "rate_limited");
    }
}
