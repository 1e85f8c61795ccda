//! One status → retry later or reject. Pure: no clock, no IO.

use std::str::FromStr;
use std::time::Duration;

use tonic::{Code, Status};

use crate::answer::{Classification, Rejection, RetryClass, RetryLater};
use crate::error_code::ErrorCode;
use crate::{ATTEMPT_ID_METADATA, ERROR_CODE_METADATA, RETRY_AFTER_METADATA, RETRY_AFTER_MS_METADATA};

/// Classifies an error status: by the server's `chargeguard-error-code` when it sent one
/// ([`ErrorCode::retry_class`]), else by the gRPC code alone — a status without our code never
/// came from chargeguard's handlers (a refused or reset connection, an expired deadline, a
/// proxy), so UNAVAILABLE, UNKNOWN, CANCELLED, DEADLINE_EXCEEDED and RESOURCE_EXHAUSTED are
/// retried and everything else is rejected. A code this client does not know (a newer server)
/// is classified by its gRPC code the same way.
pub fn classify(status: &Status) -> Classification {
    let sent_code = metadata_str(status, ERROR_CODE_METADATA);
    let class = match sent_code.map(ErrorCode::from_str) {
        Some(Ok(code)) => code.retry_class(),
        Some(Err(_)) => class_of_unknown_code(status.code()),
        None => class_without_code(status.code()),
    };
    let code = sent_code.map_or_else(|| grpc_code_name(status.code()).to_owned(), str::to_owned);
    let message = status.message().to_owned();
    match class {
        Some(class) => Classification::RetryLater(RetryLater { after: retry_after(status), class, code, message }),
        None => Classification::Reject(Rejection {
            grpc_code: status.code(),
            code,
            message,
            attempt_id: metadata_str(status, ATTEMPT_ID_METADATA).map(str::to_owned),
        }),
    }
}

/// A status the server's handlers did not produce (no `chargeguard-error-code`).
fn class_without_code(code: Code) -> Option<RetryClass> {
    match code {
        // tonic: connection refused/reset (UNAVAILABLE), a stream ended without a status or an
        // error it cannot place (UNKNOWN).
        Code::Unavailable | Code::Unknown => Some(RetryClass::Transport),
        // tonic reports an expired `timeout` / `grpc-timeout` as CANCELLED.
        Code::DeadlineExceeded | Code::Cancelled => Some(RetryClass::DeadlineExceeded),
        // HTTP/2 ENHANCE_YOUR_CALM, a proxy's limit.
        Code::ResourceExhausted => Some(RetryClass::ResourceExhausted),
        _ => None,
    }
}

/// A `chargeguard-error-code` newer than this client: the gRPC code's usual meaning.
fn class_of_unknown_code(code: Code) -> Option<RetryClass> {
    match code {
        Code::Unavailable => Some(RetryClass::Unavailable),
        Code::DeadlineExceeded => Some(RetryClass::DeadlineExceeded),
        Code::ResourceExhausted => Some(RetryClass::ResourceExhausted),
        _ => None,
    }
}

fn metadata_str<'a>(status: &'a Status, key: &str) -> Option<&'a str> {
    status.metadata().get(key).and_then(|value| value.to_str().ok())
}

/// The server's wait: `chargeguard-retry-after-ms` exactly, else `retry-after` in seconds.
fn retry_after(status: &Status) -> Duration {
    if let Some(millis) = metadata_str(status, RETRY_AFTER_MS_METADATA).and_then(|value| value.trim().parse().ok()) {
        return Duration::from_millis(millis);
    }
    metadata_str(status, RETRY_AFTER_METADATA)
        .and_then(|value| value.trim().parse().ok())
        .map_or(Duration::ZERO, Duration::from_secs)
}

