//! Builds the application from configuration: store, provider, orchestrator, the gRPC and HTTP
//! servers, and the background jobs; binds the listeners (port 0 in tests) and runs until told
//! to stop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::config::Config;
use crate::grpc::{Authenticator, PaymentsService, proto};
use crate::orchestrator::Orchestrator;
use crate::provider::{PaymentProvider, StripeProvider, StripeProviderConfig};
use crate::store::{AttemptStore, PostgresStore};
use crate::store::postgres::PostgresPoolOptions;

/// How often the health service re-checks the database.
const HEALTH_CHECK_INTERVAL: Duration = Duration::from_secs(2);
/// How often the metrics recorder drains its histograms.
const METRICS_UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

pub struct Application {
    config: Config,
    orchestrator: Orchestrator,
    store: Arc<dyn AttemptStore>,
    grpc_listener: TcpListener,
    http_listener: TcpListener,
    shutdown: CancellationToken,
}

impl Application {
    pub async fn build(config: Config, clock: Arc<dyn Clock>) -> anyhow::Result<Self> {
        config.validate()?;
        let database_url = config
            .database
            .url
            .as_ref()
            .context("database.url is not set (CHARGEGUARD_DATABASE__URL)")?;
        let postgres = PostgresStore::connect_lazy(
            database_url.expose(),
            &PostgresPoolOptions {
                connections_max: config.database.connections_max,
                acquire_timeout: Duration::from_millis(config.database.acquire_timeout_ms),
                statement_timeout: Duration::from_millis(config.database.statement_timeout_ms),
            },
        )?;
        if config.database.migrate_on_start {
            postgres.migrate().await.context("applying migrations")?;
        }
        let store: Arc<dyn AttemptStore> = Arc::new(postgres);
        let provider: Arc<dyn PaymentProvider> = Arc::new(StripeProvider::new(StripeProviderConfig {
            api_key: config.provider.api_key.clone().context("provider.api_key is not set (CHARGEGUARD_PROVIDER__API_KEY)")?,
            base_url: config.provider.base_url.clone(),
            call_timeout: Duration::from_millis(config.provider.call_timeout_ms),
            lookup_pages_max: config.provider.lookup_pages_max,
            return_url: config.provider.return_url.clone(),
        })?);
        let orchestrator = Orchestrator::new(store.clone(), provider, clock, config.orchestrator_settings());
        let grpc_listener = TcpListener::bind(config.server.grpc_listen)
            .await
            .with_context(|| format!("binding gRPC on {}", config.server.grpc_listen))?;
        let http_listener = TcpListener::bind(config.server.http_listen)
            .await
            .with_context(|| format!("binding HTTP on {}", config.server.http_listen))?;
        Ok(Self { config, orchestrator, store, grpc_listener, http_listener, shutdown: CancellationToken::new() })
    }

    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_listener.local_addr().expect("bound listener has an address")
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.http_listener.local_addr().expect("bound listener has an address")
    }

    pub fn orchestrator(&self) -> &Orchestrator {
        &self.orchestrator
    }

    /// Cancel to stop: in-flight calls finish, then the servers return.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    pub async fn run(self) -> anyhow::Result<()> {
        let metrics = crate::telemetry::metrics_handle();
        let (health_reporter, health_service) = tonic_health::server::health_reporter();
        let reflection = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()
            .context("building the reflection service")?;
        let authenticator = Authenticator::from_config(&self.config.consumers)?;
        let payments = PaymentsService::new(self.orchestrator.clone(), authenticator).into_server();

        let shutdown = self.shutdown.clone();
        let store = self.store.clone();
        let health_task = tokio::spawn({
            let shutdown = shutdown.clone();
            async move {
                let mut interval = tokio::time::interval(HEALTH_CHECK_INTERVAL);
                loop {
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = interval.tick() => {}
                    }
                    let serving = store.ping().await.is_ok();
                    for service in ["", "chargeguard.v1.Payments"] {
                        let status = if serving {
                            tonic_health::ServingStatus::Serving
                        } else {
                            tonic_health::ServingStatus::NotServing
                        };
                        health_reporter.set_service_status(service, status).await;
                    }
                }
            }
        });
        let upkeep_task = tokio::spawn({
            let shutdown = shutdown.clone();
            async move {
                let mut interval = tokio::time::interval(METRICS_UPKEEP_INTERVAL);
                loop {
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = interval.tick() => metrics.run_upkeep(),
                    }
                }
            }
        });

        let grpc = tonic::transport::Server::builder()
            .timeout(Duration::from_millis(self.config.server.request_timeout_ms))
            .concurrency_limit_per_connection(self.config.server.concurrent_requests_max)
            .add_service(health_service)
            .add_service(reflection)
            .add_service(payments)
            .serve_with_incoming_shutdown(grpc_incoming(self.grpc_listener), shutdown.clone().cancelled_owned());
        let http = axum::serve(self.http_listener, crate::http::router(crate::http::HttpState { store: self.store.clone() }))
            .with_graceful_shutdown(shutdown.clone().cancelled_owned());
        let grpc = tokio::spawn(grpc);
        let http = tokio::spawn(async move { http.await });
        tracing::info!(grpc = %self.config.server.grpc_listen, http = %self.config.server.http_listen, "chargeguard serving");
        shutdown.cancelled().await;
        let grace = Duration::from_millis(self.config.server.shutdown_grace_ms);
        let drained = tokio::time::timeout(grace, async {
            let grpc = grpc.await;
            let http = http.await;
            (grpc, http)
        })
        .await;
        health_task.abort();
        upkeep_task.abort();
        match drained {
            Ok((grpc, http)) => {
                grpc.context("gRPC server task")?.context("gRPC server")?;
                http.context("HTTP server task")?.context("HTTP server")?;
                Ok(())
            }
            Err(_) => anyhow::bail!("in-flight calls did not finish within {grace:?}"),
        }
    }
}

/// The gRPC listener's connections, with Nagle's algorithm off. `serve_with_incoming` ignores the
/// builder's `tcp_nodelay`: without this, a response's HTTP/2 frames wait for the client's
/// delayed ACK (40 ms on Linux), which capped `Charge` at a few hundred calls per second.
fn grpc_incoming(listener: TcpListener) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true))
}
