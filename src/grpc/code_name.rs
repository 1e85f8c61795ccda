//! One name per gRPC status code, snake_case like chargeguard's own error codes: the `code`
//! label of the request histogram, the load generator's failure tallies, and (upper-cased, the
//! way grpcurl prints them) the CLI's error lines.

use tonic::Code;

pub fn code_name(code: Code) -> &'static str {
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

    #[test]
    fn grpc_codes_read_like_error_codes() {
        assert_eq!(code_name(Code::Unavailable), "unavailable");
        assert_eq!(code_name(Code::FailedPrecondition), "failed_precondition");
    }
}
