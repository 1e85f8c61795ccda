//! The CLI client (`chargeguard charge`, `attempt get`, `attempt list`) as a user runs it: the
//! built binary against a running server, tokens from the environment, tables and JSON out.

use std::process::Output;

use serde_json::Value;

use super::process::{command, free_addr};
use crate::support::{ORDERS_TOKEN, TestApp};

/// Runs the CLI with `CHARGEGUARD_TOKEN=token` against the app.
async fn cli(app: &TestApp, token: &str, args: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let mut command = command(dir.path());
    command
        .args(args)
        .args(["--server", &format!("http://{}", app.grpc_addr)])
        .env("CHARGEGUARD_TOKEN", token);
    command.output().await.unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8(output.stderr.clone()).unwrap()
}

fn json(output: &Output) -> Value {
    assert!(
        output.status.success(),
        "exit {}; stderr:\n{}",
        output.status,
        stderr(output)
    );
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|error| panic!("{error}: {}", stdout(output)))
}

const CHARGE: [&str; 12] = [
    "charge",
    "--operation",
    "order-cli:charge",
    "--amount",
    "2500",
    "--currency",
    "usd",
    "--payment-method",
    "pm_card_visa",
    "--metadata",
    "order=cli",
    "--json",
];

#[tokio::test]
async fn charge_and_duplicate_through_the_cli_then_get_and_list() {
    let app = TestApp::spawn().await;
    let first = json(&cli(&app, ORDERS_TOKEN, &CHARGE).await);
    assert_eq!(first["outcome"], "applied");
    assert_eq!(first["attempt"]["status"], "succeeded");
    assert_eq!(first["attempt"]["amount_minor"], 2500);
    assert_eq!(first["attempt"]["metadata"]["order"], "cli");
    let attempt_id = first["attempt"]["attempt_id"].as_str().unwrap().to_owned();

    let again = json(&cli(&app, ORDERS_TOKEN, &CHARGE).await);
    assert_eq!(again["outcome"], "duplicate");
    assert_eq!(again["attempt"]["attempt_id"], attempt_id.as_str());
    assert_eq!(
        app.sim().ledger().await.unwrap().payment_intents.len(),
        1,
        "charged once"
    );

    let by_operation = json(
        &cli(
            &app,
            ORDERS_TOKEN,
            &[
                "attempt",
                "get",
                "--operation",
                "order-cli:charge",
                "--json",
            ],
        )
        .await,
    );
    assert_eq!(by_operation["attempt_id"], attempt_id.as_str());
    let by_id = cli(&app, ORDERS_TOKEN, &["attempt", "get", "--id", &attempt_id]).await;
    assert!(by_id.status.success(), "{}", stderr(&by_id));
    let table = stdout(&by_id);
    assert!(
        table
            .lines()
            .any(|line| line.starts_with("status") && line.trim_end().ends_with("succeeded")),
        "{table}"
    );
    assert!(table.contains("order-cli:charge"), "{table}");

    let list = cli(
        &app,
        ORDERS_TOKEN,
        &["attempt", "list", "--status", "succeeded"],
    )
    .await;
    assert!(list.status.success(), "{}", stderr(&list));
    let table = stdout(&list);
    let mut lines = table.lines();
    assert!(lines.next().unwrap().starts_with("ATTEMPT ID"), "{table}");
    let row = lines.next().unwrap();
    assert!(
        row.contains(&attempt_id) && row.contains("succeeded") && row.contains("2500 usd"),
        "{table}"
    );
    let none = json(
        &cli(
            &app,
            ORDERS_TOKEN,
            &["attempt", "list", "--status", "failed", "--json"],
        )
        .await,
    );
    assert_eq!(none["attempts"], Value::Array(vec![]));
    let later = json(
        &cli(
            &app,
            ORDERS_TOKEN,
            &[
                "attempt",
                "list",
                "--from",
                "2999-01-01T00:00:00Z",
                "--json",
            ],
        )
        .await,
    );
    assert_eq!(
        later["attempts"],
        Value::Array(vec![]),
        "--from filters by creation time"
    );
    let window = [
        "attempt",
        "list",
        "--from",
        "2000-01-01T00:00:00Z",
        "--to",
        "2999-01-01T00:00:00Z",
        "--page-size",
        "1",
        "--json",
    ];
    let window = json(&cli(&app, ORDERS_TOKEN, &window).await);
    assert_eq!(window["attempts"][0]["attempt_id"], attempt_id.as_str());

    for output in [&by_id, &list] {
        assert!(
            !stdout(output).contains(ORDERS_TOKEN) && !stderr(output).contains(ORDERS_TOKEN),
            "the token is never echoed"
        );
    }
}

