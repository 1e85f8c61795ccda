use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};

use chargeguard::clock::SystemClock;
use chargeguard::config::Config;
use chargeguard::startup::{Application, Core};
use chargeguard::telemetry::{self, LogFormat};

/// A charge allocates and frees many small buffers on several threads (HTTP/2 frames, JSON,
/// rows); under load glibc's malloc and free were 14 % of the service's CPU samples. jemalloc's
/// per-thread caches cut the service's CPU per charge by about a sixth; mimalloc cut it as much
/// but raised the p99 and the peak RSS past 64 MiB (BENCHMARKS.md, "Seventh round").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// chargeguard: at most one charge per business operation.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// TOML configuration file; `CHARGEGUARD_…` variables override it.
    #[arg(long, global = true, env = "CHARGEGUARD_CONFIG")]
    config: Option<PathBuf>,
    #[arg(long, global = true, value_enum, default_value = "text", env = "CHARGEGUARD_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs the gRPC and HTTP servers.
    Serve(ServeArgs),
    /// Applies database migrations and exits.
    Migrate,
    /// Reconciles due unfinished attempts (for cron or a Kubernetes CronJob) and prints what it did.
    Sweep(SweepArgs),
    /// Runs the Stripe-compatible simulator alone (no Stripe account needed).
    StripeSim(chargeguard::simulator::cli::SimArgs),
    /// Charges once per operation, through a running server.
    Charge(chargeguard::cli::ChargeArgs),
    /// Refunds a charge once per refund operation, through a running server.
    Refund(chargeguard::cli::RefundArgs),
    /// Reads attempts from a running server.
    Attempt(chargeguard::cli::AttemptArgs),
    /// Reconciles our attempts with the provider's payments for a period. Exit 0 clean,
    /// 1 discrepancies, 2 error.
    Report(chargeguard::report::cli::ReportArgs),
    /// Prints a one-time login link to the finance page (operators with the finance or admin
    /// role; a first-run server's demo operator by default).
    FinanceLink(chargeguard::cli::FinanceLinkArgs),
    /// Prints the SHA-256 of a bearer token, as `consumers[].token_sha256` wants it.
    HashToken {
        /// Read from standard input when omitted, so the token stays out of shell history.
        token: Option<String>,
    },
    /// Load generator and timings for BENCHMARKS.md (see bench/run.sh).
    #[command(subcommand)]
    Bench(chargeguard::bench::BenchCommand),
}

#[derive(clap::Args)]
struct ServeArgs {
    #[arg(long)]
    grpc_listen: Option<std::net::SocketAddr>,
    #[arg(long)]
    http_listen: Option<std::net::SocketAddr>,
    /// A plaintext listener for /metrics of its own (server.metrics_listen).
    #[arg(long)]
    metrics_listen: Option<std::net::SocketAddr>,
    /// Do not apply migrations at start.
    #[arg(long)]
    no_migrate: bool,
}

#[derive(clap::Args)]
struct SweepArgs {
    /// Run one pass of at most `sweep.batch_max` rows and exit; the scheduled sweep runs in `serve`.
    #[arg(long, required = true)]
    once: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Reads FAILPOINTS from the environment (crash-point tests); a no-op in normal builds.
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    telemetry::init_logging(cli.log_format);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Serve(args) => {
            let mut config = Config::load(cli.config.as_deref())?;
            if let Some(addr) = args.grpc_listen {
                config.server.grpc_listen = addr;
            }
            if let Some(addr) = args.http_listen {
                config.server.http_listen = addr;
            }
            if let Some(addr) = args.metrics_listen {
                config.server.metrics_listen = Some(addr);
            }
            if args.no_migrate {
                config.database.migrate_on_start = false;
            }
            let app = Application::build(config, Arc::new(SystemClock)).await?;
            let shutdown = app.shutdown_token();
            tokio::spawn(async move {
                wait_for_signal().await;
                tracing::info!("shutdown requested; finishing in-flight calls");
                shutdown.cancel();
            });
            app.run().await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Sweep(_) => {
            // The pass serves nothing: no listeners, only the store, the provider and the flows.
            let config = Config::load(cli.config.as_deref())?;
            let core = Core::build(config, Arc::new(SystemClock)).await?;
            let outcome = core.orchestrator().try_sweep_once().await;
            core.close().await;
            Ok(chargeguard::cli::print_answer(&format!("sweep: {}", outcome?)))
        }
        Command::Migrate => {
            let mut config = Config::load(cli.config.as_deref())?;
            config.validate()?;
            // One connection, and time for a long migration.
            config.database.connections_max = 1;
            config.database.statement_timeout_ms = 600_000;
            let location = chargeguard::store::DatabaseLocation::from_config(&config.database)?;
            let store = chargeguard::store::open(&config.database).await.context("opening the attempt store")?;
            store.migrate().await.context("applying migrations")?;
            Ok(chargeguard::cli::print_answer(&format!("migrations applied to {}", location.describe())))
        }
        Command::StripeSim(args) => {
            chargeguard::simulator::cli::run(args).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Charge(args) => Ok(chargeguard::cli::charge(args).await),
        Command::Refund(args) => Ok(chargeguard::cli::refund(args).await),
        Command::Attempt(chargeguard::cli::AttemptArgs {
            command: chargeguard::cli::AttemptCommand::Recheck(args),
        }) => {
            let config = Config::load(cli.config.as_deref())?;
            let core = Core::build(config, Arc::new(SystemClock)).await?;
            let id = chargeguard::domain::AttemptId::from_uuid(args.id);
            let rechecked = core.orchestrator().recheck(id).await;
            core.close().await;
            match rechecked {
                Ok(end) => {
                    let attempt = &end.attempt;
                    Ok(chargeguard::cli::print_answer(&format!(
                        "attempt {} is {}{}",
                        attempt.id,
                        attempt.status.as_str(),
                        end.provider_error.map(|error| format!(" (provider: {error})")).unwrap_or_default()
                    )))
                }
                Err(error) => {
                    eprintln!("recheck failed: {error}");
                    Ok(ExitCode::from(1))
                }
            }
        }
        Command::Attempt(args) => Ok(chargeguard::cli::attempt(args).await),
        Command::Report(args) => Ok(chargeguard::report::cli::run(cli.config.as_deref(), args).await),
        Command::FinanceLink(args) => Ok(chargeguard::cli::finance_link(args).await),
        Command::HashToken { token } => {
            let token = match token {
                Some(token) => token,
                None => {
                    let mut line = String::new();
                    std::io::stdin().read_line(&mut line)?;
                    line.trim().to_owned()
                }
            };
            anyhow::ensure!(!token.is_empty(), "empty token");
            Ok(chargeguard::cli::print_answer(&chargeguard::grpc::hash_token(&token)))
        }
        Command::Bench(command) => {
            chargeguard::bench::run(command, cli.config.as_deref()).await?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
