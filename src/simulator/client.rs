//! A typed client for the `/_sim` control routes.

use std::time::Duration;

use anyhow::Context as _;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::control::{
    AdvanceClock, Authenticate, AuthenticationOutcome, Clock, CloseDispute, Connections, FailRefund,
    ForcePaymentIntent, Ledger, LedgerPaymentIntent, OpenDispute, RefundMode, RequestLogEntry,
    SeedPaymentIntent, SetFault, SetRefundMode, SetWebhookMode, SetWebhookTarget,
};
use super::model::DisputeStatus;
use super::faults::{FaultSpec, FaultTarget};
use super::webhooks::{DeliveryRecord, EventRecord, FlushReport, WebhookMode};

/// Bound on one control call; a webhook flush may take several delivery timeouts.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, Clone)]
pub struct SimControl {
    http: reqwest::Client,
    /// `http://host:port/`
    base_url: String,
}

impl SimControl {
    /// `base_url` is the simulator's base URL (with or without the trailing slash).
    pub fn new(base_url: impl Into<String>) -> Self {
        let mut base_url = base_url.into();
        if !base_url.ends_with('/') {
            base_url.push('/');
        }
        let http = reqwest::Client::builder()
            .timeout(CONTROL_TIMEOUT)
            .build()
            .unwrap_or_default();
        Self { http, base_url }
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&(impl Serialize + Sync)>,
    ) -> anyhow::Result<T> {
        let url = format!("{}_sim/{path}", self.base_url);
        let mut request = self.http.request(method.clone(), &url);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request
            .send()
            .await
            .with_context(|| format!("{method} {url}"))?;
        let status = response.status();
        let bytes = response
            .bytes()
            .await
            .with_context(|| format!("{method} {url}: reading the body"))?;
        if !status.is_success() {
            let message = serde_json::from_slice::<Value>(&bytes)
                .ok()
                .and_then(|value| {
                    value
                        .get("error")
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                })
                .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
            anyhow::bail!("{method} {url}: {status}: {message}");
        }
        serde_json::from_slice(&bytes).with_context(|| format!("{method} {url}: decoding the body"))
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        self.call(reqwest::Method::GET, path, None::<&()>).await
    }