/// The gRPC code's snake_case name, as the code of an error the server did not name.
fn grpc_code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "ok",
        Code::Cancelled => "cancelled",
        Code::Unknown => "unknown",
        Code::InvalidArgument => "invalid_argument",
        Code::DeadlineExceeded => "deadline_exceeded",
        Code::NotFound => "not_found",
        Code::AlreadyExists => "already_exists",
        Code::PermissionDenied => "permission_denied",
        Code::ResourceExhausted => "resource_exhausted",
        Code::FailedPrecondition => "failed_precondition",
        Code::Aborted => "aborted",
        Code::OutOfRange => "out_of_range",
        Code::Unimplemented => "unimplemented",
        Code::Internal => "internal",
        Code::Unavailable => "unavailable",
        Code::DataLoss => "data_loss",
        Code::Unauthenticated => "unauthenticated",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::metadata::MetadataValue;

    fn with_code(grpc: Code, code: &'static str) -> Status {
        let mut status = Status::new(grpc, "message");
        status.metadata_mut().insert(ERROR_CODE_METADATA, MetadataValue::from_static(code));
        status
    }

    /// `"reject"` or `"retry_later:<class>"`, so one table reads like README.md's.
    fn check(status: &Status, expected: &str) {
        let found = match classify(status) {
            Classification::Reject(_) => "reject".to_owned(),
            Classification::RetryLater(later) => format!("retry_later:{}", later.class),
        };
        assert_eq!(found, expected, "{status:?}");
    }

    #[test]
    fn every_error_code_is_classified_as_the_readme_says() {
        let table = [
            (Code::InvalidArgument, "invalid_argument", "reject"),
            (Code::InvalidArgument, "undecodable_request", "reject"),
            (Code::ResourceExhausted, "request_too_large", "reject"),
            (Code::Unauthenticated, "unauthenticated", "reject"),
            (Code::PermissionDenied, "permission_denied", "reject"),
            (Code::NotFound, "not_found", "reject"),
            (Code::FailedPrecondition, "operation_mismatch", "reject"),
            (Code::FailedPrecondition, "operation_already_succeeded", "reject"),
            (Code::FailedPrecondition, "attempt_out_of_order", "reject"),
            (Code::FailedPrecondition, "needs_review", "reject"),
            (Code::FailedPrecondition, "not_flagged", "reject"),
            (Code::FailedPrecondition, "charge_not_succeeded", "reject"),
            (Code::FailedPrecondition, "charge_fully_refunded", "reject"),
            (Code::FailedPrecondition, "refund_exceeds_charge", "reject"),
            (Code::ResourceExhausted, "report_too_large", "reject"),
            (Code::Unimplemented, "unimplemented", "reject"),
            (Code::Internal, "internal", "reject"),
            (Code::Unavailable, "outcome_unknown", "retry_later:outcome_unknown"),
            (Code::Unavailable, "provider_failure_replayed", "retry_later:outcome_unknown"),
            (Code::Unavailable, "in_progress", "retry_later:in_progress"),
            (Code::Unavailable, "unavailable", "retry_later:unavailable"),
            (Code::Unavailable, "provider_unavailable", "retry_later:unavailable"),
            (Code::ResourceExhausted, "rate_limited", "retry_later:resource_exhausted"),
            (Code::ResourceExhausted, "too_many_calls_in_flight", "retry_later:resource_exhausted"),
        ];
        assert_eq!(table.len(), ErrorCode::ALL.len());
        for (code, (grpc, name, expected)) in ErrorCode::ALL.into_iter().zip(table) {
            assert_eq!(code.as_str(), name, "the table follows ErrorCode::ALL");
            check(&with_code(grpc, name), expected);
            assert_eq!(code.retryable(), expected != "reject", "{name}");
        }
    }

    #[test]
    fn a_status_without_our_code_is_classified_by_its_grpc_code() {
        let table = [
            (Code::Ok, "reject"),
            (Code::Cancelled, "retry_later:deadline_exceeded"),
            (Code::Unknown, "retry_later:transport"),
            (Code::InvalidArgument, "reject"),
            (Code::DeadlineExceeded, "retry_later:deadline_exceeded"),
            (Code::NotFound, "reject"),
            (Code::AlreadyExists, "reject"),
            (Code::PermissionDenied, "reject"),
            (Code::ResourceExhausted, "retry_later:resource_exhausted"),
            (Code::FailedPrecondition, "reject"),
            (Code::Aborted, "reject"),
            (Code::OutOfRange, "reject"),
            (Code::Unimplemented, "reject"),
            (Code::Internal, "reject"),
            (Code::Unavailable, "retry_later:transport"),
            (Code::DataLoss, "reject"),
            (Code::Unauthenticated, "reject"),
        ];
        for (grpc, expected) in table {
            check(&Status::new(grpc, "no code"), expected);
        }
    }

    #[test]
    fn a_code_newer_than_the_client_is_classified_by_its_grpc_code() {
        check(&with_code(Code::Unavailable, "some_new_code"), "retry_later:unavailable");
        check(&with_code(Code::DeadlineExceeded, "some_new_code"), "retry_later:deadline_exceeded");
        check(&with_code(Code::ResourceExhausted, "some_new_code"), "retry_later:resource_exhausted");
        check(&with_code(Code::FailedPrecondition, "some_new_code"), "reject");
        check(&with_code(Code::Unknown, "some_new_code"), "reject");
    }

    #[test]
    fn a_rejection_keeps_the_code_message_and_attempt() {
        let mut status = with_code(Code::FailedPrecondition, "operation_mismatch");
        status.metadata_mut().insert(ATTEMPT_ID_METADATA, MetadataValue::from_static("0190-attempt"));
        let Classification::Reject(rejection) = classify(&status) else { panic!("not a rejection") };
        assert_eq!(rejection.grpc_code, Code::FailedPrecondition);
        assert_eq!(rejection.code, "operation_mismatch");
        assert_eq!(rejection.message, "message");
        assert_eq!(rejection.attempt_id.as_deref(), Some("0190-attempt"));

        let Classification::Reject(bare) = classify(&Status::internal("h2 protocol error")) else { panic!("not a rejection") };
        assert_eq!((bare.code.as_str(), bare.attempt_id), ("internal", None));
    }

    #[test]
    fn the_retry_hint_is_read_in_milliseconds_first_then_seconds() {
        let mut status = with_code(Code::ResourceExhausted, "rate_limited");
        status.metadata_mut().insert(RETRY_AFTER_METADATA, MetadataValue::from_static("2"));
        let after = |status: &Status| match classify(status) {
            Classification::RetryLater(later) => later.after,
            Classification::Reject(rejection) => panic!("rejected: {rejection}"),
        };
        assert_eq!(after(&status), Duration::from_secs(2));
        status.metadata_mut().insert(RETRY_AFTER_MS_METADATA, MetadataValue::from_static("1250"));
        assert_eq!(after(&status), Duration::from_millis(1250));
        assert_eq!(after(&with_code(Code::Unavailable, "outcome_unknown")), Duration::ZERO);
        let mut garbled = with_code(Code::ResourceExhausted, "rate_limited");
        garbled.metadata_mut().insert(RETRY_AFTER_METADATA, MetadataValue::from_static("soon"));
        assert_eq!(after(&garbled), Duration::ZERO);
    }

    #[test]
    fn a_transport_error_is_named_by_its_grpc_code() {
        let Classification::RetryLater(later) = classify(&Status::unavailable("tcp connect error")) else { panic!("rejected") };
        assert_eq!((later.class, later.code.as_str(), later.after), (RetryClass::Transport, "unavailable", Duration::ZERO));
    }
}
