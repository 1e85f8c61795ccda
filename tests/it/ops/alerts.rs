//! deploy/prometheus/alerts.yml, the alerting rules operators load: promtool accepts them, their
//! unit tests (alerts.test.yml) pass, and a real `serve` exports every metric they read, so no
//! alert waits on a series that never exists (a misspelt name would make an alert that never
//! fires and never fails).

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use chargeguard::domain::review::ReviewKind;
use yaml_rust2::YamlLoader;

use super::process::{ServeProcess, command};
use crate::support::{TestDatabase, metrics_text};

const RULES_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/prometheus");
const RULES: &str = include_str!("../../../deploy/prometheus/alerts.yml");

fn promtool(arguments: &[&str]) {
    promtool_in(Path::new(RULES_DIR), arguments);
}

/// Runs promtool in `dir` and fails the test with what it printed unless it succeeded.
pub(super) fn promtool_in(dir: &Path, arguments: &[&str]) {
    let output = std::process::Command::new("promtool")
        .args(arguments)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|error| {
            panic!("promtool: {error} (it comes with Debian's prometheus package; .ci/run installs it)")
        });
    assert!(
        output.status.success(),
        "promtool {}:\n{}{}",
        arguments.join(" "),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn promtool_accepts_the_alert_rules_and_their_unit_tests_pass() {
    promtool(&["check", "rules", "alerts.yml"]);
    // The compose layout's Prometheus configuration, and the rule files it loads.
    promtool(&["check", "config", "prometheus.yml"]);
    promtool(&["test", "rules", "alerts.test.yml"]);
}

/// Every rule's expression.
fn rule_expressions() -> Vec<String> {
    let documents = YamlLoader::load_from_str(RULES).unwrap();
    let mut expressions = Vec::new();
    for group in documents[0]["groups"].as_vec().expect("groups") {
        for rule in group["rules"].as_vec().expect("rules") {
            expressions.push(rule["expr"].as_str().expect("every rule has an expr").to_owned());
        }
    }
    expressions
}

/// The words of `text` (letters, digits and `_`) that start with `prefix`.
pub(super) fn words_starting(text: &str, prefix: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|word| word.starts_with(prefix))
        .map(str::to_owned)
        .collect()
}

/// Every `chargeguard_…` metric name the rules' expressions read.
fn metrics_read_by_the_rules() -> BTreeSet<String> {
    rule_expressions().iter().flat_map(|expr| words_starting(expr, "chargeguard_")).collect()
}

/// A rule that leaves out a kind of review reason by a misspelt name would page twice for it:
/// every `reason` the rules match on is a label serve counts flagged attempts under.
#[test]
fn every_review_reason_the_rules_match_is_a_kind_serve_counts() {
    let kinds: BTreeSet<&str> = ReviewKind::ALL.iter().map(|kind| kind.label()).collect();
    let mut matched = 0;
    for expr in rule_expressions() {
        for (at, _) in expr.match_indices("reason") {
            let rest = expr[at + "reason".len()..].trim_start_matches(['!', '=', '~']);
            let Some(value) = rest.strip_prefix('"').and_then(|quoted| quoted.split('"').next()) else {
                continue;
            };
            for alternative in value.split('|') {
                assert!(kinds.contains(alternative), "{expr} matches reason {alternative:?}, not one of {kinds:?}");
                matched += 1;
            }
        }
    }
    assert!(matched >= 3, "the review alert leaves out the kinds that alert on their own");
}

#[tokio::test]
async fn serve_exports_every_metric_the_alert_rules_read() {
    let wanted = metrics_read_by_the_rules();
    assert!(wanted.len() >= 10, "{wanted:?}");
    let database = TestDatabase::create().await;
    let dir = tempfile::tempdir().unwrap();
    let mut serve = command(dir.path());
    serve
        .env("CHARGEGUARD_DATABASE__URL", &database.url)
        // The oldest-unfinished gauge is set by each sweep pass: one a second here.
        .env("CHARGEGUARD_SWEEP__SCHEDULE", "* * * * * *");
    let mut server = ServeProcess::start(serve, &[]);
    server.wait_ready().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = metrics_text(server.http_addr).await;
        let missing: Vec<&String> =
            wanted.iter().filter(|name| !text.contains(&format!("# TYPE {name} "))).collect();
        if missing.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "serve never exported {missing:?}:\n{text}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
