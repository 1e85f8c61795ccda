//! Every code the server can send in `chargeguard-error-code`, with the one gRPC code it goes
//! with. `status.rs` builds every error status from a variant, never from a string, so a new
//! code is a new variant here — and the unit test below fails until the client crate
//! (`client/`, chargeguard-client) knows and classifies it.

use tonic::Code;

/// A stable, machine-matchable error code of the gRPC API (documented in README.md, "Calling
/// chargeguard from a consumer").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    InvalidArgument,
    UndecodableRequest,
    RequestTooLarge,
    Unauthenticated,
    PermissionDenied,
    NotFound,
    OperationMismatch,
    OperationAlreadySucceeded,
    AttemptOutOfOrder,
    NeedsReview,
    NotFlagged,
    ChargeNotSucceeded,
    ChargeFullyRefunded,
    RefundExceedsCharge,
    ReportTooLarge,
    Unimplemented,
    Internal,
    OutcomeUnknown,
    ProviderFailureReplayed,
    InProgress,
    Unavailable,
    ProviderUnavailable,
    RateLimited,
    TooManyCallsInFlight,
}

impl ErrorCode {
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

    /// The code on the wire.
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

    /// The gRPC code every status with this error code carries.
    pub fn grpc_code(self) -> Code {
        match self {
            ErrorCode::InvalidArgument | ErrorCode::UndecodableRequest => Code::InvalidArgument,
            ErrorCode::RequestTooLarge
            | ErrorCode::ReportTooLarge
            | ErrorCode::RateLimited
            | ErrorCode::TooManyCallsInFlight => Code::ResourceExhausted,
            ErrorCode::Unauthenticated => Code::Unauthenticated,
            ErrorCode::PermissionDenied => Code::PermissionDenied,
            ErrorCode::NotFound => Code::NotFound,
            ErrorCode::OperationMismatch
            | ErrorCode::OperationAlreadySucceeded
            | ErrorCode::AttemptOutOfOrder
            | ErrorCode::NeedsReview
            | ErrorCode::NotFlagged
            | ErrorCode::ChargeNotSucceeded
            | ErrorCode::ChargeFullyRefunded
            | ErrorCode::RefundExceedsCharge => Code::FailedPrecondition,
            ErrorCode::Unimplemented => Code::Unimplemented,
            ErrorCode::Internal => Code::Internal,
            ErrorCode::OutcomeUnknown
            | ErrorCode::ProviderFailureReplayed
            | ErrorCode::InProgress
            | ErrorCode::Unavailable
            | ErrorCode::ProviderUnavailable => Code::Unavailable,
        }
    }
}
