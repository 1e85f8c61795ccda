//! Spawns the real application: a fresh database (PostgreSQL by default, or the embedded SQLite
//! file: see `Backend`), the in-process Stripe simulator on port 0, chargeguard's gRPC and HTTP
//! servers on port 0, and a real async-stripe client inside.

// Helpers shared by every test module; not every module uses each of them.
#![allow(dead_code)]

pub mod attempts;
mod backend;
pub mod database;
pub mod faketime;
pub mod health;

use std::sync::Arc;
use std::time::Duration;

use chargeguard::clock::OffsetClock;
use chargeguard::config::{Config, ConsumerConfig};
use chargeguard::grpc::hash_token;
use chargeguard::grpc::proto::payments_client::PaymentsClient;
use chargeguard::grpc::proto::{self, ChargeRequest, ChargeResponse, GetAttemptRequest, get_attempt_request};
use chargeguard::secret::Secret;
use chargeguard::simulator::{self, RequestLogEntry, SimControl, SimulatorConfig, SimulatorHandle};
use chargeguard::startup::Application;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tonic::{Request, Status};

pub use backend::Backend;
pub(crate) use backend::on_both_backends;
pub use database::TestDatabase;

pub const ORDERS_TOKEN: &str = "orders-token-0123456789";
pub const BILLING_TOKEN: &str = "billing-token-0123456789";
pub const SIM_API_KEY: &str = "sk_test_chargeguard";

pub struct TestApp {
    pub grpc_addr: std::net::SocketAddr,
    pub http_addr: std::net::SocketAddr,
    /// `server.metrics_listen`'s bound address, when the test configured one.
    pub metrics_addr: Option<std::net::SocketAddr>,
    pub database: TestDatabase,
    pub simulator: SimulatorHandle,
    pub clock: Arc<OffsetClock>,
    pub orchestrator: chargeguard::orchestrator::Orchestrator,
    server: RunningServer,
}

/// The app's server task; stopped when dropped, so a failed assertion stops it too.
struct RunningServer {
    shutdown: CancellationToken,
    task: Option<JoinHandle<anyhow::Result<()>>>,
}

impl RunningServer {
    /// Stops accepting calls, lets in-flight ones finish, and waits (bounded) for the server.
    async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// The Prometheus text served on `/metrics` at `http_addr` (a test app's, or a `serve` process's).
pub async fn metrics_text(http_addr: std::net::SocketAddr) -> String {
    reqwest::get(format!("http://{http_addr}/metrics")).await.unwrap().text().await.unwrap()
}

/// The value of the sample line of Prometheus `text` that starts with `series` (a name and its
/// labels as rendered, then a space: `chargeguard_charges_total{outcome="applied"} `), if any.
pub fn series_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series))
        .map(|value| value.trim().parse().unwrap())
}

/// Short timeouts so that tests of unknown outcomes and leases run in seconds.
pub fn test_config(database_url: &str, simulator_url: &str) -> Config {
    let mut config = Config::default();
    config.server.grpc_listen = "127.0.0.1:0".parse().unwrap();
    config.server.http_listen = "127.0.0.1:0".parse().unwrap();
    config.database.url = Some(Secret::new(database_url));
    config.provider.api_key = Some(Secret::new(SIM_API_KEY));
    config.provider.base_url = Some(simulator_url.to_owned());
    config.provider.call_timeout_ms = 1_000;
    // Leases must outlast a round: two provider calls and a database write (config validates).
    config.charge.lease_ms = 8_000;
    config.charge.recovery_grace_ms = 8_000;
    config.charge.concurrent_wait_ms = 5_000;
    // Tests drive the sweep with `try_sweep_once()`; a scheduled pass would race their counts.
    config.sweep.enabled = false;
    config.database.group_commit.enabled = group_commit_enabled();
    config.consumers = vec![
        ConsumerConfig { name: "orders".into(), token_sha256: hash_token(ORDERS_TOKEN).into(), ..ConsumerConfig::default() },
        ConsumerConfig { name: "billing".into(), token_sha256: hash_token(BILLING_TOKEN).into(), ..ConsumerConfig::default() },
    ];
    config
}

