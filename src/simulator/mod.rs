//! A Stripe-compatible payment provider simulator.
//!
//! Offline it is the only provider chargeguard's tests, demo mode and benchmarks talk to, so it
//! reproduces what our correctness depends on: Stripe's idempotency (saved responses, replays,
//! parameter mismatch, keys in use, pruning after 24 hours), test payment methods, list and
//! lagging search, signed webhooks, plus what a test needs on top: a controllable clock, fault
//! injection and a ledger of what was really applied.
//!
//! Codemap:
//! - `server`: accepts connections (one hyper connection task each, so a fault can drop one),
//!   authenticates, admits and executes `/v1` requests; `control` serves `/_sim`.
//! - `wire`: form/bracket parsing of Stripe parameters and the Stripe error envelope.
//! - `state`: every object, and the operations on them; `model`: how objects render as JSON.
//! - `idempotency`, `faults`, `clock`, `search`, `webhooks`: one concern each.
//! - `client`: a typed client for `/_sim`; `cli`: `chargeguard stripe-sim`.
//!
//! Invariants: nothing here panics on input; every collection has a bound from
//! [`SimulatorLimits`]; the state lock is never held across an `.await`.

mod api;
pub mod cli;
mod client;
mod clock;
mod control;
mod faults;
mod idempotency;
mod model;
mod search;
mod server;
mod state;
mod webhooks;
pub(crate) mod wire;

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

pub use client::SimControl;
pub use control::{
    AuthenticationOutcome, CloseDispute, FailRefund, ForcePaymentIntent, Ledger, LedgerDispute,
    LedgerPaymentIntent, LedgerRefund, OpenDispute, RefundMode, RequestLogEntry,
    SeedPaymentIntent,
};
pub use faults::{Endpoint, FaultKind, FaultSpec, FaultTarget, FaultTrigger};
pub use model::{Confirmation, DisputeStatus};
pub use webhooks::{DeliveryRecord, EventRecord, FlushReport, WebhookMode};

/// The Stripe API version events are rendered for: the one async-stripe was generated for, so
/// `stripe_webhook::Webhook::construct_event` parses them without a version warning.
pub const WEBHOOK_API_VERSION: &str = "2026-09-30.endive";

/// The default test secret key accepted by the simulator.
pub const DEFAULT_API_KEY: &str = "sk_test_chargeguard";

/// Stripe's largest page size for list and search.
pub const PAGE_SIZE_MAX: usize = 100;

/// A webhook endpoint and its signing secret.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookTarget {
    pub url: String,
    pub secret: String,
}

impl fmt::Debug for WebhookTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookTarget")
            .field("url", &self.url)
            .field("secret", &"<redacted>")
            .finish()
    }
}

/// A bound on everything the simulator keeps or does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimulatorLimits {
    /// Payment intents, refunds and disputes kept in memory; creates beyond it are refused.
    pub objects_max: usize,
    /// Idempotency keys kept (expired ones are pruned first); new keys beyond it are refused.
    pub idempotency_keys_max: usize,
    /// Entries of the request log ring (oldest dropped).
    pub request_log_entries_max: usize,
    /// Webhook deliveries waiting (oldest dropped and counted).
    pub webhook_queue_max: usize,
    /// Entries of the event and delivery log rings.
    pub event_log_entries_max: usize,
    /// Delivery attempts per webhook before giving up.
    pub webhook_attempts_max: u32,
    /// Timeout of one webhook delivery.
    pub webhook_timeout_ms: u64,
    /// Request body size; larger bodies get 413.
    pub body_bytes_max: usize,
    /// Number of form parameters in one request.
    pub params_max: usize,
    /// Concurrent connections served; further accepts wait.
    pub connections_max: usize,
    /// Fault rules installed at once.
    pub faults_max: usize,
    /// Longest latency a fault may inject.
    pub fault_latency_ms_max: u64,
}

impl Default for SimulatorLimits {
    fn default() -> Self {
        Self {
            objects_max: 100_000,
            idempotency_keys_max: 100_000,
            request_log_entries_max: 10_000,
            webhook_queue_max: 10_000,
            event_log_entries_max: 10_000,
            webhook_attempts_max: 5,
            webhook_timeout_ms: 10_000,
            body_bytes_max: 64 * 1024,
            params_max: 256,
            connections_max: 512,
            faults_max: 64,
            fault_latency_ms_max: 60_000,
        }
    }
}

