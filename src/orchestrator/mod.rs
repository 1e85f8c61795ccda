//! The flows: charge, reconcile, and (in `sweep`) recovery. This module owns control flow and
//! state changes; it calls the store and the provider and never holds a database transaction
//! across a provider call.

mod attempts;
mod charge;
mod outcome_cache;
mod queries;
mod refund;
mod review;
mod round;
mod sweep;
mod waiters;

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;
use crate::domain::{AttemptId, KeyWindow, OperationKey};
use crate::provider::PaymentProvider;
use crate::store::{AttemptStore, StoreError};

pub use charge::{ChargeOutcome, ChargeReply};
pub use outcome_cache::{OutcomeCache, OutcomeCacheSettings};
pub use queries::{AttemptPage, AttemptSelector};
pub use round::RoundEnd;
pub use sweep::{SweepOutcome, SweepSettings};
pub use waiters::RoundNotifier;

/// Bounds of the charge and reconcile flows. Checked together at start (see `config`).
#[derive(Debug, Clone)]
pub struct OrchestratorSettings {
    pub amount_minor_max: i64,
    /// How long a caller owns an attempt while it talks to the provider. Longer than the
    /// provider call timeout, so a live call's lease never runs out under it.
    pub lease_duration: Duration,
    /// How long a duplicate call waits for a concurrent call's outcome before answering
    /// "in progress, retry".
    pub concurrent_wait_max: Duration,
    pub key_window: KeyWindow,
    /// How long a new row is left to its own call before recovery may look at it. Longer than
    /// the lease, so recovery never races a live call.
    pub recovery_grace: Duration,
    /// Delay before the first re-check of a row whose outcome is unknown; doubles per round.
    pub recheck_backoff_base: Duration,
    pub recheck_backoff_max: Duration,
    pub requires_action_age_max: Duration,
    /// Slack added around the range in which an attempt's objects can have been created, when
    /// listing the provider's objects.
    pub lookup_slack: Duration,
    /// List pages one lookup round reads; a longer lookup resumes from the row's cursor.
    pub lookup_pages_per_round: u32,
    /// Where the customer returns after a redirect-based action; stored on each new row.
    pub return_url: Option<String>,
    pub list_page_size_default: u32,
    pub list_page_size_max: u32,
    pub outcome_cache: OutcomeCacheSettings,
    pub sweep: SweepSettings,
}

#[derive(Debug, thiserror::Error)]
pub enum OrchestratorError {
    #[error(
        "operation \"{operation_key}\" was already requested with different {}; \
         the stored attempt {attempt_id} is unchanged",
        fields.join(", ")
    )]
    FingerprintMismatch { operation_key: OperationKey, attempt_id: AttemptId, fields: Vec<&'static str> },
    #[error(
        "attempt {attempt_id} is pending: the provider's answer is unknown ({reason}); \
         it is safe to retry this call"
    )]
    OutcomeUnknown { attempt_id: AttemptId, reason: String },
    #[error("attempt {attempt_id} is in progress in another call; retry shortly")]
    InProgress { attempt_id: AttemptId },
    #[error(
        "attempt {attempt_id} is pending: the provider replays a saved failure for its key, so \
         the key is not sent again; the payment is being looked up by its metadata and the \
         attempt completes by itself; it is safe to retry this call"
    )]
    ProviderReplaysFailure { attempt_id: AttemptId },
    #[error("attempt {attempt_id} needs review and was not sent again: {reason}")]
    NeedsReview { attempt_id: AttemptId, reason: String },
    #[error(
        "attempt {attempt_id} of operation \"{operation_key}\" is not decided yet; a next attempt \
         may start only once it failed; it is safe to retry this call"
    )]
    PreviousAttemptInProgress { operation_key: OperationKey, attempt_id: AttemptId },
    #[error(
        "operation \"{operation_key}\" already succeeded (attempt {attempt_id}); no further \
         attempt is made"
    )]
    OperationAlreadySucceeded { operation_key: OperationKey, attempt_id: AttemptId },
    #[error(
        "attempt {requested} of operation \"{operation_key}\" does not follow its latest attempt \
         ({}); attempts are numbered 1, 2, 3, … and each starts only after the one before failed",
        latest.map_or_else(|| "none".to_owned(), |latest| latest.to_string())
    )]
    AttemptOutOfOrder { operation_key: OperationKey, requested: u32, latest: Option<u32> },
    #[error(
        "attempt {attempt_id} of operation \"{operation_key}\" failed, but its payment could not be \
         canceled yet ({reason}); the next attempt changes what that payment would charge, so it \
         starts only once the cancel is done; it is safe to retry this call"
    )]
    PreviousCancelUnfinished { operation_key: OperationKey, attempt_id: AttemptId, reason: String },
    #[error("no such attempt")]
    NotFound,
    /// The refund's inserting statement refused it; nothing was written or sent.
    #[error("{}", refund::refusal_message(.0))]
    RefundRefused(crate::store::RefundRefusal),
    #[error("attempt {attempt_id} is not flagged for review, or is already decided")]
    NotFlagged { attempt_id: AttemptId },
    #[error("invalid page token")]
    InvalidPageToken,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Charge, reconcile and query: the service behind the gRPC API, the CLI and the sweep.
#[derive(Clone)]
pub struct Orchestrator {
    store: Arc<dyn AttemptStore>,
    provider: Arc<dyn PaymentProvider>,
    clock: Arc<dyn Clock>,
    settings: Arc<OrchestratorSettings>,
    notifier: RoundNotifier,
    outcome_cache: Arc<OutcomeCache>,
}

impl Orchestrator {
    pub fn new(
        store: Arc<dyn AttemptStore>,
        provider: Arc<dyn PaymentProvider>,
        clock: Arc<dyn Clock>,
        settings: OrchestratorSettings,
    ) -> Self {
        Self {
            store,
            provider,
            clock,
            outcome_cache: Arc::new(OutcomeCache::new(settings.outcome_cache)),
            settings: Arc::new(settings),
            notifier: RoundNotifier::new(),
        }
    }

    pub fn settings(&self) -> &OrchestratorSettings {
        &self.settings
    }

    pub fn store(&self) -> &Arc<dyn AttemptStore> {
        &self.store
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The decided outcomes this process answers duplicates from; writers of decided rows in
    /// this process (the webhook worker) make it forget what they change.
    pub fn outcome_cache(&self) -> &Arc<OutcomeCache> {
        &self.outcome_cache
    }
}

fn chrono_duration(duration: Duration) -> chrono::Duration {
    chrono::Duration::from_std(duration).unwrap_or(chrono::Duration::MAX)
}
