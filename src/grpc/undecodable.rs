//! A request message that does not decode. tonic answers it with INTERNAL ("failed to decode
//! Protobuf message: …", or a framing error) before any handler runs, which reads as the
//! server's fault and invites a retry of the same bytes. This layer turns that answer into
//! INVALID_ARGUMENT (`status::undecodable_request`). Only statuses without a
//! `chargeguard-error-code` are touched: every status chargeguard makes itself carries one.

use tonic::body::Body;
use tonic::{Code, Status};
use tower::util::MapResponseLayer;

use super::{ERROR_CODE_METADATA, status};

/// The layer for `Server::builder().layer(…)`.
pub fn undecodable_request_layer() -> MapResponseLayer<fn(http::Response<Body>) -> http::Response<Body>> {
    MapResponseLayer::new(rename_decode_failure)
}

fn rename_decode_failure(response: http::Response<Body>) -> http::Response<Body> {
    // Answered before a message was sent, so the status is in the headers and in the extensions.
    let Some(tonic_status) = response.extensions().get::<Status>().filter(|status| is_tonic_decode_failure(status)) else {
        return response;
    };
    tracing::info!(detail = tonic_status.message(), "gRPC request refused: the message does not decode");
    status::undecodable_request().into_http()
}

fn is_tonic_decode_failure(status: &Status) -> bool {
    status.code() == Code::Internal && !status.metadata().contains_key(ERROR_CODE_METADATA)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_tonics_own_internal_answers_are_renamed() {
        assert!(is_tonic_decode_failure(&Status::internal("failed to decode Protobuf message: invalid wire type")));
        let mut ours = Status::internal("internal error");
        ours.metadata_mut().insert(ERROR_CODE_METADATA, "internal".parse().unwrap());
        assert!(!is_tonic_decode_failure(&ours));
        assert!(!is_tonic_decode_failure(&Status::invalid_argument("x")));
    }
}
