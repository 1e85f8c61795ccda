//! Provider webhooks: the endpoint verifies and stores (`route`, `signature`, `event`), the
//! worker applies at its own pace (`worker`, `decision`), `gauges` show whether it keeps up,
//! retention prunes (`retention`).
//!
//! ```text
//! Stripe ──POST──▶ route: verify ─▶ insert inbox row (by event id) ─▶ 200
//!                  worker: claim batch ─▶ decide ─▶ settle (dedup + guarded update + mark), one tx
//!                  gauges: inbox depth and oldest age, every few seconds, drained or not
//!                  retention: delete processed rows older than retention, in batches
//! ```

pub mod decision;
pub mod event;
pub mod gauges;
pub mod retention;
pub mod route;
pub mod signature;
pub mod worker;

use std::sync::Arc;

use axum::Router;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::orchestrator::OutcomeCache;
use crate::secret::Secret;
use crate::store::InboxStore;

pub use gauges::InboxGauges;
pub use retention::{Retention, RetentionSettings};
pub use signature::Verifier;
pub use worker::{BatchReport, DrainOutcome, InboxWorker, WorkerSettings};

#[derive(Debug, Clone)]
pub struct WebhookSettings {
    pub secrets: Vec<Secret>,
    pub signature_tolerance: chrono::Duration,
    pub body_bytes_max: usize,
    pub worker: WorkerSettings,
    pub retention: RetentionSettings,
}

/// The endpoint and the two background jobs, built from one store and one clock.
pub struct Webhooks {
    store: Arc<dyn InboxStore>,
    clock: Arc<dyn Clock>,
    settings: WebhookSettings,
    outcomes: Arc<OutcomeCache>,
}

impl Webhooks {
    pub fn new(
        store: Arc<dyn InboxStore>,
        clock: Arc<dyn Clock>,
        settings: WebhookSettings,
        outcomes: Arc<OutcomeCache>,
    ) -> Self {
        Self {
            store,
            clock,
            settings,
            outcomes,
        }
    }

    pub fn worker(&self) -> InboxWorker {
        InboxWorker::new(self.store.clone(), self.clock.clone(), self.settings.worker, self.outcomes.clone())
    }

    pub fn gauges(&self) -> InboxGauges {
        InboxGauges::new(self.store.clone(), self.clock.clone())
    }

    pub fn retention(&self) -> Retention {
        Retention::new(
            self.store.clone(),
            self.clock.clone(),
            self.settings.retention,
        )
    }

    /// `POST /webhooks/stripe`, or no route at all when no signing secret is configured (an
    /// endpoint that cannot verify must not accept).
    pub fn router(&self, signature_clock: Arc<dyn Clock>) -> Router {
        let Some(verifier) = Verifier::new(
            self.settings.secrets.clone(),
            self.settings.signature_tolerance,
        ) else {
            tracing::warn!(
                "webhooks.secrets is empty: POST {} is disabled",
                route::PATH
            );
            return Router::new();
        };
        let state = route::WebhookState {
            store: self.store.clone(),
            verifier: Arc::new(verifier),
            signature_clock,
            clock: self.clock.clone(),
        };
        route::router(state, self.settings.body_bytes_max)
    }

    /// Starts the worker, the inbox gauges and the retention job; all stop when `shutdown` is
    /// cancelled.
    pub fn spawn_jobs(&self, shutdown: &CancellationToken) -> Vec<JoinHandle<()>> {
        vec![
            tokio::spawn(self.worker().run(shutdown.clone())),
            tokio::spawn(self.gauges().run(shutdown.clone())),
            tokio::spawn(self.retention().run(shutdown.clone())),
        ]
    }
}
