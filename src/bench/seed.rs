//! `chargeguard bench seed`: grows a benchmark database's `payment_attempts` with settled rows
//! and adds stuck ones, then refreshes the planner's statistics, so the sweep can be timed over
//! tables of a million rows and more.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::store::postgres_bench::SeedKind;
use crate::store::{PostgresStore, StoreError};

pub const SETTLED_ROWS_MAX: u64 = 100_000_000;
pub const STUCK_ROWS_MAX: u64 = 1_000_000;
/// One bulk statement may take minutes on a busy machine.
pub const SEED_STATEMENT_TIMEOUT: Duration = Duration::from_secs(600);

#[derive(Debug, Clone, Copy)]
pub struct SeedSettings {
    settled: u64,
    stuck: u64,
    settle_unfinished: bool,
}

impl SeedSettings {
    pub fn new(settled: u64, stuck: u64, settle_unfinished: bool) -> Result<Self, String> {
        if settled > SETTLED_ROWS_MAX {
            return Err(format!("at most {SETTLED_ROWS_MAX} settled rows at once"));
        }
        if stuck > STUCK_ROWS_MAX {
            return Err(format!("at most {STUCK_ROWS_MAX} stuck rows at once"));
        }
        Ok(Self {
            settled,
            stuck,
            settle_unfinished,
        })
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct SeedReport {
    pub settled_inserted: u64,
    pub stuck_inserted: u64,
    pub unfinished_settled: u64,
    /// Seeded rows in the table after this run.
    pub seeded_rows: u64,
    /// Rows a sweep would find now.
    pub due_now: u64,
    pub elapsed_seconds: f64,
}

impl SeedReport {
    pub fn json_line(&self) -> String {
        super::report::tagged_json_line("chargeguard_bench_seed", self)
    }
}

impl std::fmt::Display for SeedReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "seed: +{} settled, +{} stuck, {} unfinished ended; {} seeded rows, {} due now ({:.1} s)",
            self.settled_inserted,
            self.stuck_inserted,
            self.unfinished_settled,
            self.seeded_rows,
            self.due_now,
            self.elapsed_seconds
        )
    }
}

pub async fn run(store: &PostgresStore, settings: &SeedSettings) -> Result<SeedReport, StoreError> {
    let started = Instant::now();
    let now = chrono::Utc::now();
    let unfinished_settled = if settings.settle_unfinished {
        store.settle_seeded_unfinished(now).await?
    } else {
        0
    };
    let mut next = store.next_seed_number().await?;
    let settled_inserted = store
        .seed_attempts(SeedKind::Settled, next, settings.settled, now)
        .await?;
    next += settings.settled;
    let stuck_inserted = store
        .seed_attempts(SeedKind::Stuck, next, settings.stuck, now)
        .await?;
    next += settings.stuck;
    if settled_inserted + stuck_inserted > 0 {
        store.analyze_attempts().await?;
    }
    Ok(SeedReport {
        settled_inserted,
        stuck_inserted,
        unfinished_settled,
        seeded_rows: next - 1,
        due_now: store.count_due(chrono::Utc::now()).await?,
        elapsed_seconds: (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
    })
}
