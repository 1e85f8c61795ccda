//! The finance page (`GET /finance`) in a real headless browser: Debian's `chromium`, driven
//! over the DevTools protocol by the small client in `cdp`, against the real server on
//! PostgreSQL with charges seeded. The page loads, the period picker changes the rows, the
//! search finds rows and is escaped, a missing or forged credential is refused, and a
//! screenshot is written to `target/finance-page.png` for people to look at.

mod cdp;

use std::time::Duration;

use chargeguard::config::{OperatorConfig, OperatorRole};
use chargeguard::grpc::hash_token;
use chargeguard::grpc::proto::FinanceLoginRequest;
use chargeguard::grpc::proto::reports_client::ReportsClient;
use chrono::Utc;
use reqwest::StatusCode;
use reqwest::header;

use crate::reports::{charge, sql};
use crate::support::{ORDERS_TOKEN, TestApp, authed};

const FINANCE_TOKEN: &str = "finance-page-token-0123456789";

async fn spawn_app() -> TestApp {
    TestApp::spawn_with(|config| {
        config.operators = vec![OperatorConfig {
            name: "finance".into(),
            token_sha256: hash_token(FINANCE_TOKEN).into(),
            role: OperatorRole::Finance,
        }];
    })
    .await
}

/// A one-time login link's path, asked for over gRPC as `chargeguard finance-link` does.
async fn login_path(app: &TestApp, token: &str) -> Result<String, tonic::Status> {
    let mut client = ReportsClient::connect(format!("http://{}", app.grpc_addr)).await.unwrap();
    let response = client.create_finance_login(authed(token, FinanceLoginRequest {})).await?.into_inner();
    assert_eq!(response.http_port, u32::from(app.http_addr.port()));
    assert!(!response.http_tls);
    Ok(response.path)
}

fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap()
}

/// The page's default period is the server's today (UTC): rows seeded just before midnight would
/// be yesterday's when the page is read. Within two minutes of midnight, wait for it to pass.
async fn wait_if_midnight_is_near() {
    let now = Utc::now();
    let midnight = (now.date_naive() + chrono::Days::new(1)).and_time(chrono::NaiveTime::MIN).and_utc();
    let left = (midnight - now).to_std().unwrap_or_default();
    if left < Duration::from_secs(120) {
        tokio::time::sleep(left + Duration::from_secs(1)).await;
    }
}

/// Three charges today (one with an amount that disagrees with the provider's), one four days
/// ago (its provider object, made today, is beyond that period's listing: missing at the
/// provider).
async fn seed(app: &TestApp) {
    wait_if_midnight_is_near().await;
    for key in ["finance-today-1", "finance-today-2", "finance-today-mismatch", "finance-old-1"] {
        charge(app, key, "pm_card_visa").await;
    }
    // PostgreSQL spelling: this test runs on PostgreSQL only (TestApp::spawn).
    sql(app, "UPDATE payment_attempts SET amount_minor = 999 WHERE operation_key = 'finance-today-mismatch'").await;
    sql(app, "UPDATE payment_attempts SET created_at = created_at - interval '4 days' WHERE operation_key = 'finance-old-1'").await;
}

