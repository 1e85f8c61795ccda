//! The secrets audit: a real `chargeguard serve` process with TLS, mutual TLS, bearer tokens, a
//! provider key and webhook signing secrets, logging at RUST_LOG=trace, taken through a failed
//! start, a charge, a refused call and a webhook; its whole output is searched for every secret
//! and every private key. A second audit runs the first run (nothing configured) at trace through
//! a 3-D Secure payment completed by the built-in simulator's webhook, signed with the secret
//! generated at start: no `whsec_` appears in its output.

use std::time::Duration;

use chargeguard::grpc::proto::get_attempt_request::Selector;
use chargeguard::grpc::proto::payments_client::PaymentsClient;
use chargeguard::grpc::proto::{AttemptStatus, GetAttemptRequest};
use chargeguard::grpc::{certificate_sha256, hash_token};
use chargeguard::secret::Secret;
use chargeguard::simulator::SimulatorConfig;
use chargeguard::webhook::signature::sign;

use super::{Ca, Issued, ServerFiles, tls_client};
use crate::ops::process::{ServeProcess, command, failed_start, write_config};
use crate::support::{SIM_API_KEY, TestDatabase, authed, charge_request, spawn_simulator};

const TOKEN: &str = "audit-orders-token-9f8e7d6c5b4a";
const ROTATED_TOKEN: &str = "audit-orders-token-rotated-1a2b3c";
const OPERATOR_TOKEN: &str = "audit-finance-token-77aa88bb99cc";
const GUESSED_TOKEN: &str = "audit-guessed-token-0f0f0f0f0f0f";
const WEBHOOK_SECRET: &str = "whsec_audit_current_5e5e5e5e";
const OLD_WEBHOOK_SECRET: &str = "whsec_audit_previous_6d6d6d6d";
const READY_WAIT_MAX: Duration = Duration::from_secs(120);

/// The base64 lines of a PEM private key: any of them in the log is a leak.
fn key_lines(issued: &Issued) -> Vec<String> {
    issued.key_pem.lines().filter(|line| !line.starts_with("-----") && line.len() >= 16).map(str::to_owned).collect()
}

fn config_toml(database_url: &str, simulator_url: &str, files: &ServerFiles, client: &Issued) -> String {
    format!(
        r#"
[server]
tls_cert_file = "{cert}"
tls_key_file = "{key}"
tls_client_ca_file = "{ca}"

[database]
url = "{database_url}"

[provider]
api_key = "{SIM_API_KEY}"
base_url = "{simulator_url}"

[sweep]
enabled = false

[webhooks]
secrets = ["{OLD_WEBHOOK_SECRET}", "{WEBHOOK_SECRET}"]

[[consumers]]
name = "orders"
token_sha256 = ["{token}", "{rotated}"]
client_cert_sha256 = "{cert_hash}"

[[operators]]
name = "finance"
token_sha256 = "{operator}"
role = "finance"
"#,
        cert = files.cert.display(),
        key = files.key.display(),
        ca = files.client_ca.display(),
        token = hash_token(TOKEN),
        rotated = hash_token(ROTATED_TOKEN),
        operator = hash_token(OPERATOR_TOKEN),
        cert_hash = certificate_sha256(&client.der),
    )
}

