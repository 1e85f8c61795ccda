//! Prunes processed inbox rows (and their de-duplication keys) once they are older than the
//! retention, in small batches so a delete never holds many locks. The retention is longer than
//! the longest redelivery path (Stripe resends manually up to 30 days after an event), so a
//! pruned event can no longer come back. `payment_attempts` is never pruned.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::store::inbox::{InboxStore, PruneCounts};
use crate::store::{CallerTime, StoreError};

/// Stripe resends events manually up to 30 days after they happened; a shorter retention
/// could let a resent event in after its dedup record is gone.
pub const RETENTION_DAYS_MIN: u32 = 31;
/// Batches per run, so one run is bounded however far behind retention is.
pub const PRUNE_BATCHES_PER_RUN_MAX: u32 = 1_000;
/// Pause between batches, so other writers get the table between deletes.
const PAUSE_BETWEEN_BATCHES: Duration = Duration::from_millis(50);

#[derive(Debug, Clone, Copy)]
pub struct RetentionSettings {
    pub retention: chrono::Duration,
    pub batch_max: u32,
    pub interval: Duration,
}

#[derive(Clone)]
pub struct Retention {
    store: Arc<dyn InboxStore>,
    clock: Arc<dyn Clock>,
    settings: RetentionSettings,
}

impl Retention {
    pub fn new(
        store: Arc<dyn InboxStore>,
        clock: Arc<dyn Clock>,
        settings: RetentionSettings,
    ) -> Self {
        Self {
            store,
            clock,
            settings,
        }
    }

    /// Deletes one batch (at most `batch_max` rows of each table) received more than the
    /// retention ago by the database's clock, which stamped them.
    pub async fn try_prune_once(&self) -> Result<PruneCounts, StoreError> {
        let counts = self
            .store
            .prune_processed(
                self.settings.retention,
                CallerTime::of(self.clock.as_ref()),
                self.settings.batch_max,
            )
            .await?;
        metrics::counter!("chargeguard_webhook_pruned_total", "table" => "webhook_inbox")
            .increment(counts.inbox_rows);
        metrics::counter!("chargeguard_webhook_pruned_total", "table" => "webhook_dedup")
            .increment(counts.dedup_rows);
        Ok(counts)
    }

    fn is_full(&self, counts: PruneCounts) -> bool {
        let batch_max = u64::from(self.settings.batch_max);
        counts.inbox_rows >= batch_max || counts.dedup_rows >= batch_max
    }

    /// Every `interval`, prunes batch after batch until a batch comes back short.
    pub async fn run(self, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(self.settings.interval) => {}
            }
            for _ in 0..PRUNE_BATCHES_PER_RUN_MAX {
                match self.try_prune_once().await {
                    Ok(counts) if self.is_full(counts) => {}
                    Ok(_) => break,
                    Err(error) => {
                        tracing::warn!(%error, "webhook inbox pruning failed; retrying next run");
                        break;
                    }
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(PAUSE_BETWEEN_BATCHES) => {}
                }
            }
        }
    }
}