#[tokio::test]
async fn finance_page_in_a_headless_browser_picks_periods_searches_and_refuses_strangers() {
    let app = spawn_app().await;
    seed(&app).await;
    let base = format!("http://{}", app.http_addr);
    let mut browser = cdp::Browser::launch().await;

    // No credential: 401, and the page says how to sign in.
    let status = browser.navigate(&format!("{base}/finance")).await;
    assert_eq!(status, 401);
    assert!(browser.text("#message").await.contains("chargeguard finance-link"));

    // A forged ticket opens nothing.
    let status = browser.navigate(&format!("{base}/finance/login?ticket={}", "ab".repeat(32))).await;
    assert_eq!(status, 401);

    // A real link: the ticket becomes a cookie and the browser lands on /finance without it.
    let path = login_path(&app, FINANCE_TOKEN).await.unwrap();
    let status = browser.navigate(&format!("{base}{path}")).await;
    assert_eq!(status, 200);
    assert_eq!(browser.eval_string("location.pathname + location.search").await, "/finance");
    assert_eq!(browser.text("#operator").await, "finance");
    let today = browser.table_text("#rows").await;
    for key in ["finance-today-1", "finance-today-2", "finance-today-mismatch"] {
        assert!(today.contains(key), "{key} in today's rows: {today}");
    }
    assert!(!today.contains("finance-old-1"), "{today}");
    let discrepancies = browser.table_text("#discrepancies").await;
    assert!(discrepancies.contains("finance-today-mismatch"), "{discrepancies}");
    assert!(!discrepancies.contains("finance-today-1"), "{discrepancies}");
    assert_eq!(browser.eval_string("String(document.querySelectorAll('#chart g.day').length)").await, "1");
    assert!(browser.text("#totals").await.contains("usd"));
    // The used ticket opens nothing a second time.
    assert_eq!(no_redirects().get(format!("{base}{path}")).send().await.unwrap().status(), StatusCode::UNAUTHORIZED);

    // The period picker: five to three days back shows only the old charge.
    let today_date = Utc::now().date_naive();
    let from = (today_date - chrono::Duration::days(5)).to_string();
    let to = (today_date - chrono::Duration::days(3)).to_string();
    browser.submit_period(&from, &to, "").await;
    let earlier = browser.table_text("#rows").await;
    assert!(earlier.contains("finance-old-1"), "{earlier}");
    assert!(!earlier.contains("finance-today-1"), "{earlier}");
    assert!(browser.table_text("#discrepancies").await.contains("missing_at_provider"));
    assert_eq!(browser.eval_string("String(document.querySelectorAll('#chart g.day').length)").await, "3");
    let search = browser.eval_string("location.search").await;
    assert!(search.contains(&format!("from={from}")), "{search}");

    // The search narrows the rows, and what was typed comes back as text, not markup.
    browser.submit_period(&today_date.to_string(), &today_date.to_string(), "today-2").await;
    let found = browser.table_text("#rows").await;
    assert!(found.contains("finance-today-2") && !found.contains("finance-today-1"), "{found}");
    browser.submit_period(&today_date.to_string(), &today_date.to_string(), "<i>zz</i>").await;
    assert_eq!(browser.eval_string("String(document.querySelectorAll('i').length)").await, "0");
    assert!(browser.text("#rows-none").await.contains("None"));

    // Back to today, and a picture of the page for people.
    browser.submit_period(&today_date.to_string(), &today_date.to_string(), "").await;
    let screenshot = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/finance-page.png");
    browser.screenshot(&screenshot).await;
    assert!(std::fs::metadata(&screenshot).unwrap().len() > 10_000, "a screenshot of a rendered page");

    // The downloads the page links to, with the session's cookie.
    let csv_href = browser.eval_string("document.getElementById('download-csv').href").await;
    let json_href = browser.eval_string("document.getElementById('download-json').href").await;
    let cookie = browser.session_cookie().await;
    let client = reqwest::Client::new();
    let csv = client.get(&csv_href).header(header::COOKIE, &cookie).send().await.unwrap();
    assert_eq!(csv.status(), StatusCode::OK);
    assert_eq!(csv.headers()[header::CACHE_CONTROL], "no-store");
    let csv = csv.text().await.unwrap();
    assert!(csv.starts_with("seq,category"), "{csv}");
    assert!(csv.contains("finance-today-mismatch"), "{csv}");
    let json: serde_json::Value = client.get(&json_href).header(header::COOKIE, &cookie).send().await.unwrap().json().await.unwrap();
    assert_eq!(json["summary"]["rows"], 3, "{json}");

    browser.close().await;
    app.stop().await;
}