#[tokio::test]
async fn a_traced_server_through_charge_refusal_webhook_and_failed_start_never_logs_a_secret_or_key() {
    let dir = tempfile::tempdir().unwrap();
    let database = TestDatabase::create().await;
    let simulator = spawn_simulator(SimulatorConfig::default()).await;
    let (server_ca, client_ca) = (Ca::new("audit server CA"), Ca::new("audit client CA"));
    let (server, client) = (server_ca.server(), client_ca.client("orders"));
    let files = ServerFiles::write(dir.path(), &server, Some(&client_ca));
    let toml = config_toml(&database.url, &simulator.base_url(), &files, &client);
    let mut output = String::new();

    // A failed start: the key file holds another certificate's key.
    let wrong_key = server_ca.server();
    let failed_dir = tempfile::tempdir().unwrap();
    let failed_files = ServerFiles::write(failed_dir.path(), &server, Some(&client_ca));
    std::fs::write(&failed_files.key, &wrong_key.key_pem).unwrap();
    let failed_config = write_config(failed_dir.path(), &config_toml(&database.url, &simulator.base_url(), &failed_files, &client));
    let mut refused = command(failed_dir.path());
    refused.env("RUST_LOG", "trace");
    let stderr = failed_start(refused, &["--config", failed_config.to_str().unwrap()]).await;
    assert!(stderr.contains("server.tls_key_file"), "the failed start names the option: {stderr}");
    output.push_str(&stderr);

    let config = write_config(dir.path(), &toml);
    let mut serve = command(dir.path());
    serve.env("RUST_LOG", "trace");
    let mut server_process = ServeProcess::start(serve, &["--config", config.to_str().unwrap()]);
    let started = std::time::Instant::now();
    // Plaintext health checks cannot reach a TLS port: the log says when it serves.
    while !server_process.stderr().contains("chargeguard serving") {
        assert!(started.elapsed() < READY_WAIT_MAX, "never served:\n{}", server_process.stderr());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let grpc_addr = server_process.grpc_addr;
    let mut as_orders = tls_client(grpc_addr, &server_ca, Some(&client)).await.expect("mutual TLS connects");
    as_orders.charge(authed(TOKEN, charge_request("audit-1"))).await.expect("a charge");
    as_orders.charge(authed(ROTATED_TOKEN, charge_request("audit-2"))).await.expect("a charge with the other token");
    let refusal = as_orders.charge(authed(GUESSED_TOKEN, charge_request("audit-3"))).await.expect_err("a guessed token");
    assert_eq!(refusal.code(), tonic::Code::Unauthenticated);

    let https = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(server_ca.pem.as_bytes()).unwrap())
        .resolve(super::SERVER_NAME, server_process.http_addr)
        .build()
        .unwrap();
    let body = br#"{"id":"evt_audit_1","object":"event","type":"payment_intent.succeeded","data":{"object":{"id":"pi_audit"}}}"#;
    let signature = sign(&Secret::new(WEBHOOK_SECRET), chrono::Utc::now().timestamp(), body);
    let webhook = https
        .post(format!("https://{}:{}/webhooks/stripe", super::SERVER_NAME, server_process.http_addr.port()))
        .header("Stripe-Signature", signature)
        .body(body.to_vec())
        .send()
        .await
        .expect("the webhook endpoint answers over TLS");
    assert!(webhook.status().as_u16() < 500, "{:?}", webhook.status());

    // The finance page's login: the ticket in the link and the session in the cookie are
    // secrets too.
    let channel = super::tls_channel(grpc_addr, &server_ca, Some(&client)).await.expect("mutual TLS connects");
    let login = chargeguard::grpc::proto::reports_client::ReportsClient::new(channel)
        .create_finance_login(authed(OPERATOR_TOKEN, chargeguard::grpc::proto::FinanceLoginRequest {}))
        .await
        .expect("an operator gets a login link")
        .into_inner();
    let ticket = login.path.split_once("ticket=").expect("a ticket in the link").1.to_owned();
    let https_no_redirects = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(server_ca.pem.as_bytes()).unwrap())
        .resolve(super::SERVER_NAME, server_process.http_addr)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let http_base = format!("https://{}:{}", super::SERVER_NAME, login.http_port);
    let opened = https_no_redirects.get(format!("{http_base}{}", login.path)).send().await.expect("the link opens");
    assert_eq!(opened.status(), reqwest::StatusCode::SEE_OTHER);
    let cookie = opened.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(cookie.contains("; Secure"), "TLS on the HTTP port: a Secure cookie: {cookie}");
    let session = cookie.split(';').next().unwrap().to_owned();
    let page = https_no_redirects.get(format!("{http_base}/finance")).header("cookie", &session).send().await.unwrap();
    assert_eq!(page.status(), reqwest::StatusCode::OK);
    let session_id = session.split_once('=').unwrap().1.to_owned();

    server_process.terminate();
    let _ = tokio::time::timeout(Duration::from_secs(30), server_process.wait_exit()).await;
    output.push_str(&server_process.stderr());

    let mut secrets: Vec<(String, String)> = [
        ("bearer token", TOKEN),
        ("rotated bearer token", ROTATED_TOKEN),
        ("operator token", OPERATOR_TOKEN),
        ("refused token", GUESSED_TOKEN),
        ("webhook secret", WEBHOOK_SECRET),
        ("old webhook secret", OLD_WEBHOOK_SECRET),
        ("provider key", SIM_API_KEY),
    ]
    .into_iter()
    .map(|(what, secret)| (what.to_owned(), secret.to_owned()))
    .collect();
    secrets.push(("finance login ticket".to_owned(), ticket));
    secrets.push(("finance session".to_owned(), session_id));
    for (what, issued) in [("server key", &server), ("client key", &client), ("wrong server key", &wrong_key)] {
        secrets.extend(key_lines(issued).into_iter().map(|line| (what.to_owned(), line)));
    }
    println!("audited {} lines ({} bytes) of trace output for {} secrets", output.lines().count(), output.len(), secrets.len());
    assert!(output.lines().count() > 100, "trace logging was on: {output}");
    let leaks: Vec<&String> = secrets.iter().filter(|(_, secret)| output.contains(secret.as_str())).map(|(what, _)| what).collect();
    assert!(leaks.is_empty(), "the log shows {leaks:?}");
    assert!(!output.contains("PRIVATE KEY"), "a PEM private key block is in the log");
}