/// Group commit (issue 21) in the apps and `serve` children of this test run: the default,
/// unless CG_TEST_GROUP_COMMIT=off runs the suite (the crash table with it) without. Not a
/// `CHARGEGUARD_` variable: `Config::load` refuses unknown ones, and children never see those.
pub fn group_commit_enabled() -> bool {
    match std::env::var("CG_TEST_GROUP_COMMIT").as_deref() {
        Ok("off") => false,
        Ok("on") => true,
        _ => Config::default().database.group_commit.enabled,
    }
}

impl TestApp {
    pub async fn spawn() -> Self {
        Self::spawn_with(|_| {}).await
    }

    /// On PostgreSQL.
    pub async fn spawn_with(customize: impl FnOnce(&mut Config)) -> Self {
        Self::spawn_backend_with(Backend::Postgres, customize).await
    }

    /// On PostgreSQL, in a private cluster whose clock the test moves
    /// (`database.fake_clock()`); the simulator's clock is moved apart, by its control.
    pub async fn spawn_on_fake_clock() -> Self {
        let simulator = spawn_simulator(SimulatorConfig::default()).await;
        let database = TestDatabase::create_on_fake_clock().await;
        Self::spawn_on(database, simulator, |_| {}).await
    }

    pub async fn spawn_backend(backend: Backend) -> Self {
        Self::spawn_backend_with(backend, |_| {}).await
    }

    pub async fn spawn_backend_with(backend: Backend, customize: impl FnOnce(&mut Config)) -> Self {
        let simulator = spawn_simulator(SimulatorConfig::default()).await;
        let database = TestDatabase::create_on(backend).await;
        Self::spawn_on(database, simulator, customize).await
    }

    pub async fn spawn_on(
        database: TestDatabase,
        simulator: SimulatorHandle,
        customize: impl FnOnce(&mut Config),
    ) -> Self {
        let mut config = test_config(&database.url, &simulator.base_url());
        database.configure(&mut config);
        customize(&mut config);
        // A private cluster's clock is moved for real; the shared database's moves with ours.
        let clock = Arc::new(match database.fake_clock() {
            Some(_) => OffsetClock::beside_a_moving_database(),
            None => OffsetClock::default(),
        });
        let app = Application::build(config, clock.clone()).await.expect("application builds");
        let grpc_addr = app.grpc_addr();
        let http_addr = app.http_addr();
        let metrics_addr = app.metrics_addr();
        let orchestrator = app.orchestrator().clone();
        let server = RunningServer { shutdown: app.shutdown_token(), task: Some(tokio::spawn(app.run())) };
        Self { grpc_addr, http_addr, metrics_addr, database, simulator, clock, orchestrator, server }
    }

    /// Stops the app and starts a new one on the same database and simulator (the default test
    /// configuration): what survives is what the database kept.
    pub async fn restart(self) -> Self {
        self.restart_with(|_| {}).await
    }

    /// [`Self::restart`] with the test configuration changed by `customize`, as a new
    /// deployment with other settings would start.
    pub async fn restart_with(self, customize: impl FnOnce(&mut Config)) -> Self {
        let TestApp { database, simulator, server, orchestrator, .. } = self;
        server.stop().await;
        drop(orchestrator);
        Self::spawn_on(database, simulator, customize).await
    }

    /// Stops the app (a clean shutdown) and hands back its database for checks after it.
    pub async fn stop_keeping_database(self) -> TestDatabase {
        let TestApp { database, server, orchestrator, .. } = self;
        server.stop().await;
        drop(orchestrator);
        database
    }

    /// Creates (`POST /v1/payment_intents`) the simulator received, in order.
    pub async fn creates(&self) -> Vec<RequestLogEntry> {
        let log = self.sim().requests().await.unwrap();
        log.into_iter().filter(|r| r.method == "POST" && r.path == "/v1/payment_intents").collect()
    }

    /// Refund creates (`POST /v1/refunds`) the simulator received, in order.
    pub async fn refund_creates(&self) -> Vec<RequestLogEntry> {
        let log = self.sim().requests().await.unwrap();
        log.into_iter().filter(|r| r.method == "POST" && r.path == "/v1/refunds").collect()
    }

