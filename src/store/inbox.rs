//! Storage of provider events (`webhook_inbox`, `webhook_dedup`): the durable inbox between the
//! webhook endpoint, which only verifies and stores, and the worker, which applies events to
//! attempts at its own pace. Implemented for PostgreSQL in `postgres_inbox.rs` and for the embedded
//! SQLite store in `sqlite_inbox.rs`, with the same guarantees.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{CallerTime, StoreError};
use crate::domain::{Attempt, AttemptId, AttemptStatus, Failure, NextAction};

/// A verified event about to be stored.
#[derive(Debug, Clone)]
pub struct NewInboxEvent {
    pub event_id: String,
    pub event_type: String,
    pub object_id: Option<String>,
    pub event_created_at: DateTime<Utc>,
    /// The raw body, exactly as signed.
    pub payload: String,
    /// The receiving process's time; the stores use its `shift` only: `received_at` is the
    /// database's reading, as every instant another process compares against is (retention
    /// measures it from the pruning process, claims take the oldest first).
    pub time: CallerTime,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InboxInsert {
    Inserted,
    /// The same event id was received before: a redelivery, stored once.
    AlreadyReceived,
}

/// The identity of one worker pass holding claims on inbox rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimOwner(Uuid);

impl ClaimOwner {
    pub fn new() -> Self {
        Self(Uuid::new_v4())
    }
    pub fn as_uuid(self) -> Uuid {
        self.0
    }
}

impl Default for ClaimOwner {
    fn default() -> Self {
        Self::new()
    }
}

/// A claim on a batch: the rows stay this owner's for `duration` from when the database takes
/// the claim; after that another worker may take them, so a worker that died mid-batch loses
/// nothing. Both ends are read off the database's clock, as an attempt's lease is: a worker whose
/// own clock runs ahead would otherwise hold its rows for as long again after it died, and one
/// whose clock runs behind would take rows whose claim another worker still holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    pub owner: ClaimOwner,
    pub duration: chrono::Duration,
    /// The claiming process's time; the stores use its `shift` only (zero in the service).
    pub time: CallerTime,
}

/// An unprocessed event as claimed by a worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxEvent {
    pub event_id: String,
    pub event_type: String,
    pub object_id: Option<String>,
    pub event_created_at: DateTime<Utc>,
    pub payload: String,
    pub received_at: DateTime<Utc>,
    /// How many times the row was claimed, this claim included.
    pub claim_count: u32,
}

/// What processing an event came to; stored on the inbox row and counted by event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InboxOutcome {
    /// The attempt moved forward.
    Applied,
    /// Another, distinct event for the same (object, event type) was processed first.
    Duplicate,
    /// The event would not move the attempt forward (older news, or no change).
    Stale,
    /// No attempt is known for the event's object (or the object is not one chargeguard tracks,
    /// such as refunds): kept and counted, never dropped.
    UnknownObject,
    /// The event names an attempt that already adopted another provider object: the attempt is
    /// flagged for review, its state is not changed.
    Conflict,
    /// Verified at the endpoint, but its object could not be read.
    Unreadable,
    /// The provider reports money moved for an attempt chargeguard answered `failed` (a
    /// declined intent confirmed again later): the attempt is flagged for review
    /// (`succeeded_after_failure`), its state is not changed.
    Flagged,
    /// A refund the provider reported `failed` after chargeguard recorded it `succeeded` (the
    /// money came back to the merchant): the one move out of `succeeded`, refunds only; the
    /// refund attempt is now `failed` with `failed_after_success_at` set.
    FailedAfterSuccess,
    /// A dispute on a charge: the charge attempt is flagged for review with the dispute named;
    /// its state is not changed.
    Disputed,
}

