//! Reconciliation reports (issue 6) against the simulator and a real database: discrepancies
//! of every category seeded through the simulator's controls and direct table writes, the
//! `chargeguard report` binary's formats and exit codes, and the `Reports` gRPC stream. Every
//! test runs on both stores (`reports::postgres::…`, `reports::sqlite::…`), and the binary on a
//! first run's embedded store with nothing but the period.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chargeguard::config::{OperatorConfig, OperatorRole};
use chargeguard::grpc::hash_token;
use chargeguard::grpc::proto::reconciliation_chunk::Item;
use chargeguard::grpc::proto::reports_client::ReportsClient;
use chargeguard::grpc::proto::{ReconciliationRequest, ReconciliationRow, ReconciliationSummary};
use chargeguard::simulator::{
    Endpoint, FaultKind, FaultSpec, ForcePaymentIntent, SeedPaymentIntent,
};
use chrono::{DateTime, Utc};
use serde_json::Value;
use tonic::Code;

use crate::ops::process::{ServeProcess, command};
use crate::support::{
    Backend, ORDERS_TOKEN, SIM_API_KEY, TestApp, authed, charge_request, on_both_backends,
};

const FINANCE_TOKEN: &str = "finance-token-0123456789";
const ADMIN_TOKEN: &str = "admin-token-0123456789";

pub(crate) async fn spawn_app_on(backend: Backend) -> TestApp {
    TestApp::spawn_backend_with(backend, |config| {
        config.operators = vec![
            OperatorConfig {
                name: "finance".into(),
                token_sha256: hash_token(FINANCE_TOKEN).into(),
                role: OperatorRole::Finance,
            },
            OperatorConfig {
                name: "admin".into(),
                token_sha256: hash_token(ADMIN_TOKEN).into(),
                role: OperatorRole::Admin,
            },
        ];
    })
    .await
}

/// The test's period: six hours back (room for a stale attempt) to one hour ahead.
fn period() -> (DateTime<Utc>, DateTime<Utc>) {
    let now = Utc::now();
    (
        now - chrono::Duration::hours(6),
        now + chrono::Duration::hours(1),
    )
}

struct CliRun {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs the real binary against the test's database and simulator. `extra` are more
/// `CHARGEGUARD_…` variables (small pages, to cross page and window boundaries).
async fn run_cli(app: &TestApp, args: &[&str], extra: &[(&str, &str)]) -> CliRun {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_chargeguard"));
    command
        .arg("report")
        .args(args)
        .env("CHARGEGUARD_DATABASE__URL", &app.database.url)
        .env("CHARGEGUARD_PROVIDER__API_KEY", SIM_API_KEY)
        .env("CHARGEGUARD_PROVIDER__BASE_URL", app.simulator.base_url())
        .env("RUST_LOG", "warn")
        .envs(extra.iter().copied())
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(120), command.output())
        .await
        .expect("report finishes")
        .unwrap();
    CliRun {
        code: output.status.code().expect("exited, not killed"),
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
    }
}

fn period_args(from: DateTime<Utc>, to: DateTime<Utc>) -> [String; 4] {
    [
        "--from".into(),
        from.to_rfc3339(),
        "--to".into(),
        to.to_rfc3339(),
    ]
}

