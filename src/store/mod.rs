//! Storage of `payment_attempts`, behind one trait so that PostgreSQL (production) and an
//! embedded store share the same behaviour tests. SQL lives in this module and nowhere else.
//! Every method is one short statement or transaction: nothing here is ever held open across
//! a provider call.

pub mod group_commit;
pub mod inbox;
pub mod open;
pub mod postgres;
mod postgres_group;
mod postgres_inbox;
mod postgres_refund;
mod row;
pub mod sqlite;
mod sqlite_inbox;
mod sqlite_refund;
mod sqlite_report;
pub mod postgres_bench;
mod postgres_report;
pub mod refund;
pub mod report;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::domain::{
    Admission, Attempt, AttemptId, AttemptKind, AttemptNumber, AttemptStatus, ChargeParams, ConsumerName, Failure, Fingerprint,
    IdempotencyKey, LeaseOwner, ListProgress, NextAction, OperationKey, admit,
};

pub use inbox::InboxStore;
pub use open::{DatabaseLocation, OpenedStore, open};
pub use postgres::PostgresStore;
pub use refund::{NewRefund, REFUND_TOTALS_PARENTS_MAX, RefundInsertOutcome, RefundRefusal, RefundTotals};
pub use report::{ReportStore, RunId, StagedPayment};
pub use sqlite::SqliteStore;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be reached or the statement failed for a reason that may pass.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// A row broke an invariant of the schema (a bug or a hand edit): never retried blindly.
    #[error("corrupt row in payment_attempts: {0}")]
    Corrupt(String),
}

/// The caller's side of time for one statement. The statement reads the database's clock
/// itself: leases and due times are counted on the database's clock alone (one clock for every
/// replica, so a skewed replica can neither keep a lease nor steal a live one), and a key
/// window starts at the earlier of the two readings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallerTime {
    /// The calling process's clock.
    pub now: DateTime<Utc>,
    /// Added to the database's reading: zero in the service. Tests that move the whole
    /// system's time at once (the process's, the simulator's and so the database's:
    /// `clock::OffsetClock`) set it; skew between clocks is tested with real clocks instead.
    pub shift: chrono::Duration,
}

impl CallerTime {
    pub fn of(clock: &dyn crate::clock::Clock) -> Self {
        Self { now: clock.now(), shift: clock.shift() }
    }

    pub(crate) fn shift_micros(self) -> i64 {
        self.shift.num_microseconds().unwrap_or(i64::MAX)
    }
}

pub(crate) fn micros_of(duration: chrono::Duration) -> i64 {
    duration.num_microseconds().unwrap_or(i64::MAX)
}

/// A pending attempt about to be committed. Its first lease belongs to the caller that inserts
/// it, so that the insert and the claim to call the provider are one statement.
#[derive(Debug, Clone)]
pub struct NewAttempt {
    pub id: AttemptId,
    pub consumer: ConsumerName,
    pub operation_key: OperationKey,
    pub params: ChargeParams,
    pub fingerprint: Fingerprint,
    pub provider: &'static str,
    pub idempotency_key: IdempotencyKey,
    pub generation: u32,
    /// Sent with every create under the key; stored so that a re-send sends the same.
    pub return_url: Option<String>,
    pub lease_owner: LeaseOwner,
    /// Counted from when the row is written, on the database's clock.
    pub lease_duration: chrono::Duration,
    /// How long after the write recovery first looks at the row if nobody finishes it.
    pub recovery_grace: chrono::Duration,
    pub time: CallerTime,
}

/// A row whose lease the caller now holds, with the database's clock as the statement that
/// took the lease read it: the second reading every time-dependent decision uses.
#[derive(Debug, Clone)]
pub struct Leased {
    pub attempt: Attempt,
    pub database_now: DateTime<Utc>,
}

#[derive(Debug)]
pub enum InsertOutcome {
    /// The row as written; its `updated_at` is the database's reading at the write.
    Inserted(Attempt),
    /// Another call already recorded this attempt of the operation; its row, untouched.
    Existing(Attempt),
    /// Refused, nothing written: the operation's latest attempt is not decided yet.
    PreviousInProgress { attempt_id: AttemptId },
    /// Refused, nothing written: an earlier attempt of the operation succeeded (or the provider
    /// reported money moved for it).
    AlreadySucceeded { attempt_id: AttemptId },
    /// Refused, nothing written: the attempt does not follow the operation's latest one.
    OutOfOrder { latest_attempt: Option<u32> },
    /// Nothing written: the latest attempt's intent is still payable and the new attempt
    /// changes what a confirm cannot; cancel it, record that, and insert again.
    CancelPrevious { attempt_id: AttemptId, provider_payment_id: String },
}

