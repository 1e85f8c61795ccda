//! The gRPC edge: tonic services and the proto ⇄ domain conversions. The only module that knows
//! prost types; every error becomes a `tonic::Status` in one place (`status.rs`).

mod auth;
mod code_name;
pub(crate) mod convert;
mod error_code;
mod limits;
mod payments;
mod reports;
mod request_duration;
mod request_size;
mod status;
mod undecodable;

pub use code_name::code_name;
pub use error_code::ErrorCode;
pub use auth::{AuthError, Authenticator, bearer_token, certificate_sha256, hash_token};
pub use payments::PaymentsService;
pub use reports::{FinanceLinks, Operators, ReportsService};
pub use limits::{ConsumerLimitLayer, ConsumerLimits, LimitRefusal};
pub use request_duration::RequestDurationLayer;
pub use request_size::request_size_layer;
pub use status::{RETRY_AFTER_METADATA, RETRY_AFTER_MS_METADATA};
pub use undecodable::undecodable_request_layer;

/// The generated code of `proto/chargeguard/v1/` (payments.proto, reports.proto).
pub mod proto {
    tonic::include_proto!("chargeguard.v1");

    /// Encoded descriptors for server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("chargeguard_descriptor");
}

/// Metadata key carrying a stable, machine-matchable error code on every error status.
pub const ERROR_CODE_METADATA: &str = "chargeguard-error-code";
/// Metadata key carrying the attempt an error is about, when there is one.
pub const ATTEMPT_ID_METADATA: &str = "chargeguard-attempt-id";