pub(crate) async fn run_json(app: &TestApp, extra: &[(&str, &str)]) -> (i32, Value) {
    let (from, to) = period();
    let mut args: Vec<String> = period_args(from, to).into();
    args.extend(["--format".into(), "json".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = run_cli(app, &args, extra).await;
    assert!(
        run.code == 0 || run.code == 1,
        "exit {}: {}",
        run.code,
        run.stderr
    );
    let report: Value =
        serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("{e}: {}", run.stdout));
    (run.code, report)
}

/// Runs one statement on the app's store, as an operator would.
pub(crate) async fn sql(app: &TestApp, statement: &str) {
    app.database.execute(statement).await;
}

/// The few expressions seeding statements need, spelled for the app's store: PostgreSQL's
/// `uuid` and `timestamptz`, SQLite's 16-byte blobs and integer microseconds.
pub(crate) struct Dialect(Backend);

impl Dialect {
    pub(crate) fn of(app: &TestApp) -> Self {
        Self(app.database.backend)
    }

    /// An attempt id as a literal of the id column's type.
    pub(crate) fn id(&self, uuid: &str) -> String {
        match self.0 {
            Backend::Postgres => format!("'{uuid}'::uuid"),
            Backend::Sqlite => format!("X'{}'", uuid.replace('-', "")),
        }
    }

    pub(crate) fn new_id(&self) -> &'static str {
        match self.0 {
            Backend::Postgres => "gen_random_uuid()",
            Backend::Sqlite => "randomblob(16)",
        }
    }

    pub(crate) fn now(&self) -> &'static str {
        match self.0 {
            Backend::Postgres => "now()",
            Backend::Sqlite => "CAST(unixepoch('subsec') * 1000000 AS INTEGER)",
        }
    }

    pub(crate) fn hours_ago(&self, hours: u32) -> String {
        match self.0 {
            Backend::Postgres => format!("now() - interval '{hours} hours'"),
            Backend::Sqlite => format!("({} - {hours} * 3600000000)", self.now()),
        }
    }
}

/// A count the database makes, on either store.
async fn count(app: &TestApp, query: &str) -> i64 {
    use sqlx::Connection;
    match app.database.sqlite_path() {
        None => {
            let mut connection = sqlx::PgConnection::connect(&app.database.url).await.unwrap();
            sqlx::query_scalar(query).fetch_one(&mut connection).await.unwrap()
        }
        Some(path) => {
            let options = sqlx::sqlite::SqliteConnectOptions::new().filename(path);
            let mut connection = sqlx::SqliteConnection::connect_with(&options).await.unwrap();
            sqlx::query_scalar(query).fetch_one(&mut connection).await.unwrap()
        }
    }
}

/// Charges `operation_key` as `orders`; returns (attempt id, provider payment id).
pub(crate) async fn charge(app: &TestApp, operation_key: &str, payment_method: &str) -> (String, String) {
    let mut request = charge_request(operation_key);
    request.payment_method = payment_method.into();
    let attempt = app.charge(request).await.unwrap().attempt.unwrap();
    (attempt.attempt_id, attempt.provider_payment_id)
}

/// A charge whose create is lost before the provider applies it: a pending attempt with no
/// provider object. Returns its attempt id.
async fn pending_charge(app: &TestApp, operation_key: &str) -> String {
    app.sim()
        .set_fault(
            Endpoint::CreatePaymentIntent,
            FaultSpec::next(FaultKind::FailBeforeApply, 1),
        )
        .await
        .unwrap();
    let error = app.charge(charge_request(operation_key)).await.unwrap_err();
    assert_eq!(error.code(), Code::Unavailable);
    app.attempt_of(operation_key).await.attempt_id
}

pub(crate) async fn refund(app: &TestApp, payment_intent: &str, amount_minor: i64) {
    let amount = amount_minor.to_string();
    post_to_simulator(
        app,
        "v1/refunds",
        &[("payment_intent", payment_intent), ("amount", &amount)],
    )
    .await;
}

/// A `/v1` POST to the simulator as any Stripe client sends it; it must succeed.
async fn post_to_simulator(app: &TestApp, path: &str, form: &[(&str, &str)]) {
    let response = reqwest::Client::new()
        .post(format!("{}{path}", app.simulator.base_url()))
        .bearer_auth(SIM_API_KEY)
        .form(form)
        .send()
        .await
        .unwrap();
    assert!(
        response.status().is_success(),
        "{}",
        response.text().await.unwrap()
    );
}

fn seed(amount: i64, status: &str, metadata: BTreeMap<String, String>) -> SeedPaymentIntent {
    SeedPaymentIntent {
        amount,
        currency: "usd".into(),
        status: status.into(),
        metadata,
        created: None,
    }
}

