use std::collections::{BTreeMap, HashMap};
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, TimeZone, Utc};
use stripe::{ApiErrors, ApiErrorsType, RequestStrategy, StripeError, StripeRequest};
use stripe_core::payment_intent::{
    CancelPaymentIntent, ConfirmPaymentIntent, ListPaymentIntent, RetrievePaymentIntent,
    SearchPaymentIntent,
};
use stripe_core::refund::{CreateRefund as StripeCreateRefund, CreateRefundReason, ListRefund, RetrieveRefund};
use stripe_core::{PaymentIntent, PaymentIntentStatus, Refund};
use stripe_types::{Currency as StripeCurrency, RangeBoundsTs, RangeQueryTs};

use super::create_intent::CreateConfirmedIntent;
use super::transport::{CallError, PooledStripeClient};
use super::{
    ConfirmPayment, CreateOutcome, CreatePayment, CreateRefund, CreatedRange, METADATA_ATTEMPT_ID,
    METADATA_CONSUMER, METADATA_OPERATION_KEY, PaymentPage, PaymentProvider, ProviderError, RefundOutcome,
    RefundPage,
};
use crate::domain::{
    AttemptId, ConsumerName, Failure, IdempotencyKey, Metadata, NextAction, OperationKey, PaymentSnapshot,
    ProviderPaymentStatus, RefundSnapshot,
};
use crate::secret::Secret;

/// Stripe's largest page.
const PAGE_SIZE_MAX: u32 = 100;

#[derive(Debug, Clone)]
pub struct StripeProviderConfig {
    pub api_key: Secret,
    /// `None` for Stripe itself; the simulator's URL otherwise (with a trailing slash).
    pub base_url: Option<String>,
    /// Per call. A call that times out has an unknown outcome.
    pub call_timeout: Duration,
    /// Idle connections kept open to the provider.
    pub idle_connections_max: usize,
    /// Bound on the body of one answer; a longer one is an error (outcome unknown for a create).
    pub response_body_bytes_max: usize,
}

impl StripeProviderConfig {
    /// The provider section of the configuration; the API key must be set by then.
    pub fn from_config(config: &crate::config::ProviderConfig) -> anyhow::Result<Self> {
        let api_key = config
            .api_key
            .clone()
            .ok_or_else(|| anyhow::anyhow!("provider.api_key is not set (CHARGEGUARD_PROVIDER__API_KEY)"))?;
        Ok(Self {
            api_key,
            base_url: config.base_url.clone(),
            call_timeout: Duration::from_millis(config.call_timeout_ms),
            idle_connections_max: config.idle_connections_max,
            response_body_bytes_max: config.response_body_bytes_max,
        })
    }
}

pub struct StripeProvider {
    client: PooledStripeClient,
}

impl StripeProvider {
    pub fn new(config: StripeProviderConfig) -> Result<Self, ProviderError> {
        let client = PooledStripeClient::new(&config)
            .map_err(|error| ProviderError::NotExecuted(format!("stripe client: {error}")))?;
        Ok(Self { client })
    }
}

impl StripeProvider {
    /// Sends one keyed write whose answer is a PaymentIntent (a create or a confirm), read as
    /// a create's answer.
    async fn send_payment_write(
        &self,
        request: &impl StripeRequest<Output = PaymentIntent>,
        key: &IdempotencyKey,
    ) -> Result<CreateOutcome, ProviderError> {
        let answer = request.customize().request_strategy(idempotent(key)?).send(&self.client).await;
        match answer {
            Ok(intent) => Ok(CreateOutcome::Payment(snapshot(&intent))),
            Err(error) => classify_create_error(error),
        }
    }
}

