//! The README's quickstart, run as written: `serve` with nothing configured (embedded database,
//! built-in simulator, demo consumer) in an empty directory, then a charge and its duplicate
//! through the CLI client from the same directory.

use super::process::{ServeProcess, command};

const README: &str = include_str!("../../../README.md");
const CARGO_RUN: &str = "cargo run --release -- ";

/// The arguments of the command in the code block that follows `<!-- marker -->`.
pub fn readme_command(marker: &str) -> Vec<String> {
    let (_, after) = README
        .split_once(&format!("<!-- {marker} -->"))
        .unwrap_or_else(|| panic!("README has no {marker} marker"));
    let line = after
        .lines()
        .skip_while(|line| !line.starts_with("```"))
        .nth(1)
        .unwrap_or_else(|| panic!("no code block after {marker}"));
    let args = line
        .strip_prefix(CARGO_RUN)
        .unwrap_or_else(|| panic!("{marker}: expected `{CARGO_RUN}…`, got {line}"));
    assert!(
        !args.contains(['"', '\'', '\\', '$']),
        "keep quickstart commands free of shell syntax: {args}"
    );
    args.split_whitespace().map(str::to_owned).collect()
}

#[tokio::test]
async fn the_readme_quickstart_serves_on_embedded_defaults_and_charges_once() {
    let dir = tempfile::tempdir().unwrap();
    let serve_args = readme_command("quickstart-serve");
    assert_eq!(
        serve_args,
        ["serve"],
        "the quickstart starts the server with no configuration"
    );
    // Ports are the only thing the test changes: others may be using the defaults.
    let mut server = ServeProcess::start(command(dir.path()), &[]);
    server.wait_ready().await;
    let stderr = server.stderr();
    assert!(
        stderr.contains("built-in Stripe simulator"),
        "says so at start: {stderr}"
    );

    let charge_args = readme_command("quickstart-charge");
    assert_eq!(charge_args[0], "charge");
    let charged_on = chrono::Utc::now().date_naive();
    let server_flag = format!("http://{}", server.grpc_addr);
    let first = command(dir.path())
        .args(&charge_args)
        .args(["--server", &server_flag])
        .output()
        .await
        .unwrap();
    let table = String::from_utf8(first.stdout).unwrap();
    assert!(
        first.status.success(),
        "{}\n{table}",
        String::from_utf8_lossy(&first.stderr)
    );
    let row = |table: &str, key: &str| {
        table
            .lines()
            .find_map(|line| line.strip_prefix(key).map(|rest| rest.trim().to_owned()))
            .unwrap_or_default()
    };
    assert_eq!(row(&table, "outcome"), "applied", "{table}");
    assert_eq!(row(&table, "status"), "succeeded", "{table}");

    let again = command(dir.path())
        .args(&charge_args)
        .args(["--server", &server_flag])
        .output()
        .await
        .unwrap();
    let again_table = String::from_utf8(again.stdout).unwrap();
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert_eq!(row(&again_table, "outcome"), "duplicate", "{again_table}");
    assert_eq!(row(&again_table, "attempt_id"), row(&table, "attempt_id"));

    // The refund example: applied once, its redelivery a duplicate.
    let refund_args = readme_command("quickstart-refund");
    assert_eq!(refund_args[0], "refund");
    for expected in ["applied", "duplicate"] {
        let refund = command(dir.path())
            .args(&refund_args)
            .args(["--server", &server_flag])
            .output()
            .await
            .unwrap();
        let refund_table = String::from_utf8(refund.stdout).unwrap();
        assert!(refund.status.success(), "{}", String::from_utf8_lossy(&refund.stderr));
        assert_eq!(row(&refund_table, "outcome"), expected, "{refund_table}");
        assert_eq!(row(&refund_table, "kind"), "refund", "{refund_table}");
        assert_eq!(row(&refund_table, "refund_of"), row(&table, "attempt_id"), "{refund_table}");
        assert_eq!(row(&refund_table, "status"), "succeeded", "{refund_table}");
    }

    // Finance's report of the day, from the quickstart's own data: exit 0, the charge matched.
    let mut report_args = readme_command("quickstart-report");
    assert_eq!(report_args[0], "report");
    // Past midnight (UTC) since the charge, "today" is the next day: the period starts on the
    // day the charge was sent instead.
    if chrono::Utc::now().date_naive() != charged_on {
        let from = report_args.iter().position(|arg| arg == "--from").expect("the report names its period") + 1;
        report_args[from] = charged_on.to_string();
    }
    let report = command(dir.path()).args(&report_args).output().await.unwrap();
    let csv = String::from_utf8(report.stdout).unwrap();
    assert!(report.status.success(), "exit {:?}: {}\n{csv}", report.status.code(), String::from_utf8_lossy(&report.stderr));
    let charge_line = csv.lines().find(|line| line.contains(&row(&table, "attempt_id"))).unwrap_or_else(|| panic!("the charge is in the report:\n{csv}"));
    assert!(charge_line.contains("matched"), "{charge_line}");

    // The server's own /metrics counted both answers.
    let metrics = crate::support::metrics_text(server.http_addr).await;
    assert!(
        metrics.contains("chargeguard_charges_total{outcome=\"applied\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("chargeguard_charges_total{outcome=\"duplicate\"} 1"),
        "{metrics}"
    );
    for outcome in ["applied", "duplicate"] {
        let line = format!("chargeguard_refunds_total{{outcome=\"{outcome}\"}} 1");
        assert!(metrics.contains(&line), "{metrics}");
    }

    server.terminate();
    let exit = server.wait_exit().await;
    assert!(exit.success(), "{}", server.stderr());
    assert!(
        dir.path()
            .join("chargeguard-data/chargeguard.sqlite")
            .exists(),
        "the embedded database is a file in the working directory"
    );
    let token = std::fs::read_to_string(
        dir.path()
            .join(chargeguard::embedded::DEMO_TOKEN_FILE_DEFAULT),
    )
    .unwrap();
    assert!(
        !server.stderr().contains(token.trim()),
        "the demo token is never logged"
    );
}