#[tokio::test]
async fn refusals_print_status_message_and_error_code_and_exit_non_zero() {
    let app = TestApp::spawn().await;
    json(&cli(&app, ORDERS_TOKEN, &CHARGE).await);
    let mut changed = CHARGE;
    changed[4] = "9999";
    let mismatch = cli(&app, ORDERS_TOKEN, &changed).await;
    assert_eq!(mismatch.status.code(), Some(1));
    let text = stderr(&mismatch);
    assert!(text.starts_with("error: FAILED_PRECONDITION: "), "{text}");
    assert!(
        text.contains("order-cli:charge") && text.contains("amount_minor"),
        "{text}"
    );
    assert!(
        text.contains("chargeguard-error-code: operation_mismatch"),
        "{text}"
    );
    assert!(text.contains("chargeguard-attempt-id: "), "{text}");
    assert!(stdout(&mismatch).is_empty());

    let wrong_token = "not-a-known-token-4711";
    let refused = cli(&app, wrong_token, &["attempt", "list"]).await;
    assert_eq!(refused.status.code(), Some(1));
    let text = stderr(&refused);
    assert!(
        text.contains("UNAUTHENTICATED")
            && text.contains("chargeguard-error-code: unauthenticated"),
        "{text}"
    );
    assert!(
        !text.contains(wrong_token),
        "the token is never echoed: {text}"
    );

    let invalid = cli(
        &app,
        ORDERS_TOKEN,
        &["attempt", "get", "--id", "not-a-uuid"],
    )
    .await;
    assert_eq!(invalid.status.code(), Some(1));
    assert!(
        stderr(&invalid).contains("INVALID_ARGUMENT"),
        "{}",
        stderr(&invalid)
    );
}

#[tokio::test]
async fn an_unreachable_server_is_a_retryable_failure() {
    let dir = tempfile::tempdir().unwrap();
    let output = command(dir.path())
        .args([
            "attempt",
            "list",
            "--server",
            &format!("http://{}", free_addr()),
        ])
        .env("CHARGEGUARD_TOKEN", ORDERS_TOKEN)
        .output()
        .await
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(75),
        "EX_TEMPFAIL; stderr:\n{}",
        stderr(&output)
    );
    assert!(
        stderr(&output).contains("cannot reach chargeguard"),
        "{}",
        stderr(&output)
    );
}

/// Runs the command with its stdout's read end closed at once (`… | head -0`), and checks that
/// it ended quietly: exit 0, no panic. The read end closes before the command has even started
/// its runtime, so its answer meets a broken pipe.
async fn runs_quietly_with_stdout_closed(mut command: tokio::process::Command) {
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let output = child.wait_with_output().await.unwrap();
    assert!(
        output.status.success(),
        "exit {}; stderr:\n{}",
        output.status,
        stderr(&output)
    );
    assert!(!stderr(&output).contains("panicked"), "{}", stderr(&output));
}

/// `chargeguard charge … | head -0`: the charge is made once and the CLI ends quietly rather
/// than panicking on the closed pipe.
#[tokio::test]
async fn a_reader_that_went_away_ends_the_cli_quietly_after_the_charge() {
    let app = TestApp::spawn().await;
    let dir = tempfile::tempdir().unwrap();
    let mut charge = command(dir.path());
    charge
        .args(&CHARGE[..CHARGE.len() - 1])
        .args(["--server", &format!("http://{}", app.grpc_addr)])
        .env("CHARGEGUARD_TOKEN", ORDERS_TOKEN);
    runs_quietly_with_stdout_closed(charge).await;
    assert_eq!(
        app.sim().ledger().await.unwrap().payment_intents.len(),
        1,
        "charged once"
    );
}

/// The same for a command that needs no server (`hash-token`; `migrate`, `sweep --once` and
/// `attempt recheck` write their answer the same way).
#[tokio::test]
async fn a_closed_pipe_ends_hash_token_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let mut hash = command(dir.path());
    hash.args(["hash-token", "a-token-of-some-length"]);
    runs_quietly_with_stdout_closed(hash).await;
}

#[tokio::test]
async fn without_a_token_the_cli_says_where_to_get_one() {
    let dir = tempfile::tempdir().unwrap();
    let output = command(dir.path())
        .args(["attempt", "list", "--server", "http://127.0.0.1:9"])
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("CHARGEGUARD_TOKEN"),
        "{}",
        stderr(&output)
    );
}

