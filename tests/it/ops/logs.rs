//! Structured logs of a real `chargeguard serve` process: JSON lines whose charge events carry
//! the attempt id and the operation key, and in which no secret ever appears — not on the happy
//! path, a decline, an unknown outcome, a refused token, nor a failed start.

use chargeguard::simulator::{Endpoint, FaultKind, FaultSpec, SimulatorConfig};
use serde_json::Value;

use super::process::{
    ServeProcess, command, consumers_toml, failed_start, free_addr, write_config,
};
use crate::support::{TestDatabase, authed, charge_request, spawn_simulator};

const PROVIDER_KEY: &str = "sk_test_provider_key_never_logged_7f3a";
const CONSUMER_TOKEN: &str = "consumer-token-never-logged-91c2";
const DATABASE_PASSWORD: &str = "db-password-never-logged-5e8b";

fn assert_no_secrets(stderr: &str) {
    for secret in [PROVIDER_KEY, CONSUMER_TOKEN, DATABASE_PASSWORD] {
        assert!(
            !stderr.contains(secret),
            "{secret} appears in stderr:\n{stderr}"
        );
    }
}

/// `postgres://postgres:PASSWORD@host/db`: PostgreSQL here trusts local users, so the password
/// is accepted and ignored, but chargeguard holds it like a real one.
fn url_with_password(url: &str) -> String {
    url.replacen(
        "postgres://postgres@",
        &format!("postgres://postgres:{DATABASE_PASSWORD}@"),
        1,
    )
}

#[tokio::test]
async fn json_logs_carry_attempt_and_operation_and_never_a_secret() {
    let simulator = spawn_simulator(SimulatorConfig {
        api_keys: vec![PROVIDER_KEY.to_owned()],
        ..Default::default()
    })
    .await;
    let database = TestDatabase::create().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &consumers_toml(&[("orders", CONSUMER_TOKEN)]));
    let mut serve = command(dir.path());
    serve
        .env(
            "CHARGEGUARD_DATABASE__URL",
            url_with_password(&database.url),
        )
        .env("CHARGEGUARD_PROVIDER__API_KEY", PROVIDER_KEY)
        .env("CHARGEGUARD_PROVIDER__BASE_URL", simulator.base_url())
        .env("CHARGEGUARD_PROVIDER__CALL_TIMEOUT_MS", "1000")
        // As the compose file and the Kubernetes manifests ask for JSON: by variable, which
        // configuration must not mistake for an option.
        .env("CHARGEGUARD_LOG_FORMAT", "json")
        // As verbose as an operator would go while debugging.
        .env("RUST_LOG", "debug");
    let mut server = ServeProcess::start(serve, &["--config", config.to_str().unwrap()]);
    server.wait_ready().await;

    let mut client = chargeguard::grpc::proto::payments_client::PaymentsClient::connect(format!(
        "http://{}",
        server.grpc_addr
    ))
    .await
    .unwrap();
    let charged = client
        .charge(authed(CONSUMER_TOKEN, charge_request("order-logs:charge")))
        .await
        .unwrap()
        .into_inner();
    let attempt_id = charged.attempt.unwrap().attempt_id;
    let mut declined = charge_request("order-logs-declined:charge");
    declined.payment_method = "pm_card_chargeDeclined".to_owned();
    client
        .charge(authed(CONSUMER_TOKEN, declined))
        .await
        .unwrap();
    simulator
        .control()
        .set_fault(
            Endpoint::CreatePaymentIntent,
            FaultSpec::next(FaultKind::FailBeforeApply, 1),
        )
        .await
        .unwrap();
    client
        .charge(authed(
            CONSUMER_TOKEN,
            charge_request("order-logs-unknown:charge"),
        ))
        .await
        .unwrap_err();
    let wrong = format!("{CONSUMER_TOKEN}-wrong");
    client
        .charge(authed(&wrong, charge_request("order-logs-refused:charge")))
        .await
        .unwrap_err();
    server.terminate();
    assert!(server.wait_exit().await.success());
    let stderr = server.stderr();

    let lines: Vec<Value> = stderr
        .lines()
        .map(|line| {
            serde_json::from_str(line)
                .unwrap_or_else(|error| panic!("not a JSON line ({error}): {line}"))
        })
        .collect();
    let answered = lines
        .iter()
        .find(|line| {
            line["message"] == "charge answered"
                && line["span"]["operation_key"] == "order-logs:charge"
        })
        .unwrap_or_else(|| panic!("no 'charge answered' line for the operation in:\n{stderr}"));
    assert_eq!(answered["span"]["attempt_id"], attempt_id.as_str());
    assert_eq!(answered["span"]["consumer"], "orders");
    assert_eq!(answered["outcome"], "applied");
    assert_eq!(answered["level"], "INFO");
    assert_no_secrets(&stderr);
    assert!(
        !stderr.contains(&wrong),
        "a refused token is not repeated either"
    );
}

#[tokio::test]
async fn a_failed_start_names_the_problem_without_the_database_password() {
    let dir = tempfile::tempdir().unwrap();
    let closed = free_addr();
    let mut serve = command(dir.path());
    serve
        .env(
            "CHARGEGUARD_DATABASE__URL",
            format!("postgres://postgres:{DATABASE_PASSWORD}@{closed}/chargeguard"),
        )
        .env("CHARGEGUARD_DATABASE__ACQUIRE_TIMEOUT_MS", "500")
        .env("CHARGEGUARD_PROVIDER__API_KEY", PROVIDER_KEY)
        .env("CHARGEGUARD_PROVIDER__BASE_URL", "http://127.0.0.1:9/");
    let stderr = failed_start(serve, &[]).await;
    assert!(stderr.contains("applying migrations"), "{stderr}");
    assert_no_secrets(&stderr);
}