impl InsertOutcome {
    /// The outcome of an attempt the rule did not let in; `Insert` is the caller's to handle.
    fn refused(admission: Admission) -> Option<Self> {
        Some(match admission {
            Admission::Insert { .. } => return None,
            Admission::PreviousInProgress { attempt_id } => Self::PreviousInProgress { attempt_id },
            Admission::AlreadySucceeded { attempt_id } => Self::AlreadySucceeded { attempt_id },
            Admission::OutOfOrder { latest_attempt } => Self::OutOfOrder { latest_attempt },
            Admission::CancelPrevious { attempt_id, provider_payment_id } => {
                Self::CancelPrevious { attempt_id, provider_payment_id }
            }
        })
    }
}

/// Which attempt of the operation `new` is.
fn requested_attempt(new: &NewAttempt) -> Result<AttemptNumber, StoreError> {
    AttemptNumber::parse(Some(new.generation + 1))
        .map_err(|error| StoreError::Corrupt(format!("generation {} of a new attempt: {error}", new.generation)))
}

/// What an inserting statement that wrote nothing returned: the attempt itself (`Existing`), or
/// the earlier attempt it judged the new one against, classified by the same rule
/// (`domain::admit`). A rule that lets in what the statement refused is a drift between the
/// SQL and the domain: reported, never guessed around.
fn classify_returned(new: &NewAttempt, returned: Attempt) -> Result<InsertOutcome, StoreError> {
    if returned.generation == new.generation {
        return Ok(InsertOutcome::Existing(returned));
    }
    let id = returned.id;
    InsertOutcome::refused(admit(Some(&returned), requested_attempt(new)?, &new.params)).ok_or_else(|| {
        StoreError::Corrupt(format!(
            "the inserting statement refused attempt {} of {:?} after attempt {id}, which the rule admits",
            new.generation + 1,
            new.operation_key.as_str()
        ))
    })
}

/// How a lease is asked for.
#[derive(Debug, Clone, Copy)]
pub struct LeaseRequest {
    pub owner: LeaseOwner,
    pub duration: chrono::Duration,
    /// The key window's safe length: a lease taken while the key is younger than this (on the
    /// database's clock) may be used for a create, so its end extends `create_sent_until`.
    pub key_window_safe: chrono::Duration,
    pub time: CallerTime,
}

/// After an insert that did nothing: the row that won. The conflict was on the operation's
/// attempt (or, impossibly, on the derived key, which is a function of the operation and the
/// generation).
async fn conflict_winner(
    store: &(impl AttemptStore + ?Sized),
    new: &NewAttempt,
) -> Result<InsertOutcome, StoreError> {
    match store.find_by_operation(&new.consumer, &new.operation_key).await? {
        Some(existing) if existing.generation == new.generation => Ok(InsertOutcome::Existing(existing)),
        _ => Err(StoreError::Corrupt(format!(
            "insert of attempt {} of operation {:?} conflicted but no row holds it",
            new.generation + 1,
            new.operation_key.as_str()
        ))),
    }
}

/// The outcome of one round with the provider, written by the lease holder.
#[derive(Debug, Clone)]
pub struct RoundResult {
    pub status: AttemptStatus,
    pub provider_payment_id: Option<String>,
    pub provider_status: Option<String>,
    pub failure: Option<Failure>,
    pub next_action: Option<NextAction>,
    /// Overwrites the review reason only when set.
    /// Added to the reasons already on the row (never replacing one), when set.
    pub review_reason: Option<String>,
    pub calls_made: u32,
    /// For a row that stays unfinished: how long after this write (database time) recovery
    /// looks again.
    pub next_check_in: chrono::Duration,
    pub last_error: Option<String>,
    /// The provider replayed a saved failure for the key: sticky once set.
    pub create_replays_failure: bool,
    /// Where a lookup's listing stands after this round; `None` leaves it as it is.
    pub lookup_progress: Option<ListProgress>,
}

impl RoundResult {
    /// A round that changes nothing but the lease, the counters and when the row is looked at
    /// again: `calls_made` calls whose answers gave nothing to record.
    pub fn unchanged(
        status: AttemptStatus,
        calls_made: u32,
        next_check_in: chrono::Duration,
        last_error: Option<String>,
    ) -> Self {
        Self {
            status,
            provider_payment_id: None,
            provider_status: None,
            failure: None,
            next_action: None,
            review_reason: None,
            calls_made,
            next_check_in,
            last_error,
            create_replays_failure: false,
            lookup_progress: None,
        }
    }
}

/// Which attempts a list returns.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub status: Option<AttemptStatus>,
    /// Every attempt of this operation.
    pub operation_key: Option<OperationKey>,
    pub kind: Option<AttemptKind>,
    pub created_from: Option<DateTime<Utc>>,
    pub created_to: Option<DateTime<Utc>>,
}

