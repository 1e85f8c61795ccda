//! Builds the application from configuration: store, provider, orchestrator, the gRPC and HTTP
//! servers, and the background jobs; binds the listeners (port 0 in tests) and runs until told
//! to stop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::grpc::{
    Authenticator, ConsumerLimitLayer, ConsumerLimits, Operators, PaymentsService, ReportsService, RequestDurationLayer,
    proto, request_size_layer, undecodable_request_layer,
};
use crate::orchestrator::Orchestrator;
use crate::provider::{PaymentProvider, StripeProvider, StripeProviderConfig};
use crate::report::{ReportSettings, Reporter};
use crate::secret::Secret;
use crate::simulator::SimulatorHandle;
use crate::store::{AttemptStore, InboxStore, OpenedStore, ReportStore};
use crate::sweep_job::SweepJob;
use crate::tls::{CurrentConfig, HttpsListener, Port, Reloader, TlsFiles};

/// How often the health service re-checks the database.
const HEALTH_CHECK_INTERVAL: Duration = Duration::from_secs(2);
/// Health service names that follow the database: NOT_SERVING while `store.ping()` fails.
const READINESS_SERVICES: [&str; 3] =
    ["", proto::payments_server::SERVICE_NAME, proto::reports_server::SERVICE_NAME];
/// A health service name that is SERVING while the process runs, whatever the database does:
/// for liveness probes, which must not restart a process because its database is down.
pub const LIVENESS_SERVICE: &str = "liveness";
/// How often the metrics recorder drains its histograms.
const METRICS_UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// What `serve` runs besides its listeners: the store, the provider (or the built-in simulator)
/// and the flows. `sweep --once` builds only this.
pub struct Core {
    config: Config,
    orchestrator: Orchestrator,
    store: Arc<dyn AttemptStore>,
    reporter: Reporter,
    inbox: Arc<dyn InboxStore>,
    /// The built-in simulator, when no provider key is configured; stopped after the servers.
    simulator: Option<SimulatorHandle>,
}

pub struct Application {
    core: Core,
    grpc_listener: TcpListener,
    http_listener: TcpListener,
    /// `server.metrics_listen`, when configured.
    metrics_listener: Option<TcpListener>,
    /// `None`: the port speaks plaintext.
    grpc_tls: Option<CurrentConfig>,
    http_tls: Option<CurrentConfig>,
    shutdown: CancellationToken,
}

impl Core {
    pub async fn build(mut config: Config, clock: Arc<dyn Clock>) -> anyhow::Result<Self> {
        config.validate()?;
        let simulator = start_embedded_simulator(&mut config).await?;
        add_demo_consumer(&mut config, simulator.as_ref())?;
        add_demo_operator(&mut config, simulator.as_ref())?;
        let location = crate::store::DatabaseLocation::from_config(&config.database)?;
        tracing::info!("attempt store: {}", location.describe());
        let opened = crate::store::open(&config.database).await.context("opening the attempt store")?;
        if config.database.migrate_on_start {
            opened.migrate().await.context("applying migrations")?;
        }
        // Reports stage and join in the database, on either store.
        let report_store: Arc<dyn ReportStore> = match &opened {
            OpenedStore::Postgres(postgres) => Arc::new(postgres.clone()),
            OpenedStore::Sqlite(sqlite) => Arc::new(sqlite.clone()),
        };
        let inbox: Arc<dyn InboxStore> = match &opened {
            OpenedStore::Postgres(postgres) => Arc::new(postgres.clone()),
            OpenedStore::Sqlite(sqlite) => Arc::new(sqlite.clone()),
        };
        let store: Arc<dyn AttemptStore> = opened.into_store();
        let provider: Arc<dyn PaymentProvider> = Arc::new(StripeProvider::new(StripeProviderConfig::from_config(&config.provider)?)?);
        let reporter =
            Reporter::new(report_store, provider.clone(), clock.clone(), ReportSettings::from_config(&config.report));
        let orchestrator = Orchestrator::new(store.clone(), provider, clock, config.orchestrator_settings());
        Ok(Self { config, orchestrator, store, inbox, reporter, simulator })
    }

    pub fn orchestrator(&self) -> &Orchestrator {
        &self.orchestrator
    }