/// What `seed_every_category` made: the category each operation key (or orphan object id)
/// must land in.
struct Seeded {
    expected: BTreeMap<String, &'static str>,
}

/// One or more rows of every category.
async fn seed_every_category(app: &TestApp) -> Seeded {
    let mut expected = BTreeMap::new();
    let sim = app.sim();
    let dialect = Dialect::of(app);

    // Refunded straight at the provider, not through chargeguard: a refund no attempt claims.
    let (_, refunded_intent) = charge(app, "refunded-outside-1", "pm_card_visa").await;
    expected.insert("refunded-outside-1".to_owned(), "orphan_refund");
    refund(app, &refunded_intent, 300).await;
    charge(app, "declined-1", "pm_card_chargeDeclined").await;
    expected.insert("declined-1".to_owned(), "matched");
    // Printable ASCII is a valid operation key: the HTML must show it, escaped.
    charge(app, "order-<script>alert(1)</script>", "pm_card_visa").await;
    expected.insert("order-<script>alert(1)</script>".to_owned(), "matched");

    let (_, amount_intent) = charge(app, "amount-1", "pm_card_visa").await;
    sim.force_payment_intent(
        &amount_intent,
        ForcePaymentIntent {
            amount: Some(1_500),
            status: None,
        },
    )
    .await
    .unwrap();
    expected.insert("amount-1".to_owned(), "amount_mismatch");
    let (currency_attempt, _) = charge(app, "currency-1", "pm_card_visa").await;
    sql(
        app,
        &format!(
            "UPDATE payment_attempts SET currency = 'eur' WHERE id = {}",
            dialect.id(&currency_attempt)
        ),
    )
    .await;
    expected.insert("currency-1".to_owned(), "amount_mismatch");

    // We recorded a decline; the provider holds the money.
    let (_, status_intent) = charge(app, "status-1", "pm_card_chargeDeclined").await;
    sim.force_payment_intent(
        &status_intent,
        ForcePaymentIntent {
            amount: None,
            status: Some("succeeded".into()),
        },
    )
    .await
    .unwrap();
    expected.insert("status-1".to_owned(), "status_mismatch");

    let orphan = sim
        .seed_payment_intent(seed(700, "succeeded", BTreeMap::new()))
        .await
        .unwrap();
    expected.insert(orphan.id, "orphan");
    // Metadata naming an attempt this database never had is an orphan too.
    let claimed = BTreeMap::from([(
        "chargeguard_attempt_id".to_owned(),
        uuid::Uuid::new_v4().to_string(),
    )]);
    let foreign = sim
        .seed_payment_intent(seed(800, "succeeded", claimed))
        .await
        .unwrap();
    expected.insert(foreign.id, "orphan");

    let now = dialect.now();
    sql(
        app,
        &format!(
            "INSERT INTO payment_attempts (id, consumer, operation_key, kind, amount_minor,
                 currency, payment_method, fingerprint, status, provider, provider_payment_id,
                 idempotency_key, key_window_started_at, next_check_at, created_at, updated_at)
             VALUES ({}, 'orders', 'missing-1', 'charge', 2500, 'usd', 'pm_card_visa', 'seeded',
                 'succeeded', 'stripe', 'pi_never_existed', 'seeded-missing-1', {now}, {now},
                 {now}, {now})",
            dialect.new_id()
        ),
    )
    .await;
    expected.insert("missing-1".to_owned(), "missing_at_provider");

    let (double_attempt, _) = charge(app, "double-1", "pm_card_visa").await;
    let second = BTreeMap::from([("chargeguard_attempt_id".to_owned(), double_attempt)]);
    sim.seed_payment_intent(seed(1_000, "succeeded", second))
        .await
        .unwrap();
    expected.insert("double-1".to_owned(), "double_charge");

    let stale = pending_charge(app, "stale-1").await;
    sql(
        app,
        &format!(
            "UPDATE payment_attempts SET created_at = {} WHERE id = {}",
            dialect.hours_ago(3),
            dialect.id(&stale)
        ),
    )
    .await;
    expected.insert("stale-1".to_owned(), "stale_unfinished");

    let expired = pending_charge(app, "expired-1").await;
    sql(
        app,
        &format!(
            "UPDATE payment_attempts SET status = 'failed', failure_code = 'expired',
                 failure_message = 'seeded'
             WHERE id = {}",
            dialect.id(&expired)
        ),
    )
    .await;
    expected.insert("expired-1".to_owned(), "expired");

    pending_charge(app, "inflight-1").await;
    expected.insert("inflight-1".to_owned(), "in_progress");
    Seeded { expected }
}