#[async_trait]
impl PaymentProvider for StripeProvider {
    fn name(&self) -> &'static str {
        "stripe"
    }

    async fn create_payment(&self, request: CreatePayment<'_>) -> Result<CreateOutcome, ProviderError> {
        let currency = StripeCurrency::from_str(request.params.currency.code())
            .map_err(|_| ProviderError::NotExecuted("unsupported currency".to_owned()))?;
        let metadata: BTreeMap<String, String> =
            tagged_metadata(&request.params.metadata, request.attempt_id, request.consumer, request.operation_key);
        let params = request.params;
        let create =
            CreateConfirmedIntent::new(params.amount_minor, currency, params.payment_method.as_str(), &metadata)
                .customer(params.customer.as_ref().map(|customer| customer.as_str()))
                .description(params.description.as_ref().map(|description| description.as_str()))
                .return_url(request.return_url);
        self.send_payment_write(&create, request.idempotency_key).await
    }

    async fn confirm_payment(&self, request: ConfirmPayment<'_>) -> Result<CreateOutcome, ProviderError> {
        let mut confirm =
            ConfirmPaymentIntent::new(request.provider_payment_id).payment_method(request.payment_method);
        if let Some(return_url) = request.return_url {
            confirm = confirm.return_url(return_url);
        }
        self.send_payment_write(&confirm, request.idempotency_key).await
    }

    async fn create_refund(&self, request: CreateRefund<'_>) -> Result<RefundOutcome, ProviderError> {
        let metadata: HashMap<String, String> = tagged_metadata(request.metadata, request.attempt_id, request.consumer, request.operation_key);
        let mut create = StripeCreateRefund::new()
            .payment_intent(request.payment_id)
            .amount(request.amount_minor)
            .metadata(metadata);
        if let Some(reason) = request.reason {
            // Infallible: an unknown reason is sent as given, and the provider names it.
            let Ok(reason) = CreateRefundReason::from_str(reason);
            create = create.reason(reason);
        }
        let answer = create
            .customize()
            .request_strategy(idempotent(request.idempotency_key)?)
            .send(&self.client)
            .await;
        match answer {
            Ok(refund) => Ok(RefundOutcome::Refund(refund_snapshot(&refund))),
            // A refund has no card to decline; a 402 would still be a refusal, not an unknown.
            Err(error) => classify_write_error(error).map(|refusal| match refusal {
                Refusal::Declined { failure, .. } | Refusal::Rejected { failure } => RefundOutcome::Rejected { failure },
            }),
        }
    }

    async fn retrieve_refund(&self, provider_refund_id: &str) -> Result<RefundSnapshot, ProviderError> {
        RetrieveRefund::new(provider_refund_id)
            .send(&self.client)
            .await
            .map(|refund| refund_snapshot(&refund))
            .map_err(classify_read_error)
    }

    async fn list_refunds_for_payment(
        &self,
        provider_payment_id: &str,
        cursor: Option<&str>,
        limit: u32,
    ) -> Result<RefundPage, ProviderError> {
        let mut list = ListRefund::new().payment_intent(provider_payment_id).limit(i64::from(limit.min(PAGE_SIZE_MAX)));
        if let Some(cursor) = cursor {
            list = list.starting_after(cursor);
        }
        let page = list.send(&self.client).await.map_err(classify_read_error)?;
        Ok(refund_page(&page))
    }

    async fn retrieve_payment(&self, provider_payment_id: &str) -> Result<PaymentSnapshot, ProviderError> {
        RetrievePaymentIntent::new(provider_payment_id)
            .send(&self.client)
            .await
            .map(|intent| snapshot(&intent))
            .map_err(classify_read_error)
    }

    async fn cancel_payment(&self, provider_payment_id: &str) -> Result<PaymentSnapshot, ProviderError> {
        CancelPaymentIntent::new(provider_payment_id)
            .send(&self.client)
            .await
            .map(|intent| snapshot(&intent))
            .map_err(classify_read_error)
    }

    async fn search_payments_for_attempt(
        &self,
        attempt_id: AttemptId,
    ) -> Result<Vec<PaymentSnapshot>, ProviderError> {
        let attempt = attempt_id.to_string();
        let query = format!("metadata['{METADATA_ATTEMPT_ID}']:'{attempt}'");
        let searched = SearchPaymentIntent::new(query)
            .limit(i64::from(PAGE_SIZE_MAX))
            .send(&self.client)
            .await
            .map_err(classify_read_error)?;
        // The query names the attempt; the filter keeps a search index's loose match honest.
        Ok(searched
            .data
            .iter()
            .filter(|intent| intent.metadata.get(METADATA_ATTEMPT_ID).is_some_and(|id| *id == attempt))
            .map(snapshot)
            .collect())
    }

    async fn list_payments(
        &self,
        created: CreatedRange,
        cursor: Option<&str>,
        limit: u32,
    ) -> Result<PaymentPage, ProviderError> {
        let mut list = ListPaymentIntent::new()
            .created(created_bounds(created))
            .limit(i64::from(limit.min(PAGE_SIZE_MAX)));
        if let Some(cursor) = cursor {
            list = list.starting_after(cursor);
        }
        let page = list.send(&self.client).await.map_err(classify_read_error)?;
        let next_cursor = if page.has_more { page.data.last().map(|i| i.id.to_string()) } else { None };
        Ok(PaymentPage { payments: page.data.iter().map(snapshot).collect(), next_cursor })
    }

    async fn list_refunds(
        &self,
        created: CreatedRange,
        cursor: Option<&str>,
        limit: u32,
    ) -> Result<RefundPage, ProviderError> {
        let mut list = ListRefund::new().created(created_bounds(created)).limit(i64::from(limit.min(PAGE_SIZE_MAX)));
        if let Some(cursor) = cursor {
            list = list.starting_after(cursor);
        }
        let page = list.send(&self.client).await.map_err(classify_read_error)?;
        Ok(refund_page(&page))
    }
}

