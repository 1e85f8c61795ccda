//! `chargeguard bench` as bench/run.sh uses it: the real binary against the real service. The
//! counts it reports must agree with each other, with the table and with the provider's ledger
//! (nothing here asserts on timings).

use std::process::Output;

use serde_json::Value;

use crate::support::health::wait_until_serving;
use crate::support::{ORDERS_TOKEN, SIM_API_KEY, TestApp};

/// Runs the built binary with `args` and fails the test unless it exited 0.
async fn chargeguard(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let output = run_chargeguard(args, envs).await;
    assert!(
        output.status.success(),
        "chargeguard {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// Runs the built binary with `args`, whatever its exit status.
async fn run_chargeguard(args: &[&str], envs: &[(&str, &str)]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_chargeguard"))
        .args(args)
        .envs(envs.iter().copied())
        .env("RUST_LOG", "warn")
        .output()
        .await
        .expect("chargeguard runs")
}

/// The body of the tagged JSON line the bench printed (also written to its --json-out file).
fn report(json_file: &std::path::Path, tag: &str) -> Value {
    let text = std::fs::read_to_string(json_file).expect("the bench wrote its report");
    let mut value: Value = serde_json::from_str(&text).expect("the report is one JSON object");
    value[tag].take()
}

fn count(value: &Value, field: &str) -> u64 {
    value[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in {value}"))
}

#[tokio::test]
async fn bench_charge_counts_agree_with_the_table_and_the_provider() {
    let app = TestApp::spawn().await;
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("charge.json");
    let endpoint = format!("http://{}", app.grpc_addr);
    let output = chargeguard(
        &[
            "bench",
            "charge",
            "--endpoint",
            &endpoint,
            "--label",
            "it",
            "--requests",
            "40",
            "--concurrency",
            "4",
            "--connections",
            "2",
            "--duplicate-percent",
            "50",
            "--prime-keys",
            "6",
            "--json-out",
            json.to_str().unwrap(),
        ],
        &[("CHARGEGUARD_BENCH_TOKEN", ORDERS_TOKEN)],
    )
    .await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("bench it: 4 callers on 2 connections"),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .last()
            .unwrap()
            .starts_with("{\"chargeguard_bench\":"),
        "{stdout}"
    );

    let report = report(&json, "chargeguard_bench");
    assert_eq!(count(&report, "requests"), 40, "{report}");
    assert_eq!(count(&report, "ok"), 40, "{report}");
    assert_eq!(count(&report, "errors"), 0, "{report}");
    assert_eq!(count(&report, "primed_keys"), 6, "{report}");
    let new = count(&report, "sent_new");
    let duplicates = count(&report, "sent_duplicate");
    assert_eq!(new + duplicates, 40, "{report}");
    assert!(
        duplicates > 0 && new > 0,
        "a 50 % mix over 40 calls sends both kinds: {report}"
    );
    assert_eq!(
        report["outcomes"]["applied"].as_u64().unwrap_or(0),
        new,
        "{report}"
    );
    assert_eq!(
        report["outcomes"]["duplicate"].as_u64().unwrap_or(0),
        duplicates,
        "{report}"
    );
    assert!(
        report["latency_ms"]["p99"].as_f64().unwrap() > 0.0,
        "{report}"
    );

    // One row and one charge at the provider per new operation; duplicates add neither.
    let operations = 6 + new;
    assert_eq!(app.attempt_rows().await, operations as i64);
    assert_eq!(
        app.sim().ledger().await.unwrap().payment_intents.len() as u64,
        operations
    );
}

#[tokio::test]
async fn bench_seed_and_claim_take_every_stuck_row_once() {
    let app = TestApp::spawn().await;
    let dir = tempfile::tempdir().unwrap();
    let database = [("CHARGEGUARD_DATABASE__URL", app.database.url.as_str())];
    let seed_json = dir.path().join("seed.json");
    chargeguard(
        &[
            "bench",
            "seed",
            "--settled",
            "300",
            "--stuck",
            "25",
            "--json-out",
            seed_json.to_str().unwrap(),
        ],
        &database,
    )
    .await;
    let seeded = report(&seed_json, "chargeguard_bench_seed");
    assert_eq!(count(&seeded, "seeded_rows"), 325, "{seeded}");
    assert_eq!(count(&seeded, "due_now"), 25, "{seeded}");

    let claim_json = dir.path().join("claim.json");
    chargeguard(
        &[
            "bench",
            "claim",
            "--batch-max",
            "10",
            "--json-out",
            claim_json.to_str().unwrap(),
        ],
        &database,
    )
    .await;
    let claimed = report(&claim_json, "chargeguard_bench_claim");
    assert_eq!(count(&claimed, "rows_claimed"), 25, "{claimed}");
    assert_eq!(count(&claimed, "batches"), 3, "{claimed}");

    // Settling ends the leased rows, and the next seeding continues the numbering.
    chargeguard(
        &[
            "bench",
            "seed",
            "--settle-unfinished",
            "--stuck",
            "5",
            "--json-out",
            seed_json.to_str().unwrap(),
        ],
        &database,
    )
    .await;
    let again = report(&seed_json, "chargeguard_bench_seed");
    assert_eq!(count(&again, "unfinished_settled"), 25, "{again}");
    assert_eq!(count(&again, "seeded_rows"), 330, "{again}");
    assert_eq!(count(&again, "due_now"), 5, "{again}");
    assert_eq!(app.attempt_rows().await, 330);
}

/// `chargeguard bench … | head`: once the reader is gone, the run still ends well and still
/// writes its report file (the report to stdout is the only thing lost).
#[tokio::test]
async fn a_bench_whose_reader_went_away_ends_quietly_and_still_writes_its_file() {
    let app = TestApp::spawn().await;
    let dir = tempfile::tempdir().unwrap();
    let seed_json = dir.path().join("seed.json");
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_chargeguard"))
        .args(["bench", "seed", "--settled", "10", "--json-out", seed_json.to_str().unwrap()])
        .env("CHARGEGUARD_DATABASE__URL", &app.database.url)
        .env("RUST_LOG", "warn")
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("chargeguard runs");
    let output = child.wait_with_output().await.unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{:?}: {stderr}", output.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
    let seeded = report(&seed_json, "chargeguard_bench_seed");
    assert_eq!(count(&seeded, "seeded_rows"), 10, "{seeded}");
}

#[tokio::test]
async fn bench_health_check_and_provider_runs_call_only_their_target() {
    let app = TestApp::spawn().await;
    let dir = tempfile::tempdir().unwrap();
    let endpoint = format!("http://{}", app.grpc_addr);

    wait_until_serving(app.grpc_addr).await;
    // Health checks: answered SERVING, and neither the table nor the provider sees a call.
    let health_json = dir.path().join("health.json");
    chargeguard(
        &["bench", "charge", "--endpoint", &endpoint, "--health-check", "--requests", "30",
          "--concurrency", "3", "--connections", "1", "--json-out", health_json.to_str().unwrap()],
        &[("CHARGEGUARD_BENCH_TOKEN", ORDERS_TOKEN)],
    )
    .await;
    let health = report(&health_json, "chargeguard_bench");
    assert_eq!(count(&health, "ok"), 30, "{health}");
    assert_eq!(health["outcomes"]["serving"].as_u64(), Some(30), "{health}");
    assert_eq!(app.attempt_rows().await, 0);

    // Creates straight at the simulator: one payment intent each, and no attempt row.
    let provider_json = dir.path().join("provider.json");
    chargeguard(
        &["bench", "charge", "--provider-url", &app.simulator.base_url(), "--requests", "25",
          "--concurrency", "5", "--connections", "1", "--json-out", provider_json.to_str().unwrap()],
        &[("CHARGEGUARD_BENCH_PROVIDER_API_KEY", SIM_API_KEY)],
    )
    .await;
    let provider = report(&provider_json, "chargeguard_bench");
    assert_eq!(provider["outcomes"]["created"].as_u64(), Some(25), "{provider}");
    assert_eq!(app.sim().ledger().await.unwrap().payment_intents.len(), 25);
    assert_eq!(app.attempt_rows().await, 0);
}

/// A run whose every call failed (here: a token the service does not know) still writes its
/// report, and exits non-zero saying so, so that no script reads its rate as a figure of charges.
#[tokio::test]
async fn bench_charge_fails_when_every_call_failed() {
    let app = TestApp::spawn().await;
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("failed.json");
    let endpoint = format!("http://{}", app.grpc_addr);
    let output = run_chargeguard(
        &["bench", "charge", "--endpoint", &endpoint, "--requests", "12", "--concurrency", "3",
          "--connections", "1", "--json-out", json.to_str().unwrap()],
        &[("CHARGEGUARD_BENCH_TOKEN", "not-a-token-of-this-service")],
    )
    .await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "a run of failures must not exit 0: {stderr}");
    assert!(stderr.contains("every one of the 12 calls failed"), "{stderr}");
    let failed = report(&json, "chargeguard_bench");
    assert_eq!(count(&failed, "requests"), 12, "{failed}");
    assert_eq!(count(&failed, "ok"), 0, "{failed}");
    let outcomes = failed["outcomes"].as_object().unwrap();
    assert!(outcomes.keys().all(|outcome| outcome.starts_with("error:unauthenticated/")), "{failed}");
    assert_eq!(app.attempt_rows().await, 0);
    assert!(app.sim().ledger().await.unwrap().payment_intents.is_empty());
}

/// The benchmark scripts load the machine and start their processes on fixed ports: one at a
/// time, so that neither's calls time out under the other's load.
static BENCHMARK_SCRIPTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs a benchmark script in its short form (rows of 2 s after 1 s of warm-up) with this build,
/// its files in `out`, alone; fails the test unless it exited 0, and returns what it printed.
async fn benchmark_script(script: &str, args: &[&str], out: &std::path::Path, envs: &[(&str, &str)]) -> String {
    let _alone = BENCHMARK_SCRIPTS.lock().await;
    let output = tokio::process::Command::new("bash")
        .arg(script)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("BENCH_BIN", env!("CARGO_BIN_EXE_chargeguard"))
        .env("BENCH_OUT", out)
        .env("BENCH_SECONDS", "2")
        .env("BENCH_WARMUP_SECONDS", "1")
        .envs(envs.iter().copied())
        .output()
        .await
        .expect("bash runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{script} failed:\n{stdout}\n{stderr}");
    stdout
}

/// `bench/latency.sh` (the p99 row alone, and where the service's added time goes) in a short
/// form with this build: both load rows answer every call, and it prints each stage's means and
/// quantiles, so the script issue 21's p99 is read with is checked on every change. Ignored in
/// the suite for its load, as the script below.
#[tokio::test]
#[ignore = "the benchmark's short form: the README's test command runs it after the suite"]
async fn the_latency_script_prints_every_stage_in_its_short_form() {
    let out = tempfile::tempdir().unwrap();
    let stdout = benchmark_script("bench/latency.sh", &[], out.path(), &[("BENCH_TABLE_ROWS", "1000")]).await;
    for row in ["service", "provider"] {
        let report = report(&out.path().join(format!("{row}.json")), "chargeguard_bench");
        assert!(count(&report, "ok") > 0, "{row}: {report}");
        assert_eq!(count(&report, "errors"), 0, "{row}: {report}");
    }
    for stage in [
        "wait_seconds:insert",
        "wait_seconds:finish",
        "provider_round_seconds:create",
        "request_seconds:Payments/Charge",
        "group_commit_wait_seconds",
        "provider_round_seconds",
    ] {
        assert!(stdout.contains(stage), "the stage {stage} is printed:\n{stdout}");
    }
}

/// The benchmark script's short form with this build (`BENCH_SCALE=small BENCH_BIN=…
/// bash bench/run.sh`, rows of 2 s, two rounds of the side by side): every row runs, no call
/// fails, and the summary holds each of its tables and reads issue 21's targets from the
/// rounds' medians, so the script that measures the targets is checked on every change. Its load
/// would slow the tests beside it: ignored in the suite, the README's test command runs it
/// after the rest. Figures are not asserted (they are the benchmark's, by hand).
#[tokio::test]
#[ignore = "the benchmark's short form: the README's test command runs it after the suite"]
async fn the_benchmark_script_runs_every_row_in_its_short_form() {
    let out = tempfile::tempdir().unwrap();
    benchmark_script("bench/run.sh", &[], out.path(), &[("BENCH_SCALE", "small"), ("BENCH_SIDE_BY_SIDE_ROUNDS", "2")]).await;

    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("summary.json")).unwrap()).unwrap();
    for row in ["service_new", "service_duplicate", "service_duplicate_uncached", "service_new_latency"] {
        assert!(count(&summary[row], "ok") > 0, "{row}: {}", summary[row]);
        assert_eq!(count(&summary[row], "errors"), 0, "{row}: {}", summary[row]);
    }
    for concurrency in ["16", "64"] {
        let side_by_side = &summary["group_commit"][concurrency];
        assert!(side_by_side["pgbench_tps"].as_f64().is_some_and(|tps| tps > 0.0), "{side_by_side}");
        for switch in ["on", "off"] {
            assert_eq!(count(&side_by_side[switch], "errors"), 0, "{concurrency} {switch}: {side_by_side}");
            let cpu = &side_by_side[switch]["cpu_us"];
            assert!(cpu["wal_bytes"].as_f64().is_some_and(|bytes| bytes > 0.0), "the WAL each row wrote: {cpu}");
        }
        let rounds = side_by_side["rounds"].as_array().expect("the interleaved rounds");
        assert_eq!(rounds.len(), 2, "{side_by_side}");
        assert!(rounds.iter().all(|round| round["errors"].as_u64() == Some(0)), "{rounds:?}");
        assert!(side_by_side["ratio_to_pgbench_median"].as_f64().is_some(), "{side_by_side}");
    }
    let latency_rounds = summary["group_commit"]["latency_on_rounds"].as_array().expect("the p99 of each round");
    assert_eq!(latency_rounds.len(), 2, "{latency_rounds:?}");
    let group_commit_checks = summary["group_commit"]["checks"].as_array().unwrap();
    assert_eq!(group_commit_checks.len(), 3, "issue 21's targets, each from the rounds: {group_commit_checks:?}");
    assert!(
        group_commit_checks.iter().all(|check| check["target"].as_str().unwrap().contains("median of the rounds")),
        "{group_commit_checks:?}"
    );
    for size in ["small", "large"] {
        assert!(summary["sweep"][size].is_object(), "the sweep over the {size} table: {}", summary["sweep"]);
    }
    let checks = summary["checks"].as_array().unwrap();
    assert_eq!(checks.len(), 6, "every target measured: {checks:?}");
}

