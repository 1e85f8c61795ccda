//! `/metrics` on the HTTP port, in the Prometheus text format.

use std::net::SocketAddr;
use std::time::Duration;

use chargeguard::clock::{Clock, SystemClock};
use chargeguard::secret::Secret;
use chargeguard::webhook::gauges::INBOX_GAUGES_INTERVAL;
use chargeguard::webhook::signature::sign;

use super::process::{ServeProcess, command};
use crate::support::{TestApp, TestDatabase, charge_request, metrics_text, series_value};

/// The value of `chargeguard_charges_total{outcome="…"}`, if the series exists.
fn charges_total(text: &str, outcome: &str) -> Option<f64> {
    series_value(text, &format!("chargeguard_charges_total{{outcome=\"{outcome}\"}} "))
}

#[tokio::test]
async fn metrics_count_charge_outcomes() {
    let app = TestApp::spawn().await;
    app.charge(charge_request("order-metrics:charge"))
        .await
        .unwrap();
    app.charge(charge_request("order-metrics:charge"))
        .await
        .unwrap();
    let mut mismatch = charge_request("order-metrics:charge");
    mismatch.amount_minor += 1;
    app.charge(mismatch).await.unwrap_err();

    let response = reqwest::get(format!("http://{}/metrics", app.http_addr))
        .await
        .unwrap();
    assert!(response.status().is_success());
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(content_type.starts_with("text/plain"), "{content_type}");
    let text = response.text().await.unwrap();
    // The recorder is shared by every app in this test process: other tests add to the counts.
    assert!(
        text.contains("# TYPE chargeguard_charges_total counter"),
        "{text}"
    );
    for outcome in ["applied", "duplicate", "mismatch"] {
        let count = charges_total(&text, outcome)
            .unwrap_or_else(|| panic!("no {outcome} series in:\n{text}"));
        assert!(count >= 1.0, "{outcome}: {count}");
    }
    // The duplicate and the mismatch were both answered from the remembered outcome.
    let hits = series_value(&text, "chargeguard_outcome_cache_lookups_total{result=\"hit\"} ")
        .unwrap_or_else(|| panic!("no outcome cache hit series in:\n{text}"));
    assert!(hits >= 2.0, "hits: {hits}");
    // Latencies are Prometheus histograms (buckets add up across replicas), not summaries.
    assert!(text.contains("# TYPE chargeguard_provider_round_seconds histogram"), "{text}");
    assert!(text.lines().any(|line| line.starts_with("chargeguard_provider_round_seconds_bucket{") && line.contains("le=\"0.005\"")), "{text}");
    assert!(!text.contains("chargeguard_provider_round_seconds{") || !text.contains("quantile="), "no summary quantiles: {text}");
    // Each call's time inside the service, by method and status: the two answered charges as
    // `ok`, the mismatch under its own code.
    let charge_calls = |code_is_ok: bool| -> f64 {
        text.lines()
            .filter(|line| line.starts_with("chargeguard_grpc_request_seconds_count{method=\"chargeguard.v1.Payments/Charge\""))
            .filter(|line| line.contains("code=\"ok\"") == code_is_ok)
            .map(|line| line.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum()
    };
    assert!(charge_calls(true) >= 2.0, "answered charges: {text}");
    assert!(charge_calls(false) >= 1.0, "the refused charge: {text}");
    assert!(text.contains("# TYPE chargeguard_grpc_request_seconds histogram"), "{text}");
    // Its bounds are finest where a charge's p99 sits, between the latency list's 5 and 10 ms.
    assert!(
        text.lines().any(|line| line.starts_with("chargeguard_grpc_request_seconds_bucket{") && line.contains("le=\"0.0075\"")),
        "{text}"
    );
    if crate::support::group_commit_enabled() {
        // Group commit's rows, statement time and each caller's wait, by committer, with the
        // sub-millisecond bounds a local commit needs.
        for statement in ["insert", "finish"] {
            for metric in ["batch_rows", "statement_seconds", "wait_seconds"] {
                let series = format!("chargeguard_group_commit_{metric}_count{{statement=\"{statement}\"}} ");
                let count = series_value(&text, &series).unwrap_or_else(|| panic!("no {series} in:\n{text}"));
                assert!(count >= 1.0, "{series}{count}");
            }
            let finest = format!("chargeguard_group_commit_wait_seconds_bucket{{statement=\"{statement}\",le=\"0.00025\"}} ");
            assert!(series_value(&text, &finest).is_some(), "no {finest} in:\n{text}");
        }
    }
}

const WEBHOOK_SECRET: &str = "whsec_inbox_gauges_test";
/// How long a poll waits for a gauge to show a new reading: a few of the gauges' periods.
const GAUGE_WAIT_MAX: Duration = Duration::from_secs(4 * INBOX_GAUGES_INTERVAL.as_secs());

/// Polls `/metrics` until `done(depth, oldest age)` holds; panics with the last text past
/// `GAUGE_WAIT_MAX`.
async fn wait_for_inbox_gauges(http_addr: SocketAddr, done: impl Fn(f64, f64) -> bool) -> (f64, f64) {
    let deadline = tokio::time::Instant::now() + GAUGE_WAIT_MAX;
    loop {
        let text = metrics_text(http_addr).await;
        let depth = series_value(&text, "chargeguard_webhook_inbox_depth ");
        let age = series_value(&text, "chargeguard_webhook_inbox_oldest_age_seconds ");
        if let (Some(depth), Some(age)) = (depth, age)
            && done(depth, age)
        {
            return (depth, age);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "inbox gauges never got there:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A process of its own, so that its gauges are nobody else's (one recorder per process).
#[tokio::test]
async fn inbox_gauges_keep_counting_while_the_worker_drains_nothing() {
    let database = TestDatabase::create().await;
    let dir = tempfile::tempdir().unwrap();
    let mut serve = command(dir.path());
    serve
        .env("CHARGEGUARD_DATABASE__URL", &database.url)
        .env("CHARGEGUARD_WEBHOOKS__SECRETS", format!("[\"{WEBHOOK_SECRET}\"]"))
        // The worker's first tick is an hour away: nothing is drained during this test.
        .env("CHARGEGUARD_WEBHOOKS__WORKER_INTERVAL_MS", "3600000");
    let mut server = ServeProcess::start(serve, &[]);
    server.wait_ready().await;

    let now = SystemClock.now().timestamp();
    let body = serde_json::json!({
        "id": "evt_inbox_gauges", "object": "event", "type": "customer.created", "created": now,
        "data": {"object": {"id": "cus_inbox_gauges", "object": "customer"}},
    })
    .to_string();
    let stored = reqwest::Client::new()
        .post(format!("http://{}/webhooks/stripe", server.http_addr))
        .header("content-type", "application/json")
        .header("stripe-signature", sign(&Secret::new(WEBHOOK_SECRET), now, body.as_bytes()))
        .body(body)
        .send()
        .await
        .unwrap();
    assert!(stored.status().is_success(), "{stored:?}");

    let (_, first_age) = wait_for_inbox_gauges(server.http_addr, |depth, _| depth == 1.0).await;
    let (depth, later_age) =
        wait_for_inbox_gauges(server.http_addr, |_, age| age >= first_age + 1.0).await;
    assert_eq!(depth, 1.0, "still waiting: the worker never ran; age {first_age} s, then {later_age} s");
}

/// A process of its own, so that nothing has counted yet (one recorder per process). Alerts are
/// written as `increase(…) > 0`: a series that first appears at 1 has no earlier sample, so the
/// first double charge would go unseen unless the series was there at 0 before it.
#[tokio::test]
async fn alert_counters_are_exported_at_zero_before_anything_happened() {
    let database = TestDatabase::create().await;
    let dir = tempfile::tempdir().unwrap();
    let mut serve = command(dir.path());
    serve.env("CHARGEGUARD_DATABASE__URL", &database.url);
    let mut server = ServeProcess::start(serve, &[]);
    server.wait_ready().await;
    let text = metrics_text(server.http_addr).await;
    for name in [
        "chargeguard_succeeded_after_failure_total",
        "chargeguard_refunds_failed_after_success_total",
        "chargeguard_double_charges_found_total",
        "chargeguard_replayed_failures_total",
        "chargeguard_webhook_settle_errors_total",
        "chargeguard_webhook_claims_lost_total",
    ] {
        assert!(text.contains(&format!("# TYPE {name} counter")), "{name}:\n{text}");
        assert_eq!(series_value(&text, &format!("{name} ")), Some(0.0), "{name}:\n{text}");
    }
    for outcome in ["clean", "discrepancies", "error"] {
        let series = format!("chargeguard_report_runs_total{{outcome=\"{outcome}\"}} ");
        assert_eq!(series_value(&text, &series), Some(0.0), "{series}:\n{text}");
    }
    for reason in [
        "double_charge",
        "double_refund",
        "second_provider_object",
        "succeeded_after_failure",
        "dispute",
        "key_conflict",
        "unexpected_status",
        "other_amount",
        "other",
    ] {
        let series = format!("chargeguard_attempts_flagged_total{{reason=\"{reason}\"}} ");
        assert_eq!(series_value(&text, &series), Some(0.0), "{series}:\n{text}");
    }
    for event_type in ["charge.dispute.created", "charge.dispute.updated", "charge.dispute.closed"] {
        let series = format!("chargeguard_disputes_total{{event_type=\"{event_type}\"}} ");
        assert_eq!(series_value(&text, &series), Some(0.0), "{series}:\n{text}");
    }
}
