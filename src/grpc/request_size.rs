//! The gRPC request size limit. tonic's decoder refuses a message over
//! `max_decoding_message_size` before any handler runs, with `OUT_OF_RANGE` and its own text and
//! no `chargeguard-error-code`; this layer turns that one answer into chargeguard's
//! (`status::request_too_large`), so a caller can tell it from every other error.

use tonic::body::Body;
use tonic::{Code, Status};
use tower::util::MapResponseLayer;

use super::{ERROR_CODE_METADATA, status};

/// How tonic 0.14's decoder begins the message of a request over the limit (`codec/decode.rs`);
/// a test sends such a request, so a tonic that words it otherwise fails the build's tests.
const TONIC_DECODE_LIMIT_MESSAGE: &str = "Error, decoded message length too large: found ";

/// The layer for `Server::builder().layer(…)`. `limit_bytes` is the limit every service was
/// given (`max_decoding_message_size`), so the answer names the limit that was applied.
pub fn request_size_layer(limit_bytes: usize) -> MapResponseLayer<impl Fn(http::Response<Body>) -> http::Response<Body> + Clone> {
    MapResponseLayer::new(move |response| name_the_limit(response, limit_bytes))
}

fn name_the_limit(response: http::Response<Body>, limit_bytes: usize) -> http::Response<Body> {
    // A status answered before any message was sent travels in the response's headers, and
    // tonic keeps the `Status` itself in the extensions.
    let Some(found_bytes) = response.extensions().get::<Status>().and_then(decode_limit_found_bytes) else {
        return response;
    };
    tracing::info!(found_bytes, limit_bytes, "gRPC request refused: over server.grpc_request_bytes_max");
    status::request_too_large(limit_bytes, found_bytes).into_http()
}

/// The size tonic reports when `status` is its decode-limit refusal, `None` for anything else.
fn decode_limit_found_bytes(status: &Status) -> Option<u64> {
    if status.code() != Code::OutOfRange || status.metadata().contains_key(ERROR_CODE_METADATA) {
        return None;
    }
    let rest = status.message().strip_prefix(TONIC_DECODE_LIMIT_MESSAGE)?;
    rest.split(' ').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_tonics_decode_limit_is_renamed() {
        let tonic_limit = Status::out_of_range(
            "Error, decoded message length too large: found 5000000 bytes, the limit is: 4194304 bytes",
        );
        assert_eq!(decode_limit_found_bytes(&tonic_limit), Some(5_000_000));
        assert_eq!(decode_limit_found_bytes(&Status::out_of_range("page 7 is past the end")), None);
        assert_eq!(
            decode_limit_found_bytes(&Status::internal(
                "Error, decoded message length too large: found 1 bytes, the limit is: 0 bytes"
            )),
            None
        );
    }
}