#[tokio::test]
async fn finance_page_refuses_forged_sessions_and_consumers_and_only_reads() {
    let app = spawn_app().await;
    let base = format!("http://{}", app.http_addr);
    let client = no_redirects();
    let get = |path: &str| client.get(format!("{base}{path}"));

    let missing = get("/finance").send().await.unwrap();
    assert_eq!(missing.status(), StatusCode::UNAUTHORIZED);
    let policy = missing.headers()[header::CONTENT_SECURITY_POLICY].to_str().unwrap().to_owned();
    assert!(policy.starts_with("default-src 'none'"), "{policy}");
    assert!(!policy.contains("http"), "no external source: {policy}");
    assert_eq!(missing.headers()[header::CACHE_CONTROL], "no-store");

    let forged = format!("{}={}", chargeguard::finance::SESSION_COOKIE, "cd".repeat(32));
    assert_eq!(get("/finance").header(header::COOKIE, &forged).send().await.unwrap().status(), StatusCode::UNAUTHORIZED);
    assert_eq!(get("/finance/report.csv").header(header::COOKIE, &forged).send().await.unwrap().status(), StatusCode::UNAUTHORIZED);
    let unknown = get("/finance").bearer_auth("nobody-has-this-token").send().await.unwrap();
    assert_eq!(unknown.status(), StatusCode::UNAUTHORIZED);
    let consumer = get("/finance").bearer_auth(ORDERS_TOKEN).send().await.unwrap();
    assert_eq!(consumer.status(), StatusCode::FORBIDDEN);
    let operator = get("/finance").bearer_auth(FINANCE_TOKEN).send().await.unwrap();
    assert_eq!(operator.status(), StatusCode::OK);

    // A consumer cannot get a link either.
    let refused = login_path(&app, ORDERS_TOKEN).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    assert_eq!(login_path(&app, "forged").await.unwrap_err().code(), tonic::Code::Unauthenticated);

    // The cookie is HttpOnly and SameSite=Strict; the ticket is not in the redirect.
    let path = login_path(&app, FINANCE_TOKEN).await.unwrap();
    let opened = get(&path).send().await.unwrap();
    assert_eq!(opened.status(), StatusCode::SEE_OTHER);
    assert_eq!(opened.headers()[header::LOCATION], "/finance");
    let cookie = opened.headers()[header::SET_COOKIE].to_str().unwrap();
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict") && cookie.contains("Path=/finance"), "{cookie}");

    // Only reads: nothing answers a POST.
    let posted = client.post(format!("{base}/finance")).bearer_auth(FINANCE_TOKEN).send().await.unwrap();
    assert_eq!(posted.status(), StatusCode::METHOD_NOT_ALLOWED);
    let bad_period = get("/finance?from=2026-12-05&to=2026-12-01").bearer_auth(FINANCE_TOKEN).send().await.unwrap();
    assert_eq!(bad_period.status(), StatusCode::BAD_REQUEST);
    app.stop().await;
}

#[tokio::test]
async fn finance_link_prints_a_link_that_opens_the_page_once() {
    let app = spawn_app().await;
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_chargeguard"))
            .args(["finance-link", "--server"])
            .arg(format!("http://{}", app.grpc_addr))
            .env("CHARGEGUARD_TOKEN", FINANCE_TOKEN)
            .env("RUST_LOG", "warn")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap()
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout} {}", String::from_utf8_lossy(&output.stderr));
    let link = stdout.lines().next().unwrap();
    assert!(link.starts_with(&format!("http://127.0.0.1:{}/finance/login?ticket=", app.http_addr.port())), "{link}");
    let client = no_redirects();
    assert_eq!(client.get(link).send().await.unwrap().status(), StatusCode::SEE_OTHER);
    assert_eq!(client.get(link).send().await.unwrap().status(), StatusCode::UNAUTHORIZED);
    app.stop().await;
}

/// The first run (no consumers, no operators, the built-in simulator): the demo operator's
/// token sits beside the demo token, and `finance-link` with it opens the page; the demo
/// consumer's token does not.
#[tokio::test]
async fn finance_page_on_the_first_run_opens_with_the_demo_operator_token_file() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("demo-token");
    let app = TestApp::spawn_with(|config| {
        config.consumers.clear();
        config.operators.clear();
        config.provider.api_key = None;
        config.provider.base_url = None;
        config.embedded.demo_token_file = token_file.clone();
    })
    .await;
    let operator_file = dir.path().join(chargeguard::embedded::DEMO_OPERATOR_TOKEN_FILE_NAME);
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_chargeguard"))
        .args(["finance-link", "--json", "--server"])
        .arg(format!("http://{}", app.grpc_addr))
        .arg("--token-file")
        .arg(&operator_file)
        .env("RUST_LOG", "warn")
        .env_remove("CHARGEGUARD_TOKEN")
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout} {}", String::from_utf8_lossy(&output.stderr));
    let answer: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(answer["operator"], chargeguard::embedded::DEMO_OPERATOR);
    let client = no_redirects();
    let opened = client.get(answer["link"].as_str().unwrap()).send().await.unwrap();
    assert_eq!(opened.status(), StatusCode::SEE_OTHER);
    let cookie = opened.headers()[header::SET_COOKIE].to_str().unwrap().split(';').next().unwrap().to_owned();
    let page = client.get(format!("http://{}/finance", app.http_addr)).header(header::COOKIE, cookie).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let consumer_token = chargeguard::embedded::read_token_file(&token_file).unwrap();
    let consumer = client
        .get(format!("http://{}/finance", app.http_addr))
        .bearer_auth(consumer_token.expose())
        .send()
        .await
        .unwrap();
    assert_eq!(consumer.status(), StatusCode::FORBIDDEN);
    app.stop().await;
}