#[tokio::test]
async fn the_first_runs_generated_webhook_secret_is_never_logged() {
    let dir = tempfile::tempdir().unwrap();
    let mut serve = command(dir.path());
    serve.env("RUST_LOG", "trace").env("CHARGEGUARD_SWEEP__ENABLED", "false");
    let mut server_process = ServeProcess::start(serve, &[]);
    server_process.wait_ready().await;
    let token = chargeguard::embedded::read_token_file(&dir.path().join("chargeguard-data/demo-token")).expect("the demo token");
    let mut client = PaymentsClient::connect(format!("http://{}", server_process.grpc_addr)).await.unwrap();
    let mut request = charge_request("audit-first-run-3ds");
    request.payment_method = "pm_card_threeDSecure2Required".into();
    let response = client.charge(authed(token.expose(), request)).await.unwrap().into_inner();
    let redirect_url = response.attempt.unwrap().next_action.unwrap().redirect_url;
    let no_redirects = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let completed = no_redirects.post(&redirect_url).form(&[("outcome", "succeed")]).send().await.unwrap();
    assert!(completed.status().is_success() || completed.status().is_redirection(), "{}", completed.status());
    // Succeeded with the sweep off: the webhook, signed with the generated secret, was verified.
    let started = std::time::Instant::now();
    loop {
        let selector = Some(Selector::OperationKey("audit-first-run-3ds".to_owned()));
        let attempt = client.get_attempt(authed(token.expose(), GetAttemptRequest { selector })).await.unwrap().into_inner();
        if attempt.attempt.unwrap().status == AttemptStatus::Succeeded as i32 {
            break;
        }
        assert!(started.elapsed() < READY_WAIT_MAX, "the webhook never completed the payment:\n{}", server_process.stderr());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    server_process.terminate();
    let _ = tokio::time::timeout(Duration::from_secs(30), server_process.wait_exit()).await;
    let output = server_process.stderr();
    assert!(output.lines().count() > 100, "trace logging was on: {output}");
    assert!(!output.contains("whsec_"), "the log shows the generated webhook secret");
    assert!(!output.contains(token.expose()), "the log shows the demo token");
}