impl InboxOutcome {
    pub const ALL: [InboxOutcome; 9] = [
        InboxOutcome::Applied,
        InboxOutcome::Duplicate,
        InboxOutcome::Stale,
        InboxOutcome::UnknownObject,
        InboxOutcome::Conflict,
        InboxOutcome::Unreadable,
        InboxOutcome::Flagged,
        InboxOutcome::FailedAfterSuccess,
        InboxOutcome::Disputed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            InboxOutcome::Applied => "applied",
            InboxOutcome::Duplicate => "duplicate",
            InboxOutcome::Stale => "stale",
            InboxOutcome::UnknownObject => "unknown_object",
            InboxOutcome::Conflict => "conflict",
            InboxOutcome::Unreadable => "unreadable",
            InboxOutcome::Flagged => "flagged",
            InboxOutcome::FailedAfterSuccess => "failed_after_success",
            InboxOutcome::Disputed => "disputed",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|outcome| outcome.as_str() == value)
    }
}

/// A forward move of an attempt, computed from the event's object by `domain::resolve_snapshot`.
#[derive(Debug, Clone, PartialEq)]
pub struct PaymentUpdate {
    pub attempt_id: AttemptId,
    pub provider_payment_id: String,
    pub provider_status: String,
    pub status: AttemptStatus,
    pub failure: Option<Failure>,
    pub next_action: Option<NextAction>,
    /// Added to the attempt's review reason when set (an earlier reason is kept).
    pub review_reason: Option<String>,
    /// Set when the event shows money moved at the provider: if the database finds the attempt
    /// `failed` (so the move is refused), the attempt is flagged with this reason instead of the
    /// event being `Stale`. Judged by the database, not by the worker's read, so an event
    /// decided while the attempt was still pending is flagged all the same.
    pub review_reason_if_failed: Option<String>,
}

/// A move of a refund attempt computed from a provider refund: forward like a payment
/// (pending → succeeded | failed), and, refunds only, `succeeded` → `failed` when the provider
/// reports a refund that had succeeded as failed.
#[derive(Debug, Clone, PartialEq)]
pub struct RefundUpdate {
    pub attempt_id: AttemptId,
    /// The provider's refund id (`re_...`), bound to the attempt if it had none.
    pub provider_refund_id: String,
    pub provider_status: String,
    pub status: AttemptStatus,
    /// For `failed`: the provider's `failure_reason` as the code.
    pub failure: Option<Failure>,
    /// Added to the attempt's review reason when the refund moves (an amount that differs).
    pub review_reason: Option<String>,
}

/// What a refund event came to, from what each of its refunds did: the strongest that happened
/// (failed after success, then applied, else stale). Both stores settle refund events through
/// it, so the rule lives here once.
#[derive(Debug)]
pub struct RefundEventOutcome {
    outcome: InboxOutcome,
    detail: Option<String>,
}

impl Default for RefundEventOutcome {
    fn default() -> Self {
        Self { outcome: InboxOutcome::Stale, detail: None }
    }
}

impl RefundEventOutcome {
    /// One refund attempt moved forward.
    pub fn moved(&mut self) {
        if self.outcome == InboxOutcome::Stale {
            self.outcome = InboxOutcome::Applied;
        }
    }

    /// One refund that had succeeded is now failed at the provider.
    pub fn failed_after_success(&mut self, update: &RefundUpdate) {
        self.outcome = InboxOutcome::FailedAfterSuccess;
        self.detail = Some(format!(
            "refund {} failed after it succeeded: {}",
            update.provider_refund_id,
            update.failure.as_ref().map(|failure| failure.code.as_str()).unwrap_or("failed")
        ));
    }

    /// The event's outcome, the attempt it names (its first refund's) and the detail.
    pub fn finish(self, updates: &[RefundUpdate]) -> (InboxOutcome, Option<AttemptId>, Option<String>) {
        (self.outcome, updates.first().map(|update| update.attempt_id), self.detail)
    }
}

/// What the worker decided for one event; the store applies it atomically with the
/// de-duplication and the processed mark.
#[derive(Debug, Clone, PartialEq)]
pub enum Settlement {
    /// Move the attempt forward if the database agrees it is a forward move: `Applied`; else
    /// flag a failed attempt the event shows paid: `Flagged`; else `Stale`.
    Apply(PaymentUpdate),
    /// Flag the attempt for review without changing its state: `Conflict`.
    Flag {
        attempt_id: AttemptId,
        review_reason: String,
    },
    /// Move refund attempts (one per refund the event carries, in order): `Applied` when one
    /// moved forward, `FailedAfterSuccess` when one moved out of `succeeded`, else `Stale`.
    Refunds(Vec<RefundUpdate>),
    /// Flag a charge attempt with a dispute's reason, its state unchanged: `Disputed`.
    Dispute {
        attempt_id: AttemptId,
        review_reason: String,
    },
    /// Only record the outcome (`UnknownObject`, `Unreadable`).
    Record {
        outcome: InboxOutcome,
        detail: Option<String>,
    },
}

