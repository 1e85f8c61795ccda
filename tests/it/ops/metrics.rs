//! `/metrics` on the HTTP port, in the Prometheus text format.

use crate::support::{TestApp, charge_request};

/// The value of `chargeguard_charges_total{outcome="…"}`, if the series exists.
fn charges_total(text: &str, outcome: &str) -> Option<f64> {
    series_value(text, &format!("chargeguard_charges_total{{outcome=\"{outcome}\"}} "))
}

fn series_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series))
        .map(|value| value.trim().parse().unwrap())
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
}