/// A row's key: the operation key, or the provider object id of an orphan.
fn json_row_key(row: &Value) -> String {
    match row["attempt"].as_object() {
        Some(attempt) => attempt["operation_key"].as_str().unwrap().to_owned(),
        None => row["provider_objects"][0]["id"]
            .as_str()
            .unwrap()
            .to_owned(),
    }
}

pub(crate) fn json_categories(report: &Value) -> BTreeMap<String, String> {
    report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            (
                json_row_key(row),
                row["category"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

pub(crate) fn summary_count(report: &Value, category: &str) -> u64 {
    report["summary"]["categories"]
        .as_array()
        .unwrap()
        .iter()
        .find(|entry| entry["category"] == category)
        .unwrap()["rows"]
        .as_u64()
        .unwrap()
}

async fn every_seeded_discrepancy_lands_in_its_category_and_the_totals_add_up(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let seeded = seed_every_category(&app).await;
    // Pages of two rows and provider pages of two objects in ten-minute windows: the run
    // crosses every page and window boundary the defaults would hide.
    let small = [
        ("CHARGEGUARD_REPORT__ROWS_PAGE_SIZE", "2"),
        ("CHARGEGUARD_REPORT__PROVIDER_PAGE_SIZE", "2"),
        ("CHARGEGUARD_REPORT__PROVIDER_WINDOW_MINUTES", "10"),
    ];
    let (code, report) = run_json(&app, &small).await;
    assert_eq!(code, 1, "discrepancies exit 1");

    let categories = json_categories(&report);
    let expected: BTreeMap<String, String> = seeded
        .expected
        .iter()
        .map(|(key, category)| (key.clone(), category.to_string()))
        .collect();
    assert_eq!(categories, expected);

    let summary = &report["summary"];
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(summary["rows"].as_u64().unwrap(), rows.len() as u64);
    assert_eq!(summary["clean"], false);
    for category in [
        "matched",
        "amount_mismatch",
        "status_mismatch",
        "orphan",
        "missing_at_provider",
        "double_charge",
        "stale_unfinished",
        "expired",
        "in_progress",
        "orphan_refund",
    ] {
        let counted = rows
            .iter()
            .filter(|row| row["category"] == category)
            .count() as u64;
        assert_eq!(summary_count(&report, category), counted, "{category}");
        assert!(counted > 0, "{category} was seeded");
    }
    let discrepancies = rows.iter().filter(|row| row["discrepancy"] == true).count() as u64;
    assert_eq!(summary["discrepancies"].as_u64().unwrap(), discrepancies);
    let double = rows
        .iter()
        .find(|row| row["category"] == "double_charge")
        .unwrap();
    assert_eq!(double["provider_objects_total"], 2);

    // Totals add up from the rows, and match what was seeded.
    let mut ours: BTreeMap<String, i64> = BTreeMap::new();
    let mut provider: BTreeMap<String, i64> = BTreeMap::new();
    let mut refunded: BTreeMap<String, i64> = BTreeMap::new();
    for row in rows {
        if let Some(attempt) = row["attempt"].as_object()
            && attempt["status"] == "succeeded"
        {
            *ours
                .entry(attempt["currency"].as_str().unwrap().into())
                .or_default() += attempt["amount_minor"].as_i64().unwrap();
        }
        for object in row["provider_objects"].as_array().unwrap() {
            let currency = object["currency"].as_str().unwrap().to_owned();
            if object["status"] == "succeeded" {
                *provider.entry(currency.clone()).or_default() +=
                    object["amount_received_minor"].as_i64().unwrap();
            }
            *refunded.entry(currency).or_default() += object["refunded_minor"].as_i64().unwrap();
        }
    }
    let totals: BTreeMap<String, &Value> = summary["currencies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| (entry["currency"].as_str().unwrap().to_owned(), entry))
        .collect();
    for (currency, entry) in &totals {
        assert_eq!(
            entry["ours_succeeded_minor"].as_i64().unwrap(),
            ours.get(currency).copied().unwrap_or(0),
            "{currency}"
        );
        assert_eq!(
            entry["provider_succeeded_minor"].as_i64().unwrap(),
            provider.get(currency).copied().unwrap_or(0),
            "{currency}"
        );
        assert_eq!(
            entry["provider_refunded_minor"].as_i64().unwrap(),
            refunded.get(currency).copied().unwrap_or(0),
            "{currency}"
        );
        assert_eq!(entry["ours_refunded_minor"], 0);
    }
    // usd ours: refunded outside, escaped, amount (1000 each), double (1000), missing (2500).
    assert_eq!(totals["usd"]["ours_succeeded_minor"], 6_500);
    assert_eq!(totals["usd"]["ours_succeeded"], "65.00");
    // usd provider: refunded outside, escaped, currency-1 (1000 each), amount (1500), status (1000),
    // orphans (700 + 800), double (1000 + 1000).
    assert_eq!(totals["usd"]["provider_succeeded_minor"], 9_000);
    assert_eq!(totals["usd"]["provider_refunded_minor"], 300);
    assert_eq!(totals["eur"]["ours_succeeded_minor"], 1_000);
    assert_eq!(totals["eur"]["provider_succeeded_minor"], 0);
}

async fn csv_parses_back_and_html_is_one_self_contained_escaped_page(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let seeded = seed_every_category(&app).await;
    let directory = tempfile::tempdir().unwrap();
    let (from, to) = period();
    let csv_path = directory.path().join("report.csv");
    let mut args: Vec<String> = period_args(from, to).into();
    args.extend([
        "--format".into(),
        "csv".into(),
        "--output".into(),
        csv_path.display().to_string(),
    ]);
    let run = run_cli(
        &app,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
        &[],
    )
    .await;
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(run.stdout.is_empty(), "the report went to the file");
    assert!(
        run.stderr.contains("NOT CLEAN"),
        "the summary goes to stderr: {}",
        run.stderr
    );

    let mut reader = csv::Reader::from_path(&csv_path).unwrap();
    let header: Vec<String> = reader
        .headers()
        .unwrap()
        .iter()
        .map(str::to_owned)
        .collect();
    assert_eq!(header[..4], ["seq", "category", "discrepancy", "detail"]);
    let column = |name: &str| header.iter().position(|title| title == name).unwrap();
    let mut categories = BTreeMap::new();
    for record in reader.records() {
        let record = record.unwrap();
        assert_eq!(record.len(), header.len());
        let key = match &record[column("operation_key")] {
            "" => record[column("provider_payment_ids")].to_owned(),
            key => key.to_owned(),
        };
        if key == "amount-1" {
            assert_eq!(&record[column("our_amount_minor")], "1000");
            assert_eq!(&record[column("our_amount")], "10.00");
            assert_eq!(&record[column("provider_amount_minor")], "1500");
            assert_eq!(&record[column("provider_amount")], "15.00");
        }
        if key == "refunded-outside-1" {
            assert_eq!(&record[column("provider_refunded")], "3.00");
            assert_eq!(&record[column("our_refunded")], "0.00");
            assert!(record[column("orphan_refund_ids")].starts_with("re_"));
        }
        categories.insert(key, record[column("category")].to_owned());
    }
    let expected: BTreeMap<String, String> = seeded
        .expected
        .iter()
        .map(|(key, category)| (key.clone(), category.to_string()))
        .collect();
    assert_eq!(categories, expected);

    let html_path = directory.path().join("report.html");
    let mut args: Vec<String> = period_args(from, to).into();
    args.extend([
        "--format".into(),
        "html".into(),
        "--output".into(),
        html_path.display().to_string(),
    ]);
    let run = run_cli(
        &app,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
        &[],
    )
    .await;
    assert_eq!(run.code, 1, "{}", run.stderr);
    let html = std::fs::read_to_string(&html_path).unwrap();
    let lowercase = html.to_ascii_lowercase();
    for external in [
        "http://", "https://", "src=", "href=", "url(", "@import", "<script", "<link", "<img",
        "<iframe",
    ] {
        assert!(
            !lowercase.contains(external),
            "the page must not reference {external:?}"
        );
    }
    assert!(
        html.contains("order-&lt;script&gt;alert(1)&lt;/script&gt;"),
        "operation keys are escaped"
    );
    let summary_at = html.find("<h2>Summary</h2>").unwrap();
    let discrepancies_at = html.find("id=\"discrepancies\"").unwrap();
    assert!(summary_at < discrepancies_at, "summary first");
    assert!(
        html.contains("class=\"discrepancy double_charge\""),
        "double charges are highlighted"
    );
    assert!(
        html.contains("discrepancies in"),
        "the verdict says it is not clean"
    );
    assert!(html.trim_end().ends_with("</html>"));
}

async fn stream(
    app: &TestApp,
    token: Option<&str>,
) -> Result<(ReconciliationSummary, Vec<ReconciliationRow>), tonic::Status> {
    let (from, to) = period();
    let request = ReconciliationRequest {
        from: Some(prost_types::Timestamp {
            seconds: from.timestamp(),
            nanos: 0,
        }),
        to: Some(prost_types::Timestamp {
            seconds: to.timestamp(),
            nanos: 0,
        }),
    };
    let mut client = ReportsClient::connect(format!("http://{}", app.grpc_addr))
        .await
        .unwrap();
    let request = match token {
        Some(token) => authed(token, request),
        None => tonic::Request::new(request),
    };
    let mut chunks = client.stream_reconciliation(request).await?.into_inner();
    let first = chunks.message().await?.expect("a summary chunk");
    let Some(Item::Summary(summary)) = first.item else {
        panic!("the summary comes first: {first:?}")
    };
    let mut rows = Vec::new();
    while let Some(chunk) = chunks.message().await? {
        match chunk.item {
            Some(Item::Row(row)) => rows.push(row),
            other => panic!("only rows after the summary: {other:?}"),
        }
    }
    Ok((summary, rows))
}

async fn the_grpc_stream_returns_the_same_rows_to_finance_and_admin_and_refuses_consumers(backend: Backend) {
    let app = spawn_app_on(backend).await;
    seed_every_category(&app).await;
    let (_, report) = run_json(&app, &[]).await;
    let from_cli: Vec<(String, String, BTreeSet<String>)> = report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            let ids = row["provider_objects"]
                .as_array()
                .unwrap()
                .iter()
                .map(|o| o["id"].as_str().unwrap().to_owned())
                .collect();
            (
                row["category"].as_str().unwrap().to_owned(),
                json_row_key(row),
                ids,
            )
        })
        .collect();

    for token in [FINANCE_TOKEN, ADMIN_TOKEN] {
        let (summary, rows) = stream(&app, Some(token)).await.unwrap();
        let from_grpc: Vec<(String, String, BTreeSet<String>)> = rows
            .iter()
            .map(|row| {
                let key = match &row.attempt {
                    Some(attempt) => attempt.operation_key.clone(),
                    None => row.provider_objects[0].id.clone(),
                };
                (
                    row.category_name.clone(),
                    key,
                    row.provider_objects.iter().map(|o| o.id.clone()).collect(),
                )
            })
            .collect();
        assert_eq!(from_grpc, from_cli, "same rows, same order");
        assert_eq!(summary.rows, rows.len() as u64);
        assert_eq!(
            summary.discrepancies,
            report["summary"]["discrepancies"].as_u64().unwrap()
        );
        let seqs: Vec<i64> = rows.iter().map(|row| row.seq).collect();
        assert_eq!(seqs, (1..=rows.len() as i64).collect::<Vec<_>>());
    }

    let refused = stream(&app, Some(ORDERS_TOKEN)).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    let anonymous = stream(&app, None).await.unwrap_err();
    assert_eq!(anonymous.code(), Code::Unauthenticated);
    let unknown = stream(&app, Some("not-a-token-anyone-has"))
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::Unauthenticated);
}

async fn a_clean_period_reports_clean_and_exits_zero(backend: Backend) {
    let app = spawn_app_on(backend).await;
    charge(&app, "clean-1", "pm_card_visa").await;
    charge(&app, "clean-2", "pm_card_chargeDeclined").await;
    let (from, to) = period();
    // Objects created outside the period belong to other periods' reports, whether listed
    // (inside the look-ahead) or not.
    let outside = |created: DateTime<Utc>| SeedPaymentIntent {
        created: Some(created.timestamp()),
        ..seed(900, "succeeded", BTreeMap::new())
    };
    app.sim()
        .seed_payment_intent(outside(to + chrono::Duration::minutes(30)))
        .await
        .unwrap();
    app.sim()
        .seed_payment_intent(outside(from - chrono::Duration::hours(2)))
        .await
        .unwrap();

    let (code, report) = run_json(&app, &[]).await;
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["summary"]["clean"], true);
    assert_eq!(report["summary"]["discrepancies"], 0);
    assert_eq!(
        json_categories(&report),
        BTreeMap::from([
            ("clean-1".into(), "matched".into()),
            ("clean-2".into(), "matched".into())
        ])
    );
    assert_eq!(
        report["summary"]["sources"]["provider_payments_listed"], 3,
        "the look-ahead lists the later object"
    );

    let args = period_args(from, to);
    let run = run_cli(
        &app,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
        &[],
    )
    .await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.stdout.lines().count(), 3, "CSV: a header and two rows");

    let (summary, rows) = stream(&app, Some(FINANCE_TOKEN)).await.unwrap();
    assert_eq!((summary.discrepancies, rows.len()), (0, 2));
}

