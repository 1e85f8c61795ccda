//! Reconciliation reports: for a period, every charge attempt we recorded against every payment
//! the provider holds, each row in one category, with a summary first.
//!
//! A run: list the provider's payments and refunds for the period (windows of created time,
//! bounded pages) into per-run staging tables; let PostgreSQL join them with
//! `payment_attempts` into the run's rows; read the rows back in bounded pages twice (once to
//! sum the summary, once to write them); delete the staging. Memory holds one page, however
//! long the period.
//!
//! `model`, `category`, `summary` and `period` are pure; `pull` and `Reporter` do the IO;
//! `render` writes CSV, JSON and HTML; `cli` is `chargeguard report`.

mod category;
pub mod cli;
mod model;
mod period;
mod pull;
pub mod render;
mod summary;

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::clock::Clock;
use crate::config::ReportConfig;
use crate::provider::{PaymentProvider, ProviderError};
use crate::store::{ReportStore, RunId, StoreError};
use crate::telemetry::alert_counters;

pub use category::{Category, Thresholds, classify};
pub use model::{
    AttemptFacts, JoinedRow, LinkedBy, OperationFacts, ProviderObject, ProviderRefund, RefundFacts,
    RefundMismatch, ReportRow, major_units, money,
};
pub use period::{PeriodError, ReportPeriod};
pub use summary::{CurrencyTotals, DataSources, Summary, SummaryBuilder};

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    Period(#[from] PeriodError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("listing the provider's {listing}: {error}")]
    Provider {
        listing: &'static str,
        error: ProviderError,
    },
    #[error(
        "listing the provider's {listing} took more than {pages_max} calls (report.provider_pages_max)"
    )]
    TooManyPages {
        listing: &'static str,
        pages_max: u32,
    },
}

/// Bounds of a report run, from `[report]` in the configuration.
#[derive(Debug, Clone)]
pub struct ReportSettings {
    pub thresholds: Thresholds,
    pub provider_window: chrono::Duration,
    pub provider_page_size: u32,
    pub provider_pages_max: u32,
    pub provider_lookbehind: chrono::Duration,
    pub provider_lookahead: chrono::Duration,
    pub provider_read_attempts_max: u32,
    pub provider_retry_backoff: Duration,
    pub rows_page_size: u32,
    pub objects_listed_per_row_max: u32,
    pub statement_timeout: Duration,
    pub period_days_max: u32,
    pub abandoned_run_after: chrono::Duration,
}

impl ReportSettings {
    pub fn from_config(config: &ReportConfig) -> Self {
        let minutes = |value: u64| {
            chrono::Duration::minutes(i64::try_from(value).unwrap_or(i64::MAX / 60_000))
        };
        Self {
            thresholds: Thresholds {
                pending_age_max: minutes(config.pending_age_max_minutes),
                requires_action_age_max: minutes(config.requires_action_age_max_minutes),
            },
            provider_window: minutes(config.provider_window_minutes),
            provider_page_size: config.provider_page_size,
            provider_pages_max: config.provider_pages_max,
            provider_lookbehind: minutes(config.provider_lookbehind_minutes),
            provider_lookahead: minutes(config.provider_lookahead_minutes),
            provider_read_attempts_max: config.provider_read_attempts_max,
            provider_retry_backoff: Duration::from_millis(config.provider_retry_backoff_ms),
            rows_page_size: config.rows_page_size,
            objects_listed_per_row_max: config.objects_listed_per_row_max,
            statement_timeout: Duration::from_millis(config.statement_timeout_ms),
            period_days_max: config.period_days_max,
            abandoned_run_after: minutes(config.abandoned_run_minutes),
        }
    }
}

/// Produces reports. Cheap to clone; shared by the CLI and the gRPC service.
#[derive(Clone)]
pub struct Reporter {
    store: Arc<dyn ReportStore>,
    provider: Arc<dyn PaymentProvider>,
    clock: Arc<dyn Clock>,
    settings: Arc<ReportSettings>,
}

impl Reporter {
    pub fn new(
        store: Arc<dyn ReportStore>,
        provider: Arc<dyn PaymentProvider>,
        clock: Arc<dyn Clock>,
        settings: ReportSettings,
    ) -> Self {
        Self {
            store,
            provider,
            clock,
            settings: Arc::new(settings),
        }
    }

    pub fn settings(&self) -> &ReportSettings {
        &self.settings
    }

    /// A fresh run id; pass it to [`Reporter::prepare`], and to [`Reporter::abandon`] if the
    /// preparation is cancelled.
    pub fn new_run(&self) -> RunId {
        RunId::from_uuid(uuid::Uuid::now_v7())
    }

    /// Lists the provider, joins, and sums the summary. The rows are then read from the
    /// returned report, which deletes the staging when finished (or dropped).
    pub async fn prepare(
        &self,
        run: RunId,
        period: ReportPeriod,
    ) -> Result<PreparedReport, ReportError> {
        let started = Instant::now();
        let generated_at = self.clock.now();
        let settings = &self.settings;
        self.store
            .begin_run(
                run,
                generated_at,
                generated_at - settings.abandoned_run_after,
                settings.statement_timeout,
            )
            .await?;
        let prepared = self.stage_and_sum(run, period, generated_at).await;
        match prepared {
            Ok(summary) => {
                tracing::info!(
                    %run,
                    rows = summary.rows,
                    discrepancies = summary.discrepancies,
                    provider_calls = summary.sources.provider_list_calls,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "report prepared"
                );
                Ok(PreparedReport {
                    reporter: self.clone(),
                    run,
                    summary,
                    finished: false,
                })
            }
            Err(error) => {
                metrics::counter!(alert_counters::REPORT_RUNS, "outcome" => "error")
                    .increment(1);
                self.abandon(run).await;
                Err(error)
            }
        }
    }