/// One event's processing, as the claim holder asks the store to commit it.
#[derive(Debug, Clone, PartialEq)]
pub struct SettleEvent {
    pub event_id: String,
    pub owner: ClaimOwner,
    /// `(object id, event type)`: a second distinct event with the same key is a duplicate.
    /// `None` when the event has no readable object.
    pub dedup_key: Option<(String, String)>,
    pub settlement: Settlement,
    /// The settling worker's time; the stores use its `shift` only. Every instant the settle
    /// writes (`processed_at`, the de-duplication key's `recorded_at`, an attempt's `updated_at`
    /// and `action_started_at`) is the database's reading at the settle: the sweep measures a
    /// customer's time to authenticate from `action_started_at` on the database's clock, so a
    /// worker whose clock ran behind would have it cancel the intent early.
    pub time: CallerTime,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InboxStats {
    pub unprocessed: u64,
    pub oldest_unprocessed_received_at: Option<DateTime<Utc>>,
    /// The database's clock at the reading (plus the caller's shift): what the oldest row's
    /// age is measured against, as its `received_at` was stamped by it.
    pub database_now: DateTime<Utc>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PruneCounts {
    pub inbox_rows: u64,
    pub dedup_rows: u64,
}

#[async_trait]
pub trait InboxStore: Send + Sync + 'static {
    /// Stores a verified event keyed by its id (`ON CONFLICT DO NOTHING`) and commits.
    async fn insert_event(&self, event: &NewInboxEvent) -> Result<InboxInsert, StoreError>;

    /// Claims up to `batch_max` unprocessed rows, oldest first, whose claims are free or expired
    /// by the database's clock. Concurrent workers never get the same row.
    async fn claim_events(&self, claim: Claim, batch_max: u32) -> Result<Vec<InboxEvent>, StoreError>;

    /// The attempt that owns the provider object `provider_payment_id`, else the attempt whose
    /// id the object's metadata names.
    async fn find_attempt_for_payment(
        &self,
        provider_payment_id: &str,
        attempt_id: Option<AttemptId>,
    ) -> Result<Option<Attempt>, StoreError>;

    /// The refund attempt that owns the provider refund `provider_refund_id`, else the refund
    /// attempt whose id the refund's metadata names. Charge attempts are never returned.
    async fn find_attempt_for_refund(
        &self,
        provider_refund_id: &str,
        attempt_id: Option<AttemptId>,
    ) -> Result<Option<Attempt>, StoreError>;

    /// In one transaction: checks that `settle.owner` still holds the row's claim, records the
    /// de-duplication key (or finds the event a duplicate), applies the settlement (the status
    /// guard is the database's: `WHERE status = ANY(allowed sources)`, no attempt lease needed)
    /// and marks the row processed. `None` when the claim was lost to another worker: nothing
    /// was written.
    async fn settle_event(&self, settle: &SettleEvent) -> Result<Option<InboxOutcome>, StoreError>;

    async fn inbox_stats(&self, time: CallerTime) -> Result<InboxStats, StoreError>;

    /// Deletes at most `batch_max` processed inbox rows and at most `batch_max` de-duplication
    /// keys received more than `retention` ago by the database's clock (plus `time`'s shift),
    /// the clock that stamped them: a pruning process whose own clock ran ahead would otherwise
    /// delete keys early, and a resent event could then be applied twice. Unprocessed rows are
    /// never deleted.
    async fn prune_processed(
        &self,
        retention: chrono::Duration,
        time: CallerTime,
        batch_max: u32,
    ) -> Result<PruneCounts, StoreError>;
}