async fn errors_exit_two_and_leave_no_output_file(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let directory = tempfile::tempdir().unwrap();
    let output = directory.path().join("report.csv");
    let output_arg = output.display().to_string();
    let backwards = run_cli(
        &app,
        &[
            "--from",
            "2026-12-02",
            "--to",
            "2026-12-01",
            "--output",
            &output_arg,
        ],
        &[],
    )
    .await;
    assert_eq!(backwards.code, 2, "{}", backwards.stderr);
    assert!(
        backwards.stderr.contains("--from must be before --to"),
        "{}",
        backwards.stderr
    );

    // The provider is unreachable: the run fails after its retries, and writes nothing.
    let (from, to) = period();
    let mut args: Vec<String> = period_args(from, to).into();
    args.extend(["--output".into(), output_arg.clone()]);
    let unreachable = [
        ("CHARGEGUARD_PROVIDER__BASE_URL", "http://127.0.0.1:9/"),
        ("CHARGEGUARD_REPORT__PROVIDER_READ_ATTEMPTS_MAX", "2"),
        ("CHARGEGUARD_REPORT__PROVIDER_RETRY_BACKOFF_MS", "10"),
    ];
    let failed = run_cli(
        &app,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
        &unreachable,
    )
    .await;
    assert_eq!(failed.code, 2, "{}", failed.stderr);
    assert!(
        failed.stderr.contains("listing the provider's payments"),
        "{}",
        failed.stderr
    );
    assert_eq!(
        std::fs::read_dir(directory.path()).unwrap().count(),
        0,
        "no report file, partial or whole"
    );

    let runs = count(&app, "SELECT count(*) FROM report_runs").await;
    assert_eq!(runs, 0, "a failed run deletes its staging");
}

