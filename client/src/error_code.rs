//! The codes the server sends in `chargeguard-error-code`, each with its class. The server's
//! own unit test parses every code of its enum with [`ErrorCode::from_str`], so a code added
//! there fails that test until it is classified here.

use std::fmt;
use std::str::FromStr;

use crate::answer::RetryClass;

/// A stable error code of chargeguard's gRPC API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// A request field is missing or invalid (INVALID_ARGUMENT).
    InvalidArgument,
    /// The request is not a protobuf message of the method's type (INVALID_ARGUMENT).
    UndecodableRequest,
    /// The request message is over the server's size limit (RESOURCE_EXHAUSTED); the same
    /// request is refused again.
    RequestTooLarge,
    /// No or an unknown bearer token / client certificate (UNAUTHENTICATED).
    Unauthenticated,
    /// The caller may not call this method (PERMISSION_DENIED).
    PermissionDenied,
    /// No such attempt or charge for this caller (NOT_FOUND).
    NotFound,
    /// The operation key was used before with other parameters (FAILED_PRECONDITION).
    OperationMismatch,
    /// Another attempt of the operation already succeeded (FAILED_PRECONDITION).
    OperationAlreadySucceeded,
    /// Attempt n + 1 before attempt n failed, or a gap in attempt numbers (FAILED_PRECONDITION).
    AttemptOutOfOrder,
    /// The attempt is flagged for a human to review (FAILED_PRECONDITION).
    NeedsReview,
    /// The attempt is not flagged for review (FAILED_PRECONDITION).
    NotFlagged,
    /// The charge to refund has not succeeded (FAILED_PRECONDITION).
    ChargeNotSucceeded,
    /// The charge to refund is already fully refunded (FAILED_PRECONDITION).
    ChargeFullyRefunded,
    /// The refund is more than what is left of the charge (FAILED_PRECONDITION).
    RefundExceedsCharge,
    /// A report over the server's page limit (RESOURCE_EXHAUSTED); a shorter period is needed.
    ReportTooLarge,
    /// The method is not served by this server (UNIMPLEMENTED).
    Unimplemented,
    /// A server fault, logged there (INTERNAL).
    Internal,
    /// The provider's answer is unknown; the attempt stays pending (UNAVAILABLE).
    OutcomeUnknown,
    /// The provider replays a saved failure for the key; the service finds the object by
    /// metadata, the attempt stays pending (UNAVAILABLE).
    ProviderFailureReplayed,
    /// The attempt (or an earlier one of the operation) is being decided by another call
    /// (UNAVAILABLE).
    InProgress,
    /// The database is unavailable (UNAVAILABLE).
    Unavailable,
    /// The provider could not be reached for a report (UNAVAILABLE).
    ProviderUnavailable,
    /// The caller is over its request rate (RESOURCE_EXHAUSTED, with `retry-after`).
    RateLimited,
    /// The caller has too many calls in flight (RESOURCE_EXHAUSTED, with `retry-after`).
    TooManyCallsInFlight,
}

impl ErrorCode {
    /// Every code, in the order of the README's table.
    pub const ALL: [ErrorCode; 24] = [
        ErrorCode::InvalidArgument,
        ErrorCode::UndecodableRequest,
        ErrorCode::RequestTooLarge,
        ErrorCode::Unauthenticated,
        ErrorCode::PermissionDenied,
        ErrorCode::NotFound,
        ErrorCode::OperationMismatch,
        ErrorCode::OperationAlreadySucceeded,
        ErrorCode::AttemptOutOfOrder,
        ErrorCode::NeedsReview,
        ErrorCode::NotFlagged,
        ErrorCode::ChargeNotSucceeded,
        ErrorCode::ChargeFullyRefunded,
        ErrorCode::RefundExceedsCharge,
        ErrorCode::ReportTooLarge,
        ErrorCode::Unimplemented,
        ErrorCode::Internal,
        ErrorCode::OutcomeUnknown,
        ErrorCode::ProviderFailureReplayed,
        ErrorCode::InProgress,
        ErrorCode::Unavailable,
        ErrorCode::ProviderUnavailable,
        ErrorCode::RateLimited,
        ErrorCode::TooManyCallsInFlight,
    ];

    /// The code as sent on the wire, e.g. `"outcome_unknown"`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidArgument => "invalid_argument",
            ErrorCode::UndecodableRequest => "undecodable_request",
            ErrorCode::RequestTooLarge => "request_too_large",
            ErrorCode::Unauthenticated => "unauthenticated",
            ErrorCode::PermissionDenied => "permission_denied",
            ErrorCode::NotFound => "not_found",
            ErrorCode::OperationMismatch => "operation_mismatch",
            ErrorCode::OperationAlreadySucceeded => "operation_already_succeeded",
            ErrorCode::AttemptOutOfOrder => "attempt_out_of_order",
            ErrorCode::NeedsReview => "needs_review",
            ErrorCode::NotFlagged => "not_flagged",
            ErrorCode::ChargeNotSucceeded => "charge_not_succeeded",
            ErrorCode::ChargeFullyRefunded => "charge_fully_refunded",
            ErrorCode::RefundExceedsCharge => "refund_exceeds_charge",
            ErrorCode::ReportTooLarge => "report_too_large",
            ErrorCode::Unimplemented => "unimplemented",
            ErrorCode::Internal => "internal",
            ErrorCode::OutcomeUnknown => "outcome_unknown",
            ErrorCode::ProviderFailureReplayed => "provider_failure_replayed",
            ErrorCode::InProgress => "in_progress",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::ProviderUnavailable => "provider_unavailable",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::TooManyCallsInFlight => "too_many_calls_in_flight",
        }
    }

    /// What a caller waits for before it calls again with the same request, or `None` when the
    /// same request will be refused again (reject, dead-letter).
    pub fn retry_class(self) -> Option<RetryClass> {
        match self {
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
            | ErrorCode::Internal => None,
            ErrorCode::OutcomeUnknown | ErrorCode::ProviderFailureReplayed => Some(RetryClass::OutcomeUnknown),
            ErrorCode::InProgress => Some(RetryClass::InProgress),
            ErrorCode::Unavailable | ErrorCode::ProviderUnavailable => Some(RetryClass::Unavailable),
            ErrorCode::RateLimited | ErrorCode::TooManyCallsInFlight => Some(RetryClass::ResourceExhausted),
        }
    }

    /// Whether the same request, sent again later, may get another answer.
    pub fn retryable(self) -> bool {
        self.retry_class().is_some()
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.as_str())
    }
}

/// A `chargeguard-error-code` this client does not know (a newer server's).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown chargeguard error code {0:?}")]
pub struct UnknownErrorCode(pub String);

impl FromStr for ErrorCode {
    type Err = UnknownErrorCode;

    fn from_str(code: &str) -> Result<Self, Self::Err> {
        ErrorCode::ALL.into_iter().find(|known| known.as_str() == code).ok_or_else(|| UnknownErrorCode(code.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_parses_back_from_its_name_and_names_are_unique() {
        for code in ErrorCode::ALL {
            assert_eq!(code.as_str().parse::<ErrorCode>(), Ok(code));
            assert_eq!(code.to_string(), code.as_str());
        }
        let mut names: Vec<_> = ErrorCode::ALL.iter().map(|code| code.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ErrorCode::ALL.len());
        assert_eq!("no_such_code".parse::<ErrorCode>(), Err(UnknownErrorCode("no_such_code".to_owned())));
    }
}
