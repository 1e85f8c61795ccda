//! The inbox alert gauges, refreshed on a fixed period of their own. The worker cannot keep
//! them: its ticks may be an hour apart (`webhooks.worker_interval_ms`), and a drain that fails
//! (a statement timing out on one event, every tick) never gets to them — yet these gauges are
//! how an inbox that stopped draining is seen at all.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::store::inbox::{InboxStats, InboxStore};
use crate::store::{CallerTime, StoreError};

/// How often the gauges are read from the database: well under any scrape interval worth
/// alerting on, and one small indexed statement per period.
pub const INBOX_GAUGES_INTERVAL: Duration = Duration::from_secs(5);

const DEPTH_GAUGE: &str = "chargeguard_webhook_inbox_depth";
const OLDEST_AGE_GAUGE: &str = "chargeguard_webhook_inbox_oldest_age_seconds";

#[derive(Clone)]
pub struct InboxGauges {
    store: Arc<dyn InboxStore>,
    clock: Arc<dyn Clock>,
}

impl InboxGauges {
    pub fn new(store: Arc<dyn InboxStore>, clock: Arc<dyn Clock>) -> Self {
        Self { store, clock }
    }

    /// Reads the inbox once and sets both gauges; returns what it read.
    pub async fn try_observe_once(&self) -> Result<InboxStats, StoreError> {
        let stats = self
            .store
            .inbox_stats(CallerTime::of(self.clock.as_ref()))
            .await?;
        metrics::gauge!(DEPTH_GAUGE).set(stats.unprocessed as f64);
        set_oldest_age(oldest_age(&stats));
        Ok(stats)
    }

    /// Every `INBOX_GAUGES_INTERVAL` until `shutdown`, whatever the worker does.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut interval = tokio::time::interval(INBOX_GAUGES_INTERVAL);
        interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // The oldest waiting event's age at the last reading, and when (monotonic) it was read.
        let mut last_seen: Option<(chrono::Duration, Instant)> = None;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = interval.tick() => {}
            }
            match self.try_observe_once().await {
                Ok(stats) => last_seen = oldest_age(&stats).map(|age| (age, Instant::now())),
                Err(error) => {
                    // Nothing settles while the database cannot be read, so the oldest event
                    // last seen waiting is still waiting: its age keeps growing on the gauge,
                    // and an outage of the database does not look like a quiet inbox.
                    tracing::warn!(%error, "webhook inbox gauges not read; the oldest age keeps counting");
                    set_oldest_age(last_seen.map(|(age, read_at)| {
                        let waited = chrono::Duration::from_std(read_at.elapsed()).ok();
                        waited
                            .and_then(|waited| age.checked_add(&waited))
                            .unwrap_or(age)
                    }));
                }
            }
        }
    }
}

/// The oldest waiting event's age on the clock that stamped it, the database's: a replica
/// whose own clock is off shows the same age as the others.
fn oldest_age(stats: &InboxStats) -> Option<chrono::Duration> {
    stats
        .oldest_unprocessed_received_at
        .map(|oldest| stats.database_now - oldest)
}

fn set_oldest_age(age: Option<chrono::Duration>) {
    let age_seconds = age
        .map(|age| age.num_milliseconds().max(0) as f64 / 1_000.0)
        .unwrap_or(0.0);
    metrics::gauge!(OLDEST_AGE_GAUGE).set(age_seconds);
}