async fn a_declined_intent_confirmed_again_later_is_reported_as_succeeded_after_failure(backend: Backend) {
    let app = spawn_app_on(backend).await;
    let (_, intent) = charge(&app, "reconfirmed-1", "pm_card_chargeDeclined").await;
    charge(&app, "declined-2", "pm_card_chargeDeclined").await;
    // Anyone holding the key may confirm a declined intent again (Stripe's checkout does).
    post_to_simulator(
        &app,
        &format!("v1/payment_intents/{intent}/confirm"),
        &[("payment_method", "pm_card_visa")],
    )
    .await;

    let (code, report) = run_json(&app, &[]).await;
    assert_eq!(code, 1, "money taken where we answered failed is a discrepancy");
    assert_eq!(
        json_categories(&report),
        BTreeMap::from([
            ("reconfirmed-1".into(), "status_mismatch".into()),
            ("declined-2".into(), "matched".into()),
        ])
    );
    let row = report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| json_row_key(row) == "reconfirmed-1")
        .unwrap();
    assert_eq!(row["discrepancy"], true);
    let detail = row["detail"].as_str().unwrap();
    assert!(
        detail.starts_with(&format!(
            "succeeded_after_failure: provider object {intent} is succeeded, the attempt is failed"
        )) && detail.ends_with("the provider received 10.00 usd"),
        "{detail}"
    );
    let usd = report["summary"]["currencies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|entry| entry["currency"] == "usd")
        .unwrap();
    assert_eq!(
        (usd["ours_succeeded_minor"].as_i64(), usd["provider_succeeded_minor"].as_i64()),
        (Some(0), Some(1_000))
    );
}