/// `bench/compare.sh` (two builds, or one build with two settings, interleaved round by round)
/// in a short form with this build on both sides, group commit on in A and off in B: both sides
/// and pgbench run, no call fails, each side gets its own settings (only A's statements are
/// batched) and the medians and B / A are printed, so the script the levers of issue 21 were
/// measured with is checked on every change. Ignored in the suite for its load.
#[tokio::test]
#[ignore = "the benchmark's short form: the README's test command runs it after the suite"]
async fn the_compare_script_runs_both_sides_with_their_own_settings_in_its_short_form() {
    let out = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_chargeguard");
    let stdout = benchmark_script(
        "bench/compare.sh",
        &[],
        out.path(),
        &[
            ("BENCH_BIN_A", bin),
            ("BENCH_ENV_B", "CHARGEGUARD_DATABASE__GROUP_COMMIT__ENABLED=false"),
            ("BENCH_ROUNDS", "1"),
            ("BENCH_TABLE_ROWS", "1000"),
        ],
    )
    .await;
    let runs: Vec<Value> = std::fs::read_to_string(out.path().join("runs.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let build = |label: &str| -> Value {
        runs.iter().find(|run| run["build"] == label).unwrap_or_else(|| panic!("a run of {label}: {runs:?}")).clone()
    };
    assert_eq!(runs.len(), 3, "A, B and pgbench, one round: {runs:?}");
    assert!(build("pgbench")["transactions"].as_u64().is_some_and(|count| count > 0), "{runs:?}");
    for side in ["a-chargeguard", "b-chargeguard"] {
        let charge = &build(side)["charge"]["chargeguard_bench"];
        assert!(count(charge, "ok") > 0, "{side}: {charge}");
        assert_eq!(count(charge, "errors"), 0, "{side}: {charge}");
    }
    let stages = |side: &str| build(side)["stages"].clone();
    let batched = |side: &str| stages(side).as_object().unwrap().keys().any(|stage| stage.starts_with("batch_rows:"));
    assert!(batched("a-chargeguard"), "A runs with group commit on: {}", stages("a-chargeguard"));
    assert!(!batched("b-chargeguard"), "B's own setting (group commit off) reached its service: {}", stages("b-chargeguard"));
    assert!(stdout.contains("medians") && stdout.contains("B / A"), "{stdout}");
}

/// `bench/fresh_database.sh` (new charges on a database ANALYZE never saw, and how the table was
/// read meanwhile) in a short form with this build: its row is printed with the charges it wrote
/// and the index fetches that read them. Ignored in the suite for its load.
#[tokio::test]
#[ignore = "the benchmark's short form: the README's test command runs it after the suite"]
async fn the_fresh_database_script_prints_how_the_table_was_read_in_its_short_form() {
    let out = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_chargeguard");
    let stdout = benchmark_script("bench/fresh_database.sh", &[bin], out.path(), &[("BENCH_ROUNDS", "1")]).await;
    let row: Vec<&str> = stdout
        .lines()
        .find(|line| line.starts_with(bin))
        .unwrap_or_else(|| panic!("a row for {bin}:\n{stdout}"))
        .split_whitespace()
        .collect();
    // binary, round, charges/s, seq scans, rows they read, fetched by index, rows written
    assert_eq!(row.len(), 7, "{row:?}");
    let number = |column: usize| row[column].parse::<u64>().unwrap_or_else(|_| panic!("column {column}: {row:?}"));
    assert!(number(2) > 0, "charges/s: {row:?}");
    assert!(number(6) > 0, "rows written: {row:?}");
    assert!(number(5) > 0, "rows fetched by index (each finish finds its row by id): {row:?}");
}
