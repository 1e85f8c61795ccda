//! A client for chargeguard's gRPC API that says, for every call, what a consumer should do
//! next: [`Answer::Done`] (the attempt is decided or read), [`Answer::RetryLater`] (nothing is
//! lost; call again with the same request, the service answers the same operation once) or
//! [`Answer::Reject`] (the same request will be refused again: dead-letter it).
//!
//! The classification is by the stable code the server puts in `chargeguard-error-code`
//! ([`ErrorCode`]), and, for errors the server never saw (a refused connection, an expired
//! deadline), by the gRPC code alone. README.md has the whole table.
//!
//! ```no_run
//! use chargeguard_client::{Answer, ChargeRequest, Client, ClientConfig};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::connect_lazy(ClientConfig {
//!     endpoints: vec!["http://127.0.0.1:50051".into()],
//!     token: Some(std::env::var("CHARGEGUARD_TOKEN")?),
//!     ..ClientConfig::default()
//! })?;
//! let request = ChargeRequest {
//!     operation_key: "order-1234:charge".into(),
//!     amount_minor: 1999,
//!     currency: "usd".into(),
//!     payment_method: "pm_card_visa".into(),
//!     ..ChargeRequest::default()
//! };
//! match client.charge_until_decided(request).await {
//!     Answer::Done(response) => println!("decided: {:?}", response.attempt),
//!     Answer::RetryLater(later) => println!("redeliver after {:?}: {later}", later.after),
//!     Answer::Reject(rejection) => println!("dead-letter: {rejection}"),
//! }
//! # Ok(())
//! # }
//! ```

mod answer;
mod backoff;
mod classify;
mod client;
mod config;
mod error_code;

/// The generated code of the server's `proto/chargeguard/v1/` (messages, `payments_client`,
/// `reports_client`).
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod proto {
    tonic::include_proto!("chargeguard.v1");
}

pub use answer::{Answer, Classification, Rejection, RetryClass, RetryLater};
pub use backoff::Backoff;
pub use classify::classify;
pub use client::Client;
pub use config::{ClientConfig, ConfigError, TlsIdentity, TlsOptions};
pub use error_code::{ErrorCode, UnknownErrorCode};
pub use proto::{
    ChargeRequest, ChargeResponse, GetAttemptRequest, GetAttemptResponse, ListAttemptsRequest, ListAttemptsResponse,
    RefundRequest, RefundResponse,
};

/// Metadata key of the stable, machine-matchable code on every error status the server sends.
pub const ERROR_CODE_METADATA: &str = "chargeguard-error-code";
/// Metadata key of the attempt an error is about, when there is one.
pub const ATTEMPT_ID_METADATA: &str = "chargeguard-attempt-id";
/// Metadata key of the server's wait before a retry, in whole seconds (HTTP's `Retry-After`).
pub const RETRY_AFTER_METADATA: &str = "retry-after";
/// Metadata key of the server's wait before a retry, in milliseconds (preferred when present).
pub const RETRY_AFTER_MS_METADATA: &str = "chargeguard-retry-after-ms";