    /// Deletes a run's staging, logging rather than failing: an abandoned run is also deleted
    /// by the next run once it is `report.abandoned_run_minutes` old.
    pub async fn abandon(&self, run: RunId) {
        if let Err(error) = self
            .store
            .end_run(run, self.settings.statement_timeout)
            .await
        {
            tracing::warn!(%run, %error, "could not delete a report run's staging");
        }
    }

    async fn stage_and_sum(
        &self,
        run: RunId,
        period: ReportPeriod,
        generated_at: DateTime<Utc>,
    ) -> Result<Summary, ReportError> {
        let settings = &self.settings;
        let payments_range = (
            period.from() - settings.provider_lookbehind,
            period.to() + settings.provider_lookahead,
        );
        // Refunds of the period's payments may come any time later: list them up to now.
        let refunds_range = (payments_range.0, payments_range.1.max(generated_at));
        let payments =
            pull::pull_payments(&self.provider, &self.store, run, payments_range, settings).await?;
        let refunds =
            pull::pull_refunds(&self.provider, &self.store, run, refunds_range, settings).await?;
        self.store
            .build_rows(
                run,
                &period,
                settings.objects_listed_per_row_max,
                settings.statement_timeout,
            )
            .await?;
        let mut builder = SummaryBuilder::default();
        let mut pages = RowPages::new(self, run, generated_at);
        while let Some(page) = pages.next_page().await? {
            for row in &page {
                builder.add(row);
            }
        }
        let sources = DataSources {
            provider: self.provider.name().to_owned(),
            provider_payments_listed: payments.objects,
            provider_refunds_listed: refunds.objects,
            provider_list_calls: payments.calls + refunds.calls,
            payments_listed_from: payments_range.0,
            payments_listed_to: payments_range.1,
            refunds_listed_from: refunds_range.0,
            refunds_listed_to: refunds_range.1,
            chargeguard_version: env!("CARGO_PKG_VERSION"),
        };
        Ok(builder.finish(period, generated_at, sources, &settings.thresholds))
    }
}

/// A run whose rows are staged and summed. Read the rows with [`PreparedReport::rows`] (as
/// often as a format needs), then [`PreparedReport::finish`].
pub struct PreparedReport {
    reporter: Reporter,
    run: RunId,
    summary: Summary,
    finished: bool,
}

impl PreparedReport {
    pub fn summary(&self) -> &Summary {
        &self.summary
    }

    /// A pass over every row, in order, one bounded page at a time.
    pub fn rows(&self) -> RowPages<'_> {
        RowPages::new(&self.reporter, self.run, self.summary.generated_at)
    }

    /// Deletes the staging and counts the run.
    pub async fn finish(mut self) {
        self.finished = true;
        let outcome = if self.summary.is_clean() {
            "clean"
        } else {
            "discrepancies"
        };
        metrics::counter!(alert_counters::REPORT_RUNS, "outcome" => outcome).increment(1);
        for (category, count) in &self.summary.categories {
            metrics::counter!("chargeguard_report_rows_total", "category" => category.as_str())
                .increment(*count);
        }
        let double_charges = self.summary.count(Category::DoubleCharge);
        if double_charges > 0 {
            tracing::error!(run = %self.run, double_charges, "report found operations with more than one provider object");
        }
        self.reporter.abandon(self.run).await;
    }
}

impl Drop for PreparedReport {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        // Dropped mid-way (an error, a client that went away): clean up in the background.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let reporter = self.reporter.clone();
            let run = self.run;
            runtime.spawn(async move { reporter.abandon(run).await });
        }
    }
}

/// One pass over a run's rows.
pub struct RowPages<'a> {
    reporter: &'a Reporter,
    run: RunId,
    generated_at: DateTime<Utc>,
    after_seq: i64,
    done: bool,
}

impl<'a> RowPages<'a> {
    fn new(reporter: &'a Reporter, run: RunId, generated_at: DateTime<Utc>) -> Self {
        Self {
            reporter,
            run,
            generated_at,
            after_seq: 0,
            done: false,
        }
    }

    /// The next page of classified rows, or `None` after the last.
    pub async fn next_page(&mut self) -> Result<Option<Vec<ReportRow>>, ReportError> {
        if self.done {
            return Ok(None);
        }
        let settings = &self.reporter.settings;
        let page = self
            .reporter
            .store
            .rows_page(self.run, self.after_seq, settings.rows_page_size)
            .await?;
        if page.len() < settings.rows_page_size as usize {
            self.done = true;
        }
        let Some(last) = page.last() else {
            return Ok(None);
        };
        self.after_seq = last.seq;
        let rows = page
            .into_iter()
            .map(|row| classify(row, self.generated_at, &settings.thresholds))
            .collect();
        Ok(Some(rows))
    }
}