fn idempotent(key: &IdempotencyKey) -> Result<RequestStrategy, ProviderError> {
    stripe::IdempotencyKey::new(key.as_str())
        .map(RequestStrategy::Idempotent)
        .map_err(|error| ProviderError::NotExecuted(format!("idempotency key: {error}")))
}

/// The caller's metadata plus the keys naming the attempt, as every object chargeguard creates
/// carries them.
fn tagged_metadata<M>(
    caller: &Metadata,
    attempt_id: AttemptId,
    consumer: &ConsumerName,
    operation_key: &OperationKey,
) -> M
where
    M: FromIterator<(String, String)> + Extend<(String, String)>,
{
    let mut metadata: M =
        caller.entries().iter().map(|(key, value)| (key.clone(), value.clone())).collect();
    metadata.extend([
        (METADATA_ATTEMPT_ID.to_owned(), attempt_id.to_string()),
        (METADATA_CONSUMER.to_owned(), consumer.to_string()),
        (METADATA_OPERATION_KEY.to_owned(), operation_key.to_string()),
    ]);
    metadata
}

fn refund_page(page: &stripe_types::List<Refund>) -> RefundPage {
    let next_cursor = if page.has_more { page.data.last().map(|r| r.id.to_string()) } else { None };
    RefundPage { refunds: page.data.iter().map(refund_snapshot).collect(), next_cursor }
}

fn refund_snapshot(refund: &Refund) -> RefundSnapshot {
    RefundSnapshot {
        id: refund.id.to_string(),
        payment_id: refund.payment_intent.as_ref().map(|intent| intent.id().to_string()),
        status: refund.status.clone().unwrap_or_default(),
        amount_minor: refund.amount,
        currency: refund.currency.to_string(),
        created: timestamp(refund.created),
        metadata: refund
            .metadata
            .iter()
            .flatten()
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect(),
        failure_reason: refund.failure_reason.clone(),
    }
}

/// `created` inclusive at both ends, in whole seconds as Stripe stores it.
fn created_bounds(created: CreatedRange) -> RangeQueryTs {
    RangeQueryTs::Bounds(RangeBoundsTs {
        gte: Some(created.from.timestamp()),
        lte: Some(created.to.timestamp()),
        ..Default::default()
    })
}

/// Stripe's error `code` (`card_declined`), its `decline_code` (`generic_decline`) kept in the
/// message; the webhook module reads an event's `last_payment_error` the same way.
fn failure_from(api: &ApiErrors, fallback_code: &str) -> Failure {
    Failure::from_provider_error(
        api.code.as_ref().map(|code| code.as_str()),
        api.decline_code.as_deref(),
        api.message.as_deref(),
        fallback_code,
    )
}

/// A write the provider refused as a business outcome: terminal whether first or replayed.
enum Refusal {
    Declined { failure: Failure, provider_payment_id: Option<String> },
    Rejected { failure: Failure },
}

fn classify_create_error(error: CallError) -> Result<CreateOutcome, ProviderError> {
    classify_write_error(error).map(|refusal| match refusal {
        Refusal::Declined { failure, provider_payment_id } => CreateOutcome::Declined { failure, provider_payment_id },
        Refusal::Rejected { failure } => CreateOutcome::Rejected { failure },
    })
}

