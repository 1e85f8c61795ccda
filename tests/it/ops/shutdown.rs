//! Graceful shutdown of a real `chargeguard serve` process: SIGTERM lets the call in flight
//! finish and be recorded, then the process exits 0.

use std::time::Duration;

use chargeguard::grpc::proto::{AttemptStatus, ChargeOutcome};
use chargeguard::simulator::{Endpoint, FaultKind, FaultSpec, SimulatorConfig};

use super::process::{ServeProcess, command, consumers_toml, write_config};
use crate::support::{
    ORDERS_TOKEN, SIM_API_KEY, TestDatabase, authed, charge_request, outcome_of, spawn_simulator,
    status_of,
};

/// Long enough that SIGTERM surely arrives while the provider holds the create.
const PROVIDER_LATENCY_MS: u64 = 2_000;
const ROW_POLL_INTERVAL: Duration = Duration::from_millis(20);

#[tokio::test]
async fn sigterm_lets_the_charge_in_flight_finish_and_be_recorded() {
    let simulator = spawn_simulator(SimulatorConfig::default()).await;
    let database = TestDatabase::create().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &consumers_toml(&[("orders", ORDERS_TOKEN)]));
    let mut serve = command(dir.path());
    serve
        .env("CHARGEGUARD_DATABASE__URL", &database.url)
        .env("CHARGEGUARD_PROVIDER__API_KEY", SIM_API_KEY)
        .env("CHARGEGUARD_PROVIDER__BASE_URL", simulator.base_url());
    let mut server = ServeProcess::start(serve, &["--config", config.to_str().unwrap()]);
    server.wait_ready().await;

    simulator
        .control()
        .set_fault(
            Endpoint::CreatePaymentIntent,
            FaultSpec::next(FaultKind::Latency(PROVIDER_LATENCY_MS), 1),
        )
        .await
        .unwrap();
    let grpc_addr = server.grpc_addr;
    let call = tokio::spawn(async move {
        let mut client = chargeguard::grpc::proto::payments_client::PaymentsClient::connect(
            format!("http://{grpc_addr}"),
        )
        .await
        .unwrap();
        client
            .charge(authed(
                ORDERS_TOKEN,
                charge_request("order-shutdown:charge"),
            ))
            .await
    });

    // The pending row commits just before the provider call: from then on the call is in flight.
    let pool = sqlx::PgPool::connect(&database.url).await.unwrap();
    loop {
        let (rows,): (i64,) = sqlx::query_as("SELECT count(*) FROM payment_attempts")
            .fetch_one(&pool)
            .await
            .unwrap();
        if rows == 1 {
            break;
        }
        assert!(
            !call.is_finished(),
            "the call ended before its row appeared"
        );
        tokio::time::sleep(ROW_POLL_INTERVAL).await;
    }
    server.terminate();

    let response = call
        .await
        .unwrap()
        .expect("the call in flight is answered")
        .into_inner();
    assert_eq!(outcome_of(&response), ChargeOutcome::Applied);
    assert_eq!(status_of(&response), AttemptStatus::Succeeded);
    let exit = server.wait_exit().await;
    assert!(exit.success(), "exit {exit}; stderr:\n{}", server.stderr());

    let (status,): (String,) = sqlx::query_as("SELECT status::text FROM payment_attempts")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(status, "succeeded", "recorded before the process exited");
    let ledger = simulator.control().ledger().await.unwrap();
    assert_eq!(ledger.payment_intents.len(), 1);
    let requests = simulator.control().requests().await.unwrap();
    assert!(
        requests
            .iter()
            .any(|r| r.fault.as_deref() == Some("latency")),
        "the fault really delayed the call"
    );
    assert!(
        server.stderr().contains("shutdown requested"),
        "{}",
        server.stderr()
    );
    pool.close().await;
}