/// Configuration of one simulator instance.
#[derive(Clone)]
pub struct SimulatorConfig {
    /// Secret keys accepted as `Authorization: Bearer <key>`. Idempotency keys are scoped per
    /// secret key; objects are shared (one account).
    pub api_keys: Vec<String>,
    /// Where events are delivered; `None` records events without delivering them.
    pub webhook: Option<WebhookTarget>,
    /// Delay before a created or changed payment intent shows in search results.
    pub search_lag_seconds: u64,
    /// Delay (sim clock) before a `processing` payment intent settles.
    pub settlement_delay_seconds: u64,
    /// Age (sim clock) at which idempotency keys are pruned.
    pub idempotency_key_ttl_seconds: u64,
    /// Seed of every random choice (ids, probabilistic faults, shuffled webhooks).
    pub seed: u64,
    pub limits: SimulatorLimits,
}

impl fmt::Debug for SimulatorConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimulatorConfig")
            .field(
                "api_keys",
                &format_args!("<{} redacted>", self.api_keys.len()),
            )
            .field("webhook", &self.webhook)
            .field("search_lag_seconds", &self.search_lag_seconds)
            .field("settlement_delay_seconds", &self.settlement_delay_seconds)
            .field(
                "idempotency_key_ttl_seconds",
                &self.idempotency_key_ttl_seconds,
            )
            .field("seed", &self.seed)
            .field("limits", &self.limits)
            .finish()
    }
}

impl Default for SimulatorConfig {
    fn default() -> Self {
        Self {
            api_keys: vec![DEFAULT_API_KEY.to_owned()],
            webhook: None,
            search_lag_seconds: 5,
            settlement_delay_seconds: 60,
            idempotency_key_ttl_seconds: 24 * 60 * 60,
            seed: 0,
            limits: SimulatorLimits::default(),
        }
    }
}

/// A running simulator. Dropping it without [`SimulatorHandle::shutdown`] leaves the tasks
/// running until the runtime ends.
pub struct SimulatorHandle {
    local_addr: SocketAddr,
    shutdown: tokio_util::sync::CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    webhooks: Arc<webhooks::Webhooks>,
}

impl fmt::Debug for SimulatorHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimulatorHandle")
            .field("local_addr", &self.local_addr)
            .finish()
    }
}

impl SimulatorHandle {
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The base URL for async-stripe's `ClientBuilder::url` (with the trailing slash it needs).
    pub fn base_url(&self) -> String {
        format!("http://{}/", self.local_addr)
    }

    pub fn control(&self) -> SimControl {
        SimControl::new(self.base_url())
    }

    /// Delivers this simulator's webhooks to `target` from now on (`None`: to nobody), set in
    /// process: the secret never crosses a socket (the first run points the built-in simulator
    /// at the server's own endpoint this way).
    pub fn set_webhook_target(&self, target: Option<WebhookTarget>) {
        self.webhooks.set_target(target);
    }

    /// Stops accepting, closes open connections and stops webhook delivery.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        for task in self.tasks {
            if let Err(error) = task.await {
                tracing::warn!(%error, "simulator task ended abnormally");
            }
        }
    }
}

/// Starts a simulator on `listener` (tests bind `127.0.0.1:0`).
pub async fn spawn(
    config: SimulatorConfig,
    listener: tokio::net::TcpListener,
) -> anyhow::Result<SimulatorHandle> {
    anyhow::ensure!(
        !config.api_keys.is_empty(),
        "the simulator needs at least one api key"
    );
    for key in &config.api_keys {
        anyhow::ensure!(
            key.starts_with("sk_"),
            "simulator api keys must start with sk_"
        );
    }
    let local_addr = listener.local_addr()?;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let app = Arc::new(server::App::new(config, local_addr, shutdown.clone())?);
    let tasks = vec![
        tokio::spawn(server::accept_loop(app.clone(), listener)),
        tokio::spawn(webhooks::delivery_loop(
            app.webhooks.clone(),
            shutdown.clone(),
        )),
        tokio::spawn(server::tick_loop(app.clone())),
    ];
    tracing::info!(%local_addr, "stripe simulator listening");
    Ok(SimulatorHandle {
        local_addr,
        shutdown,
        tasks,
        webhooks: app.webhooks.clone(),
    })
}
