//! Logs (tracing, text or JSON) and metrics (Prometheus text format, served on the HTTP port).

use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;

use crate::domain::review::ReviewKind;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Installs the global subscriber. `RUST_LOG` overrides the default filter.
pub fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn,hyper=warn,h2=warn,tower=warn,tokio_cron_scheduler=warn"));
    // Colours only for a person at a terminal, never into files or log collectors.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    // A second init (tests, embedded use) keeps the first subscriber.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(true).try_init(),
    };
}

/// The counters an operator alerts on: each increase says money moved where it should not have,
/// or work was left undone. Each is on `/metrics` at 0 from the start ([`register_alert_counters`]):
/// a series that first appears at 1 has no earlier sample, so Prometheus' `increase()` and
/// `rate()` see no increase and the first double charge would raise no alert.
pub mod alert_counters {
    pub const SUCCEEDED_AFTER_FAILURE: &str = "chargeguard_succeeded_after_failure_total";
    pub const REFUNDS_FAILED_AFTER_SUCCESS: &str = "chargeguard_refunds_failed_after_success_total";
    /// Labelled `reason`: [`ReviewKind::label`](crate::domain::review::ReviewKind::label).
    pub const ATTEMPTS_FLAGGED: &str = "chargeguard_attempts_flagged_total";
    pub const DOUBLE_CHARGES_FOUND: &str = "chargeguard_double_charges_found_total";
    pub const REPLAYED_FAILURES: &str = "chargeguard_replayed_failures_total";
    pub const WEBHOOK_SETTLE_ERRORS: &str = "chargeguard_webhook_settle_errors_total";
    pub const WEBHOOK_CLAIMS_LOST: &str = "chargeguard_webhook_claims_lost_total";
    /// Labelled `outcome`: [`REPORT_OUTCOMES`].
    pub const REPORT_RUNS: &str = "chargeguard_report_runs_total";
    pub const REPORT_OUTCOMES: [&str; 3] = ["clean", "discrepancies", "error"];
    /// Labelled `event_type`: [`DISPUTE_EVENT_TYPES`](crate::webhook::event::DISPUTE_EVENT_TYPES).
    pub const DISPUTES: &str = "chargeguard_disputes_total";

    pub(super) const UNLABELLED: [&str; 6] = [
        SUCCEEDED_AFTER_FAILURE,
        REFUNDS_FAILED_AFTER_SUCCESS,
        DOUBLE_CHARGES_FOUND,
        REPLAYED_FAILURES,
        WEBHOOK_SETTLE_ERRORS,
        WEBHOOK_CLAIMS_LOST,
    ];
}

/// Puts every alert counter on `/metrics` at its current value (0 in a new process). Adding 0
/// rather than setting it: applications in one test process share the recorder.
pub fn register_alert_counters() {
    for name in alert_counters::UNLABELLED {
        metrics::counter!(name).increment(0);
    }
    for outcome in alert_counters::REPORT_OUTCOMES {
        metrics::counter!(alert_counters::REPORT_RUNS, "outcome" => outcome).increment(0);
    }
    for event_type in crate::webhook::event::DISPUTE_EVENT_TYPES {
        metrics::counter!(alert_counters::DISPUTES, "event_type" => event_type).increment(0);
    }
    for kind in ReviewKind::ALL {
        metrics::counter!(alert_counters::ATTEMPTS_FLAGGED, "reason" => kind.label()).increment(0);
    }
}

/// Counts an attempt flagged for review, by the kind of its reason; a double charge also on its
/// own counter.
pub fn count_flagged_attempt(kind: ReviewKind) {
    metrics::counter!(alert_counters::ATTEMPTS_FLAGGED, "reason" => kind.label()).increment(1);
    if kind == ReviewKind::DoubleCharge {
        metrics::counter!(alert_counters::DOUBLE_CHARGES_FOUND).increment(1);
    }
}

static METRICS: OnceLock<PrometheusHandle> = OnceLock::new();

/// Every histogram is exported as a Prometheus histogram with these upper bounds (seconds), not
/// as a summary: bucket counts add up across replicas, quantiles of summaries do not. From a
/// provider round of a few milliseconds to a sweep pass of a minute.
const LATENCY_BUCKETS_SECONDS: [f64; 14] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0];

/// Rows per group-commit statement (`store/group_commit.rs`): a count, not a latency; up to
/// `database.group_commit.batch_max`'s bound.
const BATCH_ROWS_BUCKETS: [f64; 11] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1_000.0];

/// A group-commit statement and a caller's wait for it (`store/group_commit.rs`): a commit on a
/// local disk takes a fraction of a millisecond, so the bounds start below the latency list's.
const GROUP_COMMIT_BUCKETS_SECONDS: [f64; 12] =
    [0.000_25, 0.000_5, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 1.0];

/// A gRPC call inside the service (`grpc/request_duration.rs`): a charge takes a few
/// milliseconds plus the provider's round, so the bounds are finest where a service-level p99
/// sits (a few to a few tens of milliseconds), up to the request timeout's order.
const REQUEST_BUCKETS_SECONDS: [f64; 17] = [
    0.000_5, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0,
];

/// The process-wide Prometheus recorder, installed on first use. One per process: several
/// applications in one test process share it.
pub fn metrics_handle() -> &'static PrometheusHandle {
    METRICS.get_or_init(|| {
        PrometheusBuilder::new()
            .set_buckets(&LATENCY_BUCKETS_SECONDS)
            .expect("bucket list is not empty")
            .set_buckets_for_metric(
                metrics_exporter_prometheus::Matcher::Full("chargeguard_group_commit_batch_rows".to_owned()),
                &BATCH_ROWS_BUCKETS,
            )
            .expect("bucket list is not empty")
            .set_buckets_for_metric(
                metrics_exporter_prometheus::Matcher::Full("chargeguard_group_commit_statement_seconds".to_owned()),
                &GROUP_COMMIT_BUCKETS_SECONDS,
            )
            .expect("bucket list is not empty")
            .set_buckets_for_metric(
                metrics_exporter_prometheus::Matcher::Full("chargeguard_group_commit_wait_seconds".to_owned()),
                &GROUP_COMMIT_BUCKETS_SECONDS,
            )
            .expect("bucket list is not empty")
            .set_buckets_for_metric(
                metrics_exporter_prometheus::Matcher::Full("chargeguard_grpc_request_seconds".to_owned()),
                &REQUEST_BUCKETS_SECONDS,
            )
            .expect("bucket list is not empty")
            .install_recorder()
            .expect("no other metrics recorder is installed in this process")
    })
}