    /// Refunds as the `orders` consumer.
    pub async fn refund(&self, request: proto::RefundRequest) -> Result<proto::RefundResponse, Status> {
        self.refund_as(ORDERS_TOKEN, request).await
    }

    pub async fn refund_as(&self, token: &str, request: proto::RefundRequest) -> Result<proto::RefundResponse, Status> {
        let mut client = self.client().await;
        client.refund(authed(token, request)).await.map(|response| response.into_inner())
    }

    pub fn sim(&self) -> SimControl {
        self.simulator.control()
    }

    pub async fn client(&self) -> PaymentsClient<Channel> {
        let endpoint = format!("http://{}", self.grpc_addr);
        PaymentsClient::connect(endpoint).await.expect("gRPC connects")
    }

    /// Charges as the `orders` consumer.
    pub async fn charge(&self, request: ChargeRequest) -> Result<ChargeResponse, Status> {
        self.charge_as(ORDERS_TOKEN, request).await
    }

    pub async fn charge_as(&self, token: &str, request: ChargeRequest) -> Result<ChargeResponse, Status> {
        let mut client = self.client().await;
        client.charge(authed(token, request)).await.map(|response| response.into_inner())
    }

    /// The `orders` consumer's attempt for `operation_key`, read through GetAttempt.
    pub async fn attempt_of(&self, operation_key: &str) -> proto::Attempt {
        let selector = Some(get_attempt_request::Selector::OperationKey(operation_key.to_owned()));
        let mut client = self.client().await;
        let response = client.get_attempt(authed(ORDERS_TOKEN, GetAttemptRequest { selector })).await;
        response.expect("the attempt exists").into_inner().attempt.expect("an attempt")
    }

    /// Rows in payment_attempts, counted in the database itself (either backend).
    pub async fn attempt_rows(&self) -> i64 {
        self.database.attempt_rows().await
    }

    pub async fn stop(self) {
        self.server.stop().await;
    }
}

pub async fn spawn_simulator(config: SimulatorConfig) -> SimulatorHandle {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    simulator::spawn(config, listener).await.expect("simulator starts")
}

pub fn authed<T>(token: &str, message: T) -> Request<T> {
    let mut request = Request::new(message);
    request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    request
}

/// A valid request for `operation_key`: 1000 usd minor units with a card that succeeds.
pub fn charge_request(operation_key: &str) -> ChargeRequest {
    ChargeRequest {
        operation_key: operation_key.to_owned(),
        amount_minor: 1_000,
        currency: "usd".to_owned(),
        payment_method: "pm_card_visa".to_owned(),
        customer: None,
        description: Some("test order".to_owned()),
        metadata: [("order_id".to_owned(), operation_key.to_owned())].into(),
        attempt: None,
    }
}

/// A refund `operation_key` of the charge operation `charge_operation_key`; `amount_minor`
/// `None` refunds what is left.
pub fn refund_request(operation_key: &str, charge_operation_key: &str, amount_minor: Option<i64>) -> proto::RefundRequest {
    proto::RefundRequest {
        operation_key: operation_key.to_owned(),
        charge: Some(proto::refund_request::Charge::ChargeOperationKey(charge_operation_key.to_owned())),
        amount_minor,
        reason: Some("requested_by_customer".to_owned()),
        metadata: [("return_id".to_owned(), operation_key.to_owned())].into(),
    }
}

/// Attempt `number` of `operation` (issue 16) with `payment_method`, otherwise as
/// [`charge_request`].
pub fn attempt_request(operation_key: &str, number: u32, payment_method: &str) -> ChargeRequest {
    ChargeRequest { attempt: Some(number), payment_method: payment_method.to_owned(), ..charge_request(operation_key) }
}

pub fn status_of(response: &ChargeResponse) -> proto::AttemptStatus {
    proto::AttemptStatus::try_from(response.attempt.as_ref().unwrap().status).unwrap()
}

pub fn outcome_of(response: &ChargeResponse) -> proto::ChargeOutcome {
    proto::ChargeOutcome::try_from(response.outcome).unwrap()
}

pub fn error_code(status: &Status) -> String {
    status
        .metadata()
        .get(chargeguard::grpc::ERROR_CODE_METADATA)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}
