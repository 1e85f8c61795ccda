//! deploy/grafana/chargeguard.json, the dashboard operators import: every panel's query is
//! PromQL that promtool accepts, names only metrics chargeguard's code exports (a misspelt name
//! draws an empty panel that looks like a quiet day), and every alert a panel's description
//! names is one of deploy/prometheus/alerts.yml.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;

use super::alerts::{promtool_in, words_starting};
use super::deploy::files_under;

const DASHBOARD: &str = include_str!("../../../deploy/grafana/chargeguard.json");
const ALERT_RULES: &str = include_str!("../../../deploy/prometheus/alerts.yml");

/// Every panel, those inside collapsed rows included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut all = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        all.push(panel);
        if let Some(inner) = panel["panels"].as_array() {
            all.extend(inner);
        }
    }
    all
}

/// Every query of every panel, with the panel's title.
fn queries(dashboard: &Value) -> Vec<(String, String)> {
    panels(dashboard)
        .into_iter()
        .flat_map(|panel| {
            let title = panel["title"].as_str().unwrap_or_default().to_owned();
            panel["targets"].as_array().into_iter().flatten().map(move |target| {
                (title.clone(), target["expr"].as_str().expect("every target has an expr").to_owned())
            })
        })
        .collect()
}

/// Every `"chargeguard_…"` string in src/: the metric names the code can export, and some
/// other names (metadata keys) that no query would read.
fn names_in_the_code() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for path in files_under(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &["rs"]) {
        let source = std::fs::read_to_string(&path).unwrap();
        for quoted in source.split('"').skip(1).step_by(2) {
            if quoted.starts_with("chargeguard_") && quoted.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                names.insert(quoted.to_owned());
            }
        }
    }
    names
}

#[test]
fn the_dashboard_reads_only_metrics_the_code_exports_in_promql_promtool_accepts() {
    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let queries = queries(&dashboard);
    assert!(queries.len() >= 20, "{queries:?}");

    let exported = names_in_the_code();
    for (title, expr) in &queries {
        for name in words_starting(expr, "chargeguard_") {
            // A histogram is exported as its _bucket, _sum and _count series.
            let metric = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .unwrap_or(&name);
            assert!(exported.contains(metric), "panel {title:?} reads {name}, which no code exports");
        }
    }

    // promtool parses PromQL only in rule files: each query as a recording rule.
    let rules = serde_json::json!({
        "groups": [{
            "name": "dashboard",
            "rules": queries.iter().enumerate()
                .map(|(index, (_, expr))| serde_json::json!({"record": format!("dashboard_query_{index}"), "expr": expr}))
                .collect::<Vec<_>>(),
        }]
    });
    let dir = tempfile::tempdir().unwrap();
    // JSON is YAML.
    std::fs::write(dir.path().join("dashboard_rules.yml"), rules.to_string()).unwrap();
    promtool_in(dir.path(), &["check", "rules", "dashboard_rules.yml"]);
}

#[test]
fn every_alert_the_dashboard_names_is_a_rule() {
    let dashboard: Value = serde_json::from_str(DASHBOARD).unwrap();
    let alerts = words_starting(ALERT_RULES, "Chargeguard");
    let mut named = BTreeSet::new();
    for panel in panels(&dashboard) {
        named.extend(words_starting(panel["description"].as_str().unwrap_or_default(), "Chargeguard"));
    }
    assert!(!named.is_empty());
    for name in &named {
        assert!(alerts.contains(name), "the dashboard names {name}, which alerts.yml does not define");
    }
}