/// Keyset position in a list ordered newest first: the last row of the previous page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListCursor {
    pub created_at: DateTime<Utc>,
    pub id: AttemptId,
}

#[async_trait]
pub trait AttemptStore: Send + Sync + 'static {
    /// Inserts the pending row of attempt `new.generation + 1` unless it exists (`ON CONFLICT DO
    /// NOTHING`) and the rule of `domain::admit` lets it in, the check and the insert in one
    /// statement (PostgreSQL) or one short transaction (SQLite).
    async fn insert_pending(&self, new: &NewAttempt) -> Result<InsertOutcome, StoreError>;

    /// Inserts a pending refund unless its operation exists, in one statement that finds the
    /// caller's charge, refuses one not succeeded or without enough left, and holds the
    /// charge's row lock while it sums the charge's refunds and inserts.
    async fn insert_pending_refund(&self, new: &NewRefund) -> Result<RefundInsertOutcome, StoreError>;

    /// The refund totals of each charge in `charge_ids` (at most `REFUND_TOTALS_PARENTS_MAX`);
    /// charges without refunds are absent.
    async fn refund_totals(
        &self,
        charge_ids: &[AttemptId],
    ) -> Result<std::collections::HashMap<AttemptId, RefundTotals>, StoreError>;

    async fn find_by_operation(
        &self,
        consumer: &ConsumerName,
        operation_key: &OperationKey,
    ) -> Result<Option<Attempt>, StoreError>;

    /// How many attempts (of any kind) the operation has.
    async fn count_operation_attempts(
        &self,
        consumer: &ConsumerName,
        operation_key: &OperationKey,
    ) -> Result<u32, StoreError>;

    /// Records that the provider canceled a failed attempt's intent (so that the operation's
    /// next attempt creates a new one); `false` when the row is not that failed attempt.
    async fn record_payment_canceled(
        &self,
        id: AttemptId,
        provider_payment_id: &str,
        time: CallerTime,
    ) -> Result<bool, StoreError>;

    /// `consumer` scopes the read to one caller; `None` is for internal readers (recovery).
    async fn find_by_id(
        &self,
        consumer: Option<&ConsumerName>,
        id: AttemptId,
    ) -> Result<Option<Attempt>, StoreError>;

    /// Takes the lease on an unfinished row whose lease is free or expired on the database's
    /// clock.
    async fn acquire_lease(
        &self,
        id: AttemptId,
        lease: LeaseRequest,
    ) -> Result<Option<Leased>, StoreError>;

    /// Extends a lease `owner` still holds by `duration` from now (database time) and saves a
    /// lookup's progress with it; `false` when the lease was lost.
    async fn renew_lease(
        &self,
        id: AttemptId,
        owner: LeaseOwner,
        duration: chrono::Duration,
        lookup_progress: &ListProgress,
        time: CallerTime,
    ) -> Result<bool, StoreError>;

    /// Writes a round's result and releases the lease, only while `owner` holds it. The status
    /// moves only forward (the guard is the database's, not the caller's belief). Returns the
    /// row as written, or `None` when the lease was lost.
    async fn finish_round(
        &self,
        id: AttemptId,
        owner: LeaseOwner,
        result: &RoundResult,
        time: CallerTime,
    ) -> Result<Option<Attempt>, StoreError>;

    /// An operator's re-check of a row flagged for review: the reason moves to the row's
    /// history, the flag is cleared and the row is due at once. Only unfinished, flagged rows;
    /// `None` otherwise.
    async fn clear_review(
        &self,
        id: AttemptId,
        time: CallerTime,
    ) -> Result<Option<Attempt>, StoreError>;

    async fn list(
        &self,
        consumer: &ConsumerName,
        filter: &ListFilter,
        after: Option<ListCursor>,
        limit: u32,
    ) -> Result<Vec<Attempt>, StoreError>;

    /// Claims up to `batch_max` unfinished rows due for a check whose leases are free (both on
    /// the database's clock), leasing each to `lease.owner`. Concurrent claimers never get the
    /// same row.
    async fn claim_due(
        &self,
        lease: LeaseRequest,
        batch_max: u32,
    ) -> Result<Vec<Leased>, StoreError>;

    /// When the oldest unfinished (pending or requires_action) attempt was created, if any: the
    /// sweep's "oldest unfinished age" gauge.
    async fn oldest_unfinished_created_at(&self) -> Result<Option<DateTime<Utc>>, StoreError>;

    /// Cheap round trip for health checks.
    async fn ping(&self) -> Result<(), StoreError>;

    /// Closes every connection, waiting for those in use to come back; later calls fail. On
    /// SQLite the last close checkpoints the write-ahead log into the database file.
    async fn close(&self);
}