/// The first run, as a newcomer makes it: `serve` with nothing configured in an empty
/// directory (embedded store, built-in simulator, demo consumer), one charge through the CLI
/// client, then `chargeguard report` from the same directory with nothing but the period.
#[tokio::test]
async fn the_report_command_reads_a_first_runs_embedded_store_with_only_the_period() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = ServeProcess::start(command(dir.path()), &[]);
    server.wait_ready().await;
    // The period runs from the date read before the charge to the date read after it, so a run
    // across midnight (UTC) still covers the charge.
    let from = Utc::now().date_naive().to_string();
    let charged = command(dir.path())
        .args(["charge", "--operation", "first-run-1", "--amount", "2000", "--currency", "usd"])
        .args(["--payment-method", "pm_card_visa"])
        .args(["--server", &format!("http://{}", server.grpc_addr)])
        .output()
        .await
        .unwrap();
    assert!(charged.status.success(), "{}", String::from_utf8_lossy(&charged.stderr));

    let to = Utc::now().date_naive().to_string();
    let report = command(dir.path())
        .args(["report", "--from", &from, "--to", &to, "--format", "json"])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&report.stderr);
    assert_eq!(report.status.code(), Some(0), "a clean first run exits 0: {stderr}");
    let report: Value = serde_json::from_slice(&report.stdout).unwrap();
    assert_eq!(
        json_categories(&report),
        BTreeMap::from([("first-run-1".to_owned(), "matched".to_owned())])
    );
    assert_eq!(report["summary"]["sources"]["provider_payments_listed"], 1);

    server.terminate();
    let exit = server.wait_exit().await;
    assert!(exit.success(), "{}", server.stderr());
    // Without the server, the built-in simulator's objects are gone: the report says why.
    let stopped = command(dir.path())
        .args(["report", "--from", &from, "--to", &to])
        .env("CHARGEGUARD_REPORT__PROVIDER_READ_ATTEMPTS_MAX", "1")
        .output()
        .await
        .unwrap();
    assert_eq!(stopped.status.code(), Some(2));
}

on_both_backends!(
    every_seeded_discrepancy_lands_in_its_category_and_the_totals_add_up,
    csv_parses_back_and_html_is_one_self_contained_escaped_page,
    the_grpc_stream_returns_the_same_rows_to_finance_and_admin_and_refuses_consumers,
    a_clean_period_reports_clean_and_exits_zero,
    errors_exit_two_and_leave_no_output_file,
    a_declined_intent_confirmed_again_later_is_reported_as_succeeded_after_failure,
);
