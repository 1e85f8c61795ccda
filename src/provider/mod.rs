//! The payment provider behind a trait. Only `stripe.rs` (and the transport under it) knows
//! async-stripe's types; everything it returns is classified into the few cases the orchestrator
//! must tell apart.

mod create_intent;
mod stripe;
mod transport;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::domain::{
    AttemptId, ChargeParams, ConsumerName, Failure, IdempotencyKey, Metadata, OperationKey, PaymentSnapshot,
    RefundSnapshot,
};

pub use self::stripe::{StripeProvider, StripeProviderConfig};

/// Metadata keys chargeguard writes on every provider object, so that an object can be found
/// again without its idempotency key.
pub const METADATA_ATTEMPT_ID: &str = "chargeguard_attempt_id";
pub const METADATA_CONSUMER: &str = "chargeguard_consumer";
pub const METADATA_OPERATION_KEY: &str = "chargeguard_operation_key";

/// What a create call is for.
#[derive(Debug, Clone, Copy)]
pub struct CreatePayment<'a> {
    pub attempt_id: AttemptId,
    pub consumer: &'a ConsumerName,
    pub operation_key: &'a OperationKey,
    pub params: &'a ChargeParams,
    pub idempotency_key: &'a IdempotencyKey,
    /// As stored on the attempt when it was written: a re-send under the key sends the same.
    pub return_url: Option<&'a str>,
}

/// A confirmation of an existing payment with a (new) payment method: Stripe's recovery after a
/// decline (`POST /v1/payment_intents/{id}/confirm`). A payment succeeds at most once, so the
/// provider itself refuses a second success.
#[derive(Debug, Clone, Copy)]
pub struct ConfirmPayment<'a> {
    pub provider_payment_id: &'a str,
    pub payment_method: &'a str,
    /// The confirming attempt's own key (never the key that created the payment).
    pub idempotency_key: &'a IdempotencyKey,
    pub return_url: Option<&'a str>,
}

/// What a refund create is for. The metadata sent is the caller's plus the three
/// `METADATA_*` keys naming the refund attempt, so that the refund can be found again by listing
/// the payment's refunds (Stripe has no refund search).
#[derive(Debug, Clone, Copy)]
pub struct CreateRefund<'a> {
    /// The refund attempt (not the charge it refunds).
    pub attempt_id: AttemptId,
    pub consumer: &'a ConsumerName,
    /// The refund's own operation key.
    pub operation_key: &'a OperationKey,
    /// The provider's payment (a PaymentIntent id) the money comes back from.
    pub payment_id: &'a str,
    pub amount_minor: i64,
    /// Stripe's `duplicate`, `fraudulent` or `requested_by_customer`.
    pub reason: Option<&'a str>,
    pub metadata: &'a Metadata,
    pub idempotency_key: &'a IdempotencyKey,
}

/// A refund create that the provider decided.
#[derive(Debug, Clone)]
pub enum RefundOutcome {
    /// The provider holds this refund (pending, succeeded, or already failed).
    Refund(RefundSnapshot),
    /// Refused before anything moved: more than is left to refund, a charge already fully
    /// refunded (`charge_already_refunded`), disputed, or not refundable. Terminal; the same key
    /// would get the same answer.
    Rejected { failure: Failure },
}

/// A create that the provider decided. Every case is terminal or a known provider state.
#[derive(Debug, Clone)]
pub enum CreateOutcome {
    /// The provider holds this object (succeeded, processing, requires action, ...).
    Payment(PaymentSnapshot),
    /// A business decline (card_error): a terminal result, not an error to retry.
    Declined { failure: Failure, provider_payment_id: Option<String> },
    /// The provider refused the request as invalid before executing anything (no such payment
    /// method, amount too small): terminal, and a retry with the same key would get the same.
    Rejected { failure: Failure },
}

