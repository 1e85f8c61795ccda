//! Storage for reconciliation reports: per-run staging of the provider's objects, the join with
//! `payment_attempts` done by the database, and the joined rows read back in bounded pages.
//! Both stores implement it with the same statements (`postgres_report.rs`,
//! `sqlite_report.rs`): the database joins a period's worth of rows without the process holding
//! them, and both give `report::classify` the same `JoinedRow`s.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::StoreError;
use crate::domain::{AttemptId, PaymentSnapshot, RefundSnapshot};
use crate::report::{JoinedRow, ReportPeriod};

/// One report run's staging, deleted when the run ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunId(Uuid);

impl RunId {
    pub fn from_uuid(id: Uuid) -> Self {
        Self(id)
    }
    pub fn as_uuid(self) -> Uuid {
        self.0
    }
}

impl std::fmt::Display for RunId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// A provider payment to stage, with the attempt its metadata claims (if it names one).
#[derive(Debug, Clone, Copy)]
pub struct StagedPayment<'a> {
    pub payment: &'a PaymentSnapshot,
    pub claimed_attempt: Option<AttemptId>,
}

#[async_trait]
pub trait ReportStore: Send + Sync + 'static {
    /// Registers the run, after deleting the staging of runs started before `abandoned_before`
    /// (their process died before cleaning up).
    async fn begin_run(
        &self,
        run: RunId,
        now: DateTime<Utc>,
        abandoned_before: DateTime<Utc>,
        timeout: Duration,
    ) -> Result<(), StoreError>;

    /// Stages one page of provider payments, each tied to its attempt: the one its metadata
    /// names if it exists, else the one that recorded its id. Staging a payment twice keeps
    /// the first.
    async fn stage_payments(
        &self,
        run: RunId,
        payments: &[StagedPayment<'_>],
    ) -> Result<(), StoreError>;

    async fn stage_refunds(&self, run: RunId, refunds: &[RefundSnapshot])
    -> Result<(), StoreError>;

    /// Joins the staged objects with the charge attempts created in `period` into the run's
    /// rows: one per attempt, one per unclaimed object created in `period`, ordered by
    /// creation time. Lists at most `objects_listed_max` objects on a row. Returns the rows.
    async fn build_rows(
        &self,
        run: RunId,
        period: &ReportPeriod,
        objects_listed_max: u32,
        timeout: Duration,
    ) -> Result<u64, StoreError>;

    /// Up to `limit` rows after position `after_seq` (0 for the first page), in order.
    async fn rows_page(
        &self,
        run: RunId,
        after_seq: i64,
        limit: u32,
    ) -> Result<Vec<JoinedRow>, StoreError>;

    /// Deletes the run's staging.
    async fn end_run(&self, run: RunId, timeout: Duration) -> Result<(), StoreError>;
}
