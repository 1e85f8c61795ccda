//! Times the recovery sweep's claim query (`AttemptStore::claim_due`, the store's own code) over
//! the rows that are due now: batch after batch until none is left. It leases the rows it
//! claims and calls no provider, so it measures what the table's size can change — finding and
//! leasing due rows — apart from provider round trips, which do not depend on the table.

use std::time::{Duration, Instant};

use serde::Serialize;
use uuid::Uuid;

use crate::domain::LeaseOwner;
use crate::store::{AttemptStore, CallerTime, LeaseRequest, PostgresStore, StoreError};

pub const BATCH_MAX_LIMIT: u32 = 10_000;
pub const ROWS_MAX_LIMIT: u64 = 10_000_000;

#[derive(Debug, Clone)]
pub struct ClaimSettings {
    pub batch_max: u32,
    /// Stops after this many rows even if more are due.
    pub rows_max: u64,
    /// The lease put on claimed rows: long enough that no claimed row becomes due again while
    /// the timing runs (which would count it twice).
    pub lease: Duration,
}

impl ClaimSettings {
    pub fn new(batch_max: u32, rows_max: u64, lease: Duration) -> Result<Self, String> {
        if !(1..=BATCH_MAX_LIMIT).contains(&batch_max) {
            return Err(format!("batch max must be 1-{BATCH_MAX_LIMIT}"));
        }
        if !(1..=ROWS_MAX_LIMIT).contains(&rows_max) {
            return Err(format!("rows max must be 1-{ROWS_MAX_LIMIT}"));
        }
        if lease < Duration::from_secs(60) {
            return Err("the lease must be at least 60 seconds".to_owned());
        }
        Ok(Self {
            batch_max,
            rows_max,
            lease,
        })
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ClaimReport {
    pub rows_claimed: u64,
    pub batches: u64,
    pub batch_max: u32,
    pub elapsed_seconds: f64,
    /// Milliseconds per 1,000 rows claimed: the figure compared across table sizes.
    pub ms_per_thousand_rows: f64,
}

impl ClaimReport {
    pub fn json_line(&self) -> String {
        super::report::tagged_json_line("chargeguard_bench_claim", self)
    }
}

impl std::fmt::Display for ClaimReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "claim: {} rows in {} batches of at most {} in {:.3} s ({:.3} ms per 1,000 rows)",
            self.rows_claimed,
            self.batches,
            self.batch_max,
            self.elapsed_seconds,
            self.ms_per_thousand_rows
        )
    }
}

pub async fn run(
    store: &PostgresStore,
    settings: &ClaimSettings,
) -> Result<ClaimReport, StoreError> {
    let owner = LeaseOwner::from_uuid(Uuid::new_v4());
    let started = Instant::now();
    let mut rows_claimed = 0_u64;
    let mut batches = 0_u64;
    while rows_claimed < settings.rows_max {
        let lease = LeaseRequest {
            owner,
            duration: chrono::Duration::from_std(settings.lease).unwrap_or(chrono::Duration::MAX),
            // The default safe window: the claim statement is timed as the sweep runs it.
            key_window_safe: chrono::Duration::hours(23),
            time: CallerTime { now: chrono::Utc::now(), shift: chrono::Duration::zero() },
        };
        let remaining = u32::try_from(settings.rows_max - rows_claimed).unwrap_or(u32::MAX);
        let claimed = store.claim_due(lease, settings.batch_max.min(remaining)).await?;
        if claimed.is_empty() {
            break;
        }
        batches += 1;
        rows_claimed += claimed.len() as u64;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let per_thousand = if rows_claimed > 0 {
        elapsed * 1_000.0 * 1_000.0 / rows_claimed as f64
    } else {
        0.0
    };
    Ok(ClaimReport {
        rows_claimed,
        batches,
        batch_max: settings.batch_max,
        elapsed_seconds: (elapsed * 1_000.0).round() / 1_000.0,
        ms_per_thousand_rows: (per_thousand * 1_000.0).round() / 1_000.0,
    })
}