/// How every keyed write (create, confirm, refund) reads a failed answer. The order matters. A 409 "key in use" first: Stripe never saves one, so it is never a
/// replay. Then the business outcomes (decline, invalid request) and a key conflict: the same
/// whether first or replayed — a replayed decline *is* the decision. Then a replay of anything
/// else (a saved 5xx, or any other non-success Stripe saved for the key): the key will never
/// answer differently, so re-sending it is pointless (`ReplayedFailure`). Only then the first
/// answers that leave the outcome unknown or the request unexecuted.
fn classify_write_error(error: CallError) -> Result<Refusal, ProviderError> {
    let (api, status, replayed) = match error {
        CallError::Stripe { error: StripeError::Stripe(api, status), replayed } => (api, status, replayed),
        CallError::Stripe { error, .. } => return Err(classify_transport_error(error)),
        // Cut off mid-answer: the create may have executed.
        too_large @ CallError::BodyTooLarge { .. } => {
            return Err(ProviderError::OutcomeUnknown(format!("{too_large}; the create may have executed")));
        }
    };
    if status == 409 || matches!(api.code, Some(stripe::ApiErrorsCode::IdempotencyKeyInUse)) {
        return Err(ProviderError::OutcomeUnknown(
            "the provider is still executing a request with this key".to_owned(),
        ));
    }
    let answered = || format!("provider answered {status}: {}", api.message.as_deref().unwrap_or(""));
    match (&api.type_, status) {
        (ApiErrorsType::CardError, _) | (_, 402) => Ok(Refusal::Declined {
            failure: failure_from(&api, "card_declined"),
            provider_payment_id: api.payment_intent.as_ref().map(|intent| intent.id.to_string()),
        }),
        (ApiErrorsType::IdempotencyError, _) => Err(ProviderError::KeyConflict(
            api.message.clone().unwrap_or_else(|| "idempotency_error".to_owned()),
        )),
        (ApiErrorsType::InvalidRequestError, 400 | 404) => {
            Ok(Refusal::Rejected { failure: failure_from(&api, "invalid_request") })
        }
        _ if replayed => Err(ProviderError::ReplayedFailure(format!("{}, replayed for this key", answered()))),
        (_, 401 | 403 | 429) => Err(ProviderError::NotExecuted(answered())),
        _ => Err(ProviderError::OutcomeUnknown(answered())),
    }
}

/// Reads (and a cancel, which has no key) are never replays: the header is not looked at.
fn classify_read_error(error: CallError) -> ProviderError {
    let error = match error {
        CallError::Stripe { error, .. } => error,
        too_large @ CallError::BodyTooLarge { .. } => return ProviderError::OutcomeUnknown(too_large.to_string()),
    };
    match error {
        StripeError::Stripe(api, 404) => {
            ProviderError::NotFound(api.message.clone().unwrap_or_default())
        }
        StripeError::Stripe(api, status @ (401 | 403 | 429)) => ProviderError::NotExecuted(format!(
            "provider answered {status}: {}",
            api.message.as_deref().unwrap_or("")
        )),
        StripeError::Stripe(api, status) => ProviderError::OutcomeUnknown(format!(
            "provider answered {status}: {}",
            api.message.as_deref().unwrap_or("")
        )),
        other => classify_transport_error(other),
    }
}

/// Anything but a parsed Stripe error: the request may have been executed.
fn classify_transport_error(error: StripeError) -> ProviderError {
    match error {
        StripeError::Timeout => ProviderError::OutcomeUnknown("timed out".to_owned()),
        StripeError::ClientError(message) => {
            ProviderError::OutcomeUnknown(format!("connection failed: {message}"))
        }
        // Also what a non-JSON 5xx from a proxy becomes: its status is lost.
        StripeError::JSONDeserialize(message) => {
            ProviderError::OutcomeUnknown(format!("unreadable answer: {message}"))
        }
        StripeError::ConfigError(message) => ProviderError::NotExecuted(message),
        StripeError::Stripe(api, status) => ProviderError::OutcomeUnknown(format!(
            "provider answered {status}: {}",
            api.message.as_deref().unwrap_or("")
        )),
    }
}

fn timestamp(seconds: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(seconds, 0).single().unwrap_or(DateTime::<Utc>::MIN_UTC)
}

fn snapshot(intent: &PaymentIntent) -> PaymentSnapshot {
    let status = match &intent.status {
        PaymentIntentStatus::Succeeded => ProviderPaymentStatus::Succeeded,
        PaymentIntentStatus::Processing => ProviderPaymentStatus::Processing,
        PaymentIntentStatus::RequiresAction => ProviderPaymentStatus::RequiresAction,
        PaymentIntentStatus::RequiresPaymentMethod => ProviderPaymentStatus::RequiresPaymentMethod,
        PaymentIntentStatus::RequiresConfirmation => ProviderPaymentStatus::RequiresConfirmation,
        PaymentIntentStatus::RequiresCapture => ProviderPaymentStatus::RequiresCapture,
        PaymentIntentStatus::Canceled => ProviderPaymentStatus::Canceled,
        // Non-exhaustive upstream: a status Stripe adds later is kept by name, never guessed.
        other => ProviderPaymentStatus::parse(other.as_str()),
    };
    PaymentSnapshot {
        id: intent.id.to_string(),
        status,
        amount_minor: intent.amount,
        amount_received_minor: intent.amount_received,
        currency: intent.currency.to_string(),
        created: timestamp(intent.created),
        metadata: intent.metadata.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        last_error: intent.last_payment_error.as_deref().map(|api| failure_from(api, "payment_failed")),
        next_action: intent.next_action.as_ref().map(|action| NextAction {
            kind: action.type_.clone(),
            redirect_url: action.redirect_to_url.as_ref().and_then(|redirect| redirect.url.clone()),
        }),
    }
}
