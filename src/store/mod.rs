//! Storage of `payment_attempts`, behind one trait so that PostgreSQL (production) and an
//! embedded store share the same behaviour tests. SQL lives in this module and nowhere else.
//! Every method is one short statement or transaction: nothing here is ever held open across
//! a provider call.

pub mod inbox;
pub mod open;
pub mod postgres;
mod postgres_inbox;
mod row;
pub mod sqlite;
pub mod postgres_bench;
mod postgres_report;
pub mod report;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::domain::{
    Attempt, AttemptId, AttemptStatus, ChargeParams, ConsumerName, Failure, Fingerprint,
    IdempotencyKey, Lease, LeaseOwner, NextAction, OperationKey,
};

pub use inbox::InboxStore;
pub use open::{DatabaseLocation, OpenedStore, open};
pub use postgres::PostgresStore;
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
    pub lease: Lease,
    /// When recovery should first look at the row if nobody finishes it.
    pub next_check_at: DateTime<Utc>,
    pub now: DateTime<Utc>,
}

#[derive(Debug)]
pub enum InsertOutcome {
    Inserted(Attempt),
    /// Another call already recorded this operation; its row, untouched.
    Existing(Attempt),
}

/// After an insert that did nothing: the row that won. The conflict was on the operation (or,
/// impossibly, on the derived key, which is a function of the operation).
async fn conflict_winner(
    store: &(impl AttemptStore + ?Sized),
    new: &NewAttempt,
) -> Result<InsertOutcome, StoreError> {
    match store.find_by_operation(&new.consumer, &new.operation_key).await? {
        Some(existing) => Ok(InsertOutcome::Existing(existing)),
        None => Err(StoreError::Corrupt(format!(
            "insert of operation {:?} conflicted but no row holds it",
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
    pub review_reason: Option<String>,
    pub calls_made: u32,
    /// For a row that stays unfinished: when recovery looks again.
    pub next_check_at: DateTime<Utc>,
    pub last_error: Option<String>,
}

/// Which attempts a list returns.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub status: Option<AttemptStatus>,
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
    /// Inserts the pending row unless the operation exists (`ON CONFLICT DO NOTHING`).
    async fn insert_pending(&self, new: &NewAttempt) -> Result<InsertOutcome, StoreError>;

    async fn find_by_operation(
        &self,
        consumer: &ConsumerName,
        operation_key: &OperationKey,
    ) -> Result<Option<Attempt>, StoreError>;

    /// `consumer` scopes the read to one caller; `None` is for internal readers (recovery).
    async fn find_by_id(
        &self,
        consumer: Option<&ConsumerName>,
        id: AttemptId,
    ) -> Result<Option<Attempt>, StoreError>;

    /// Takes the lease on an unfinished row whose lease is free or expired at `now`.
    async fn acquire_lease(
        &self,
        id: AttemptId,
        lease: Lease,
        now: DateTime<Utc>,
    ) -> Result<Option<Attempt>, StoreError>;

    /// Writes a round's result and releases the lease, only while `owner` holds it. The status
    /// moves only forward (the guard is the database's, not the caller's belief). Returns the
    /// row as written, or `None` when the lease was lost.
    async fn finish_round(
        &self,
        id: AttemptId,
        owner: LeaseOwner,
        result: &RoundResult,
        now: DateTime<Utc>,
    ) -> Result<Option<Attempt>, StoreError>;

    async fn list(
        &self,
        consumer: &ConsumerName,
        filter: &ListFilter,
        after: Option<ListCursor>,
        limit: u32,
    ) -> Result<Vec<Attempt>, StoreError>;

    /// Claims up to `batch_max` unfinished rows due for a check at `now` whose leases are free,
    /// leasing each to `lease.owner`. Concurrent claimers never get the same row.
    async fn claim_due(
        &self,
        lease: Lease,
        now: DateTime<Utc>,
        batch_max: u32,
    ) -> Result<Vec<Attempt>, StoreError>;

    /// When the oldest unfinished (pending or requires_action) attempt was created, if any: the
    /// sweep's "oldest unfinished age" gauge.
    async fn oldest_unfinished_created_at(&self) -> Result<Option<DateTime<Utc>>, StoreError>;

    /// Cheap round trip for health checks.
    async fn ping(&self) -> Result<(), StoreError>;

    /// Closes every connection, waiting for those in use to come back; later calls fail. On
    /// SQLite the last close checkpoints the write-ahead log into the database file.
    async fn close(&self);
}