    async fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &(impl Serialize + Sync),
    ) -> anyhow::Result<T> {
        self.call(reqwest::Method::POST, path, Some(body)).await
    }

    async fn delete(&self, path: &str) -> anyhow::Result<()> {
        self.call::<Value>(reqwest::Method::DELETE, path, None::<&()>)
            .await
            .map(drop)
    }

    /// Unix seconds of the sim clock.
    pub async fn now(&self) -> anyhow::Result<i64> {
        Ok(self.get::<Clock>("clock").await?.now)
    }

    /// TCP connections the simulator has accepted since it started.
    pub async fn connections_accepted(&self) -> anyhow::Result<u64> {
        Ok(self.get::<Connections>("connections").await?.accepted)
    }

    /// Moves the sim clock forward (whole seconds); returns the new time. Settlements, key
    /// pruning and the search index follow at once.
    pub async fn advance_clock(&self, by: Duration) -> anyhow::Result<i64> {
        Ok(self
            .post::<Clock>(
                "clock/advance",
                &AdvanceClock {
                    seconds: by.as_secs(),
                },
            )
            .await?
            .now)
    }

    /// Installs (or replaces) the fault of `target` (an [`super::Endpoint`] or [`FaultTarget::All`]).
    pub async fn set_fault(
        &self,
        target: impl Into<FaultTarget>,
        spec: FaultSpec,
    ) -> anyhow::Result<()> {
        self.post::<Value>(
            "faults",
            &SetFault {
                target: target.into(),
                spec,
            },
        )
        .await
        .map(drop)
    }

    /// Faults still installed (a `Next(n)` fault shows its remaining count).
    pub async fn faults(&self) -> anyhow::Result<Vec<(FaultTarget, FaultSpec)>> {
        let faults: Vec<SetFault> = self.get("faults").await?;
        Ok(faults
            .into_iter()
            .map(|fault| (fault.target, fault.spec))
            .collect())
    }

    pub async fn clear_faults(&self) -> anyhow::Result<()> {
        self.delete("faults").await
    }

    pub async fn ledger(&self) -> anyhow::Result<Ledger> {
        self.get("ledger").await
    }

    /// The request log ring, oldest first.
    pub async fn requests(&self) -> anyhow::Result<Vec<RequestLogEntry>> {
        self.get("requests").await
    }

    pub async fn set_webhook_target(
        &self,
        url: impl Into<String>,
        secret: impl Into<String>,
    ) -> anyhow::Result<()> {
        self.post::<Value>(
            "webhooks/target",
            &SetWebhookTarget {
                url: url.into(),
                secret: secret.into(),
            },
        )
        .await
        .map(drop)
    }

    pub async fn clear_webhook_target(&self) -> anyhow::Result<()> {
        self.delete("webhooks/target").await
    }

    pub async fn set_webhook_mode(&self, mode: WebhookMode) -> anyhow::Result<()> {
        self.post::<Value>("webhooks/mode", &SetWebhookMode { mode })
            .await
            .map(drop)
    }

    /// Delivers every queued webhook now (ignoring backoff) until each is delivered or given up.
    pub async fn flush_webhooks(&self) -> anyhow::Result<FlushReport> {
        self.post("webhooks/flush", &Value::Null).await
    }

    /// Events generated (delivered or not), oldest first.
    pub async fn events(&self) -> anyhow::Result<Vec<EventRecord>> {
        self.get("webhooks/events").await
    }

    /// Delivery attempts, oldest first.
    pub async fn deliveries(&self) -> anyhow::Result<Vec<DeliveryRecord>> {
        self.get("webhooks/deliveries").await
    }

    /// Completes or fails the customer action of a `requires_action` payment intent; returns
    /// the intent's JSON.
    pub async fn authenticate(
        &self,
        payment_intent_id: &str,
        outcome: AuthenticationOutcome,
    ) -> anyhow::Result<Value> {
        self.post(
            &format!("payment_intents/{payment_intent_id}/authenticate"),
            &Authenticate { outcome },
        )
        .await
    }

    /// Creates a payment intent directly, without `/v1` or idempotency (seeds discrepancies).
    pub async fn seed_payment_intent(
        &self,
        seed: SeedPaymentIntent,
    ) -> anyhow::Result<LedgerPaymentIntent> {
        self.post("payment_intents", &seed).await
    }

    /// Overwrites an intent's amount and/or status, without an event.
    pub async fn force_payment_intent(
        &self,
        payment_intent_id: &str,
        force: ForcePaymentIntent,
    ) -> anyhow::Result<()> {
        self.post::<Value>(
            &format!("payment_intents/{payment_intent_id}/force"),
            &force,
        )
        .await
        .map(drop)
    }

    /// The status refunds created from now on start in.
    pub async fn set_refund_mode(&self, mode: RefundMode) -> anyhow::Result<()> {
        self.post::<Value>("refunds/mode", &SetRefundMode { mode })
            .await
            .map(drop)
    }

    /// Fails a pending or succeeded refund (the amount is refundable again); returns the
    /// refund's JSON. `None` fails it with `expired_or_canceled_card`.
    pub async fn fail_refund(
        &self,
        refund_id: &str,
        failure_reason: Option<&str>,
    ) -> anyhow::Result<Value> {
        let body = FailRefund {
            failure_reason: failure_reason.map(str::to_owned),
        };
        self.post(&format!("refunds/{refund_id}/fail"), &body).await
    }

    /// A pending refund succeeds; returns the refund's JSON.
    pub async fn settle_refund(&self, refund_id: &str) -> anyhow::Result<Value> {
        self.post(&format!("refunds/{refund_id}/settle"), &Value::Null)
            .await
    }

    /// Opens a dispute on a succeeded intent's charge; returns the dispute's JSON.
    pub async fn open_dispute(
        &self,
        payment_intent_id: &str,
        open: OpenDispute,
    ) -> anyhow::Result<Value> {
        self.post(&format!("payment_intents/{payment_intent_id}/dispute"), &open)
            .await
    }

    /// Closes a dispute as `won` or `lost`; returns the dispute's JSON.
    pub async fn close_dispute(
        &self,
        dispute_id: &str,
        status: DisputeStatus,
    ) -> anyhow::Result<Value> {
        self.post(&format!("disputes/{dispute_id}/close"), &CloseDispute { status })
            .await
    }
}