/// A call whose result cannot be used as an outcome.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ProviderError {
    /// The provider may or may not have executed the request: timeout, 5xx, reset connection,
    /// a key still in use, an unreadable answer. The attempt must stay pending.
    #[error("outcome unknown: {0}")]
    OutcomeUnknown(String),
    /// Certainly not executed, but not a business outcome either (auth, rate limit): retry later.
    #[error("not executed: {0}")]
    NotExecuted(String),
    /// The object does not exist at the provider.
    #[error("not found: {0}")]
    NotFound(String),
    /// The provider reports that our key was used with other parameters: chargeguard's own key
    /// discipline failed, so nothing may be assumed; a person must look.
    #[error("idempotency key conflict: {0}")]
    KeyConflict(String),
    /// The provider saved a failed answer for this key and replays it (Stripe API v1 saves
    /// 500s too, `Idempotent-Replayed: true`); it will never answer this key differently.
    /// Whether the object exists is unknown: re-sending is pointless, only a lookup by
    /// metadata can tell. Returned for a create only.
    #[error("replayed failure: {0}")]
    ReplayedFailure(String),
}

/// The period in which a lookup expects the attempt's object to have been created.
#[derive(Debug, Clone, Copy)]
pub struct CreatedRange {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
}

/// One page of a list, oldest-first order not guaranteed.
#[derive(Debug, Clone)]
pub struct PaymentPage {
    pub payments: Vec<PaymentSnapshot>,
    /// Pass to the next call; `None` on the last page.
    pub next_cursor: Option<String>,
}

/// One page of the refunds list.
#[derive(Debug, Clone)]
pub struct RefundPage {
    pub refunds: Vec<RefundSnapshot>,
    /// Pass to the next call; `None` on the last page.
    pub next_cursor: Option<String>,
}

#[async_trait]
pub trait PaymentProvider: Send + Sync + 'static {
    fn name(&self) -> &'static str;

    /// Sends one create with the given key. Never retries: a retry policy that changed the key
    /// would charge twice, so retries belong to the orchestrator, with the stored key.
    async fn create_payment(&self, request: CreatePayment<'_>) -> Result<CreateOutcome, ProviderError>;

    async fn retrieve_payment(&self, provider_payment_id: &str) -> Result<PaymentSnapshot, ProviderError>;

    async fn cancel_payment(&self, provider_payment_id: &str) -> Result<PaymentSnapshot, ProviderError>;

    /// The objects the provider's search finds carrying the attempt's id in its metadata. One
    /// call. Search lags behind writes (up to an hour in outages): finding nothing proves
    /// nothing until the list endpoint, which does not lag, agrees.
    async fn search_payments_for_attempt(
        &self,
        attempt_id: AttemptId,
    ) -> Result<Vec<PaymentSnapshot>, ProviderError>;

    async fn list_payments(
        &self,
        created: CreatedRange,
        cursor: Option<&str>,
        limit: u32,
    ) -> Result<PaymentPage, ProviderError>;

    /// Confirms an existing payment with `payment_method` under the confirming attempt's key.
    /// Classified exactly as `create_payment`: a decline is `CreateOutcome::Declined` carrying
    /// the payment's id; a payment that cannot be confirmed (already succeeded, canceled) is
    /// `Rejected` (`payment_intent_unexpected_state`). Never retries.
    async fn confirm_payment(&self, request: ConfirmPayment<'_>) -> Result<CreateOutcome, ProviderError>;

    /// Sends one refund create with the given key; classified like `create_payment` (a 5xx or
    /// timeout is `OutcomeUnknown`, a replayed saved failure `ReplayedFailure`, a key used with
    /// other parameters `KeyConflict`). Never retries.
    async fn create_refund(&self, request: CreateRefund<'_>) -> Result<RefundOutcome, ProviderError>;

    async fn retrieve_refund(&self, provider_refund_id: &str) -> Result<RefundSnapshot, ProviderError>;

    /// One page of a payment's refunds, newest first (the list does not lag, unlike search).
    async fn list_refunds_for_payment(
        &self,
        provider_payment_id: &str,
        cursor: Option<&str>,
        limit: u32,
    ) -> Result<RefundPage, ProviderError>;

    /// Refunds created in `created` (reports total what the provider returned).
    async fn list_refunds(
        &self,
        created: CreatedRange,
        cursor: Option<&str>,
        limit: u32,
    ) -> Result<RefundPage, ProviderError>;
}