#[tokio::test]
async fn refund_through_the_cli_then_get_and_list_show_it() {
    let app = TestApp::spawn().await;
    let charge = json(&cli(&app, ORDERS_TOKEN, &CHARGE).await);
    let charge_id = charge["attempt"]["attempt_id"].as_str().unwrap().to_owned();
    let refund_args = [
        "refund",
        "--operation",
        "order-cli:refund-1",
        "--charge-operation",
        "order-cli:charge",
        "--amount",
        "1000",
        "--reason",
        "requested_by_customer",
        "--metadata",
        "return=cli",
        "--json",
    ];
    let refund = json(&cli(&app, ORDERS_TOKEN, &refund_args).await);
    assert_eq!(refund["outcome"], "applied");
    assert_eq!(refund["attempt"]["kind"], "refund");
    assert_eq!(refund["attempt"]["status"], "succeeded");
    assert_eq!(refund["attempt"]["parent_attempt_id"], charge_id.as_str());
    assert_eq!(refund["attempt"]["refund_reason"], "requested_by_customer");
    let again = json(&cli(&app, ORDERS_TOKEN, &refund_args).await);
    assert_eq!(again["outcome"], "duplicate");
    assert_eq!(app.sim().ledger().await.unwrap().refunds.len(), 1, "refunded once");

    let shown = json(&cli(&app, ORDERS_TOKEN, &["attempt", "get", "--id", &charge_id, "--json"]).await);
    assert_eq!((shown["refunded_minor"].as_i64(), shown["refund_pending_minor"].as_i64()), (Some(1000), Some(0)));
    let list = cli(&app, ORDERS_TOKEN, &["attempt", "list"]).await;
    let table = stdout(&list);
    let refund_row = table.lines().find(|line| line.contains("order-cli:refund-1")).expect("the refund is listed");
    assert!(refund_row.contains("refund") && refund_row.contains("1000 usd"), "{table}");
    let charge_row = table.lines().find(|line| line.contains(&charge_id)).unwrap();
    assert!(charge_row.contains("charge") && charge_row.contains("2500 usd  1000"), "{table}");

    let over = cli(&app, ORDERS_TOKEN, &["refund", "--operation", "order-cli:refund-2", "--charge-attempt", &charge_id, "--amount", "1501"]).await;
    assert_eq!(over.status.code(), Some(1));
    assert!(stderr(&over).contains("refund_exceeds_charge") && stderr(&over).contains("1500"), "{}", stderr(&over));
    let neither = cli(&app, ORDERS_TOKEN, &["refund", "--operation", "order-cli:refund-3"]).await;
    assert_eq!(neither.status.code(), Some(2), "one of --charge-operation and --charge-attempt is required");
}

#[tokio::test]
async fn a_second_attempt_through_the_cli_and_the_attempts_of_an_operation() {
    let app = TestApp::spawn().await;
    let charge = |payment_method: &'static str, attempt: &'static str| {
        [
            "charge", "--operation", "order-cli-again", "--amount", "900", "--currency", "usd",
            "--payment-method", payment_method, "--attempt", attempt, "--json",
        ]
    };
    let first = json(&cli(&app, ORDERS_TOKEN, &charge("pm_card_chargeDeclined", "1")).await);
    assert_eq!(first["attempt"]["status"], "failed");
    assert_eq!(first["attempt"]["attempt_number"], 1);
    let second = json(&cli(&app, ORDERS_TOKEN, &charge("pm_card_visa", "2")).await);
    assert_eq!(second["attempt"]["status"], "succeeded");
    assert_eq!(second["attempt"]["attempt_number"], 2);
    let refused = cli(&app, ORDERS_TOKEN, &charge("pm_card_visa", "3")).await;
    assert!(!refused.status.success());
    assert!(stderr(&refused).contains("operation_already_succeeded"), "{}", stderr(&refused));

    let listed = cli(&app, ORDERS_TOKEN, &["attempt", "list", "--operation", "order-cli-again"]).await;
    assert!(listed.status.success(), "{}", stderr(&listed));
    let table = stdout(&listed);
    let mut lines = table.lines();
    assert!(lines.next().unwrap().contains("ATTEMPT"), "{table}");
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), 2, "{table}");
    assert!(rows.iter().any(|row| row.contains("failed")) && rows.iter().any(|row| row.contains("succeeded")), "{table}");
    let charges = json(&cli(&app, ORDERS_TOKEN, &["attempt", "list", "--kind", "refund", "--json"]).await);
    assert_eq!(charges["attempts"], Value::Array(vec![]));
    let latest = cli(&app, ORDERS_TOKEN, &["attempt", "get", "--operation", "order-cli-again"]).await;
    let table = stdout(&latest);
    assert!(
        table.lines().any(|line| line.starts_with("attempt_number") && line.trim_end().ends_with('2')),
        "{table}"
    );
}