    /// Stops the built-in simulator, then closes the database (a clean close leaves no SQLite
    /// `-wal` file). Call when nothing uses either any more.
    pub async fn close(self) {
        if let Some(simulator) = self.simulator {
            simulator.shutdown().await;
        }
        self.store.close().await;
    }
}

impl Application {
    pub async fn build(config: Config, clock: Arc<dyn Clock>) -> anyhow::Result<Self> {
        let core = Core::build(config, clock).await?;
        let config = &core.config;
        let grpc_listener = TcpListener::bind(config.server.grpc_listen)
            .await
            .with_context(|| format!("binding gRPC on {}", config.server.grpc_listen))?;
        let http_listener = TcpListener::bind(config.server.http_listen)
            .await
            .with_context(|| format!("binding HTTP on {}", config.server.http_listen))?;
        let metrics_listener = match config.server.metrics_listen {
            Some(listen) => Some(TcpListener::bind(listen).await.with_context(|| format!("binding metrics on {listen} (server.metrics_listen)"))?),
            None => None,
        };
        let (grpc_tls, http_tls) = load_tls(&config.server)?;
        let mut core = core;
        if let Some(simulator) = &core.simulator {
            let http_addr = http_listener.local_addr().context("the HTTP listener's address")?;
            deliver_simulator_webhooks_here(&mut core.config, simulator, http_addr, http_tls.is_some());
        }
        Ok(Self { core, grpc_listener, http_listener, metrics_listener, grpc_tls, http_tls, shutdown: CancellationToken::new() })
    }

    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_listener.local_addr().expect("bound listener has an address")
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.http_listener.local_addr().expect("bound listener has an address")
    }

    /// The metrics listener's address, when `server.metrics_listen` is configured.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_listener.as_ref().map(|listener| listener.local_addr().expect("bound listener has an address"))
    }

    pub fn orchestrator(&self) -> &Orchestrator {
        &self.core.orchestrator
    }

    /// Cancel to stop: in-flight calls finish, then the servers return.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    pub async fn run(self) -> anyhow::Result<()> {
        let core = &self.core;
        let metrics = crate::telemetry::metrics_handle();
        crate::telemetry::register_alert_counters();
        let (health_reporter, health_service) = tonic_health::server::health_reporter();
        let reflection_builder = || {
            tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        };
        let reflection = reflection_builder().build_v1().context("building the reflection service")?;
        // Older grpcurl, Postman and grpcui still ask v1alpha.
        let reflection_v1alpha = reflection_builder().build_v1alpha().context("building the v1alpha reflection service")?;
        let authenticator = Authenticator::from_config(&core.config.consumers)?;
        let limits = ConsumerLimitLayer::new(authenticator.clone(), ConsumerLimits::from_config(&core.config.consumers)?);
        // Every service gets the same decode limit on purpose, so the refusal can name it.
        let request_bytes_max = core.config.server.grpc_request_bytes_max;
        let health_service = health_service.max_decoding_message_size(request_bytes_max);
        let reflection = reflection.max_decoding_message_size(request_bytes_max);
        let reflection_v1alpha = reflection_v1alpha.max_decoding_message_size(request_bytes_max);
        let finance_logins = crate::finance::Logins::default();
        let finance_links = crate::grpc::FinanceLinks { logins: finance_logins.clone(), http_port: self.http_addr().port(), http_tls: self.http_tls.is_some() };
        let reports =
            ReportsService::new(core.reporter.clone(), Operators::from_config(&core.config.operators), authenticator.clone())
                .with_finance_links(finance_links)
                .into_server()
                .max_decoding_message_size(request_bytes_max);
        let finance = crate::finance::FinanceState {
            reporter: Some(core.reporter.clone()),
            logins: finance_logins,
            operators: Operators::from_config(&core.config.operators),
            consumers: authenticator.clone(),
            secure_cookie: self.http_tls.is_some(),
        };
        let payments = PaymentsService::new(core.orchestrator.clone(), authenticator)
            .into_server()
            .max_decoding_message_size(request_bytes_max);

        let (grpc_addr, http_addr, metrics_addr) = (self.grpc_addr(), self.http_addr(), self.metrics_addr());
        let shutdown = self.shutdown.clone();
        let store = core.store.clone();
        health_reporter.set_service_status(LIVENESS_SERVICE, tonic_health::ServingStatus::Serving).await;
        let readiness = READINESS_SERVICES.to_vec();
        // Not ready until the database has answered once.
        for service in READINESS_SERVICES {
            health_reporter.set_service_status(service, tonic_health::ServingStatus::NotServing).await;
        }
        let mut health_task = tokio::spawn({
            let shutdown = shutdown.clone();
            async move {
                let mut interval = tokio::time::interval(HEALTH_CHECK_INTERVAL);
                loop {
                    tokio::select! {
                        _ = shutdown.cancelled() => {
                            for service in readiness.iter().copied().chain([LIVENESS_SERVICE]) {
                                health_reporter.set_service_status(service, tonic_health::ServingStatus::NotServing).await;
                            }
                            return;
                        }
                        _ = interval.tick() => {}
                    }
                    let serving = store.ping().await.is_ok();
                    for service in readiness.iter().copied() {
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

        let webhooks = crate::webhook::Webhooks::new(
            core.inbox.clone(),
            core.orchestrator.clock().clone(),
            core.config.webhook_settings(),
            core.orchestrator.outcome_cache().clone(),
        );
        let webhook_jobs = webhooks.spawn_jobs(&shutdown);

        let server = &core.config.server;
        let grpc_router = tonic::transport::Server::builder()
            .timeout(Duration::from_millis(server.request_timeout_ms))
            .concurrency_limit_per_connection(server.concurrent_requests_max)
            .http2_max_header_list_size(server.grpc_metadata_bytes_max)
            .layer(RequestDurationLayer::new(proto::FILE_DESCRIPTOR_SET))
            .layer(request_size_layer(request_bytes_max))
            .layer(undecodable_request_layer())
            .layer(limits)
            .add_service(health_service)
            .add_service(reflection)
            .add_service(reflection_v1alpha)
            .add_service(payments)
            .add_service(reports);
        let grpc_shutdown = shutdown.clone().cancelled_owned();
        let handshake_timeout = Duration::from_millis(server.tls_handshake_timeout_ms);
        let grpc: std::pin::Pin<Box<dyn Future<Output = Result<(), tonic::transport::Error>> + Send>> = match &self.grpc_tls {
            Some(tls) => {
                let accepted = crate::tls::accept_loop(self.grpc_listener, tls.clone(), handshake_timeout, shutdown.clone());
                let incoming = tokio_stream::StreamExt::map(tokio_stream::wrappers::ReceiverStream::new(accepted), |(stream, _)| {
                    Ok::<_, std::io::Error>(stream)
                });
                Box::pin(grpc_router.serve_with_incoming_shutdown(incoming, grpc_shutdown))
            }
            None => Box::pin(grpc_router.serve_with_incoming_shutdown(
                // Nagle's algorithm with delayed ACKs adds ~40 ms to small gRPC replies.
                tonic::transport::server::TcpIncoming::from(self.grpc_listener).with_nodelay(Some(true)),
                grpc_shutdown,
            )),
        };
        let mut http_router = crate::http::router(crate::http::HttpState { store: core.store.clone() }, metrics_addr.is_none());
        // Signatures carry the sender's wall-clock time: checked against ours, not the business
        // clock that tests move.
        http_router = http_router.merge(webhooks.router(Arc::new(SystemClock)));
        let http_router = crate::http::with_request_timeout(http_router, Duration::from_millis(server.http_request_timeout_ms));
        // Headers are bounded by the same time (hyper's header_read_timeout in http::serve).
        let http_request_timeout = Duration::from_millis(server.http_request_timeout_ms);
        // The finance page, under the same request timeout.
        let http_router = http_router.merge(crate::http::with_request_timeout(crate::finance::router(finance), http_request_timeout));
        let http: std::pin::Pin<Box<dyn Future<Output = std::io::Result<()>> + Send>> = match &self.http_tls {
            Some(tls) => {
                let accepted = crate::tls::accept_loop(self.http_listener, tls.clone(), handshake_timeout, shutdown.clone());
                let listener = HttpsListener::new(accepted, http_addr);
                let served = crate::http::serve(listener, http_router, http_request_timeout, shutdown.clone());
                Box::pin(async move {
                    served.await;
                    Ok(())
                })
            }
            None => {
                let served = crate::http::serve(self.http_listener, http_router, http_request_timeout, shutdown.clone());
                Box::pin(async move {
                    served.await;
                    Ok(())
                })
            }
        };
        let metrics_server = self.metrics_listener.map(|listener| {
            tokio::spawn(crate::http::serve(listener, crate::http::metrics_router(), http_request_timeout, shutdown.clone()))
        });
        let reloader = TlsFiles::from_config(server).map(|files| {
            let ports = self.grpc_tls.iter().chain(self.http_tls.iter()).cloned().collect();
            Reloader::new(files, ports, Duration::from_millis(server.tls_reload_interval_ms)).spawn(shutdown.clone())
        });
        let grpc = tokio::spawn(grpc);
        let http = tokio::spawn(http);
        let sweep = if core.config.sweep.enabled {
            Some(SweepJob::start(core.orchestrator.clone(), &core.config.sweep.schedule, shutdown.clone()).await?)
        } else {
            None
        };
        // The bound addresses, not the configured ones: with port 0 this line is how a parent
        // process (the crash-point tests) learns where to connect.
        match metrics_addr {
            Some(metrics) => tracing::info!(grpc = %grpc_addr, http = %http_addr, %metrics, "chargeguard serving"),
            None => tracing::info!(grpc = %grpc_addr, http = %http_addr, "chargeguard serving"),
        }
        shutdown.cancelled().await;
        let grace = Duration::from_millis(core.config.server.shutdown_grace_ms);
        let drained = tokio::time::timeout(grace, async {
            if let Some(sweep) = sweep {
                sweep.stop().await;
            }
            let grpc = grpc.await;
            let http = http.await;
            if let Some(metrics_server) = metrics_server {
                let _ = metrics_server.await;
            }
            // The webhook jobs stop between batches; whatever they left claimed is finished by
            // the next worker after the claim expires.
            for job in webhook_jobs {
                let _ = job.await;
            }
            // The health task ends by itself once its ping returns. Aborting it mid-ping would
            // hand its connection back from a spawned task, which can close it after
            // `core.close()` returned: SQLite's last connection then folds the write-ahead log
            // away too late (seen as a `-wal` file left behind, 3 stops in 12 under load).
            let _ = (&mut health_task).await;
            (grpc, http)
        })
        .await;
        health_task.abort();
        upkeep_task.abort();
        if let Some(reloader) = reloader {
            reloader.abort();
        }
        // After the servers: an in-flight call may still be talking to the simulator and the
        // database. Drained, nothing uses either; otherwise leave the database's connections be.
        if drained.is_ok() {
            self.core.close().await;
        } else if let Some(simulator) = self.core.simulator {
            simulator.shutdown().await;
        }
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

/// The TLS configurations of the two ports, read and checked at start (a bad file stops `serve`
/// naming the option), and a warning for each port that speaks plaintext beyond loopback
/// (`server.require_tls` refuses that in `Config::validate`).
fn load_tls(server: &crate::config::ServerConfig) -> anyhow::Result<(Option<CurrentConfig>, Option<CurrentConfig>)> {
    let files = TlsFiles::from_config(server);
    let grpc = files.as_ref().map(|files| CurrentConfig::load(files, Port::Grpc)).transpose()?;
    let http = match &files {
        Some(files) if server.tls_on_http => Some(CurrentConfig::load(files, Port::Http)?),
        _ => None,
    };
    for (option, address, tls) in [("server.grpc_listen", server.grpc_listen, grpc.is_some()), ("server.http_listen", server.http_listen, http.is_some())] {
        if !tls && !address.ip().is_loopback() {
            tracing::warn!(%address, "{option} {address} is not loopback and speaks plaintext: bearer tokens and payment data travel in the clear; set server.tls_cert_file and server.tls_key_file (server.require_tls = true refuses this)");
        }
    }
    if let Some(files) = &files {
        tracing::info!(cert = %files.cert.display(), client_certificates = files.client_ca.is_some(), http = http.is_some(), "TLS on the gRPC port");
    }
    Ok((grpc, http))
}

/// With no provider key configured, starts the built-in Stripe simulator in this process and
/// points the provider at it with the simulator's key: the first run needs no Stripe account.
/// Said loudly at start, since nothing charged there is real.
async fn start_embedded_simulator(config: &mut Config) -> anyhow::Result<Option<SimulatorHandle>> {
    if config.provider.api_key.is_some() {
        return Ok(None);
    }
    let listen = config.embedded.simulator_listen;
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding the built-in simulator on {listen} (embedded.simulator_listen)"))?;
    let simulator = crate::simulator::spawn(crate::simulator::SimulatorConfig::default(), listener).await?;
    config.provider.api_key = Some(Secret::new(crate::simulator::DEFAULT_API_KEY));
    config.provider.base_url = Some(simulator.base_url());
    // `chargeguard report` from the same directory lists this simulator.
    crate::embedded::record_simulator_url(&config.embedded.demo_token_file, &simulator.base_url())
        .context("recording the built-in simulator's URL beside embedded.demo_token_file")?;
    tracing::warn!(
        simulator_url = %simulator.base_url(),
        "no provider.api_key configured: charging the built-in Stripe simulator at {}, not Stripe; no real money moves",
        simulator.base_url()
    );
    Ok(Some(simulator))
}

/// In the first run (the built-in simulator, no provider key), the simulator's webhooks go to
/// this server's own `POST /webhooks/stripe`, signed with a secret generated now, held in memory
/// only (never logged, never written) and added to `webhooks.secrets`: a 3-D Secure payment
/// authenticated at the simulator, or a `processing` one settling, completes by webhook as in
/// production, not at the next sweep. Not over a TLS HTTP port, whose certificate the
/// simulator's client would have to trust.
fn deliver_simulator_webhooks_here(config: &mut Config, simulator: &SimulatorHandle, http_addr: SocketAddr, http_tls: bool) {
    if http_tls {
        tracing::info!("the built-in simulator's webhooks are not delivered: the HTTP port speaks TLS");
        return;
    }
    // A wildcard listen address is reached on loopback, of the same family.
    let ip = match http_addr.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
        ip => ip,
    };
    let url = format!("http://{}{}", SocketAddr::new(ip, http_addr.port()), crate::webhook::route::PATH);
    let secret = generated_webhook_secret();
    simulator.set_webhook_target(Some(crate::simulator::WebhookTarget { url: url.clone(), secret: secret.expose().to_owned() }));
    config.webhooks.secrets.push(secret);
    tracing::info!(%url, "the built-in simulator delivers its webhooks to {url}, signed with a secret generated at start");
}

/// `whsec_` and 32 bytes from the operating system's random source, hex-encoded.
fn generated_webhook_secret() -> Secret {
    use rand::RngCore;
    let mut bytes = [0_u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    Secret::new(format!("whsec_{}", hex::encode(bytes)))
}

/// With no consumers configured and only the built-in simulator to charge, authenticates the
/// demo consumer whose token is in a file only the user can read (`crate::embedded`). Never
/// when a consumer or a real provider key is configured.
fn add_demo_consumer(config: &mut Config, simulator: Option<&SimulatorHandle>) -> anyhow::Result<()> {
    if !config.consumers.is_empty() {
        return Ok(());
    }
    if simulator.is_none() {
        tracing::warn!("no consumers configured: every call will be refused (see consumers in docs/CONFIGURATION.md)");
        return Ok(());
    }
    let path = &config.embedded.demo_token_file;
    let consumer = crate::embedded::demo_consumer(path).context("preparing the demo consumer (embedded.demo_token_file)")?;
    tracing::warn!(
        consumer = %consumer.name,
        token_file = %path.display(),
        "no consumers configured: callers authenticate as {:?} with the token in {} (readable only by you); the CLI client reads it from there",
        consumer.name,
        path.display()
    );
    config.consumers.push(consumer);
    Ok(())
}

/// Beside the demo consumer, and under the same conditions (no operators configured, only the
/// built-in simulator), an admin operator for the finance page, whose token is in a file of its
/// own (`crate::embedded::demo_operator`). The log says the command that opens the page; the
/// token and the link are never logged.
fn add_demo_operator(config: &mut Config, simulator: Option<&SimulatorHandle>) -> anyhow::Result<()> {
    if !config.operators.is_empty() || simulator.is_none() {
        return Ok(());
    }
    let (operator, path) = crate::embedded::demo_operator(&config.embedded.demo_token_file)
        .context("preparing the demo operator (beside embedded.demo_token_file)")?;
    tracing::warn!(
        operator = %operator.name,
        token_file = %path.display(),
        "no operators configured: the finance page is open to {:?}, whose token is in {}; run `chargeguard finance-link` here for a one-time login link",
        operator.name,
        path.display()
    );
    config.operators.push(operator);
    Ok(())
}
