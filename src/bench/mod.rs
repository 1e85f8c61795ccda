//! `chargeguard bench`: measures the service from outside, the way BENCHMARKS.md quotes it.
//!
//! - `bench charge` drives `Charge` over gRPC (the generated client) at a given concurrency, for
//!   a duration or a request count, with a mix of new operations and duplicates; it prints
//!   throughput, latency percentiles and outcome counts, and one JSON line for scripts.
//! - `bench claim` times the sweep's claim query over the rows due now; `bench seed` fills a
//!   benchmark database with settled and stuck rows for it.
//!
//! `bench/run.sh` runs both next to pgbench on the same PostgreSQL. Every loop here is bounded
//! (concurrency, duration, count, keys kept) so a mistyped flag cannot run away.

pub mod claim;
pub mod load;
pub mod mix;
#[cfg(test)]
mod pgbench_drift;
pub mod report;
pub mod seed;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;

use crate::config::Config;
use crate::domain::{ChargeParams, ConsumerName, Currency, Description, Metadata, PaymentMethodId};
use crate::provider::{StripeProvider, StripeProviderConfig};
use crate::secret::Secret;
use crate::store::PostgresStore;
use crate::store::postgres::PostgresPoolOptions;

/// The variable holding the bearer token: a token never goes on the command line.
pub const TOKEN_ENV: &str = "CHARGEGUARD_BENCH_TOKEN";
/// The provider's API key for `bench charge --provider-url`.
pub const PROVIDER_KEY_ENV: &str = "CHARGEGUARD_BENCH_PROVIDER_API_KEY";

#[derive(Debug, clap::Subcommand)]
// Parsed once per process: the size of the largest variant costs nothing worth a Box.
#[allow(clippy::large_enum_variant)]
pub enum BenchCommand {
    /// Calls `Charge` over gRPC in a closed loop and reports throughput and latency.
    Charge(ChargeArgs),
    /// Times the sweep's claim query over every row due now (leases them; calls no provider).
    Claim(ClaimArgs),
    /// Seeds a benchmark database: settled rows to grow the table, stuck rows for the sweep.
    Seed(SeedArgs),
}

#[derive(Debug, clap::Args)]
pub struct ChargeArgs {
    /// TLS to the service: --ca-file, --cert-file, --key-file (an https:// endpoint uses the
    /// system's web roots).
    #[command(flatten)]
    pub tls: crate::tls::ClientTlsArgs,
    /// chargeguard's gRPC address. The bearer token comes from CHARGEGUARD_BENCH_TOKEN.
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    pub endpoint: String,
    /// Names the run in the report.
    #[arg(long, default_value = "charge")]
    pub label: String,
    /// Callers, each with one call in flight.
    #[arg(long, default_value_t = 16)]
    pub concurrency: u32,
    /// gRPC (HTTP/2) connections the callers share, round-robin.
    #[arg(long, default_value_t = 4)]
    pub connections: u32,
    /// Length of the measured phase. Without --requests the default is 10 s.
    #[arg(long)]
    pub duration_seconds: Option<u64>,
    /// Calls in the measured phase; with --duration-seconds, whichever ends first.
    #[arg(long)]
    pub requests: Option<u64>,
    /// Unmeasured calls before the measured phase (connections, caches, plans warm up).
    #[arg(long, default_value_t = 0)]
    pub warmup_seconds: u64,
    /// Share of calls that re-send an already-charged operation key.
    #[arg(long, default_value_t = 0)]
    pub duplicate_percent: u8,
    /// New keys charged before the warm-up, so duplicates have something to repeat.
    #[arg(long, default_value_t = 0)]
    pub prime_keys: u64,
    /// Most charged keys remembered for duplicates.
    #[arg(long, default_value_t = 100_000)]
    pub key_pool_capacity: usize,
    /// Prefix of every operation key; a random one by default, so reruns send new keys.
    #[arg(long)]
    pub key_prefix: Option<String>,
    #[arg(long, default_value = "pm_card_visa")]
    pub payment_method: String,
    #[arg(long, default_value_t = 1_000)]
    pub amount_minor: i64,
    /// Client-side bound on one call.
    #[arg(long, default_value_t = 30_000)]
    pub request_timeout_ms: u64,
    /// Seed of the duplicate mix.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Call `grpc.health.v1.Health/Check` instead of `Charge` (the same connections, nothing
    /// behind it): the ceiling of any unary call of this server on this machine.
    #[arg(long, conflicts_with = "provider_url")]
    pub health_check: bool,
    /// Create payment intents straight at this provider base URL (the simulator's, ending in
    /// `/`) through chargeguard's provider client instead of calling the service: the
    /// provider's own latency at this concurrency. The key comes from
    /// CHARGEGUARD_BENCH_PROVIDER_API_KEY.
    #[arg(long)]
    pub provider_url: Option<String>,
    /// Also write the JSON report to this file.
    #[arg(long)]
    pub json_out: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct ClaimArgs {
    /// Rows claimed per statement, like the sweep's batch.
    #[arg(long, default_value_t = 100)]
    pub batch_max: u32,
    /// Stop after this many rows.
    #[arg(long, default_value_t = 1_000_000)]
    pub rows_max: u64,
    /// Lease put on the claimed rows.
    #[arg(long, default_value_t = 3_600)]
    pub lease_seconds: u64,
    /// Also write the JSON report to this file.
    #[arg(long)]
    pub json_out: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct SeedArgs {
    /// Settled (succeeded or failed) rows to add.
    #[arg(long, default_value_t = 0)]
    pub settled: u64,
    /// Stuck rows to add: pending, due now, unleased, key window open.
    #[arg(long, default_value_t = 0)]
    pub stuck: u64,
    /// First end every unfinished seeded row (as failed), so only the new stuck rows are due.
    #[arg(long)]
    pub settle_unfinished: bool,
    /// Also write the JSON report to this file.
    #[arg(long)]
    pub json_out: Option<PathBuf>,
}

pub async fn run(command: BenchCommand, config_file: Option<&Path>) -> anyhow::Result<()> {
    match command {
        BenchCommand::Charge(args) => run_charge(args).await,
        BenchCommand::Claim(args) => run_claim(args, config_file).await,
        BenchCommand::Seed(args) => run_seed(args, config_file).await,
    }
}

async fn run_charge(args: ChargeArgs) -> anyhow::Result<()> {
    let provider = args.provider_url.as_deref().map(direct_provider).transpose()?;
    // A provider run calls no service: it needs no token.
    let token = match &provider {
        Some(_) => "unused".to_owned(),
        None => std::env::var(TOKEN_ENV).with_context(|| format!("{TOKEN_ENV} is not set"))?,
    };
    let duration_seconds = match (args.duration_seconds, args.requests) {
        (None, None) => Some(10),
        (duration, _) => duration,
    };
    let endpoint = args.endpoint.clone();
    let settings = load::LoadSettings::new(load::LoadPlan {
        label: args.label,
        endpoint: args.endpoint,
        token: Secret::new(token),
        concurrency: args.concurrency,
        connections: args.connections,
        duration_seconds,
        requests: args.requests,
        warmup_seconds: args.warmup_seconds,
        duplicate_percent: args.duplicate_percent,
        prime_keys: args.prime_keys,
        key_pool_capacity: args.key_pool_capacity,
        key_prefix: args.key_prefix,
        payment_method: args.payment_method,
        amount_minor: args.amount_minor,
        request_timeout_ms: args.request_timeout_ms,
        seed: args.seed,
        target: if provider.is_some() {
            load::CallTarget::ProviderCreate
        } else if args.health_check {
            load::CallTarget::HealthCheck
        } else {
            load::CallTarget::Charge
        },
        tls: if args.tls.wanted(&endpoint) { Some(args.tls.client_config().map_err(anyhow::Error::msg)?) } else { None },
    })?;
    let report = load::run(settings, provider).await?;
    emit(&report.to_string(), &report.json_line(), args.json_out.as_deref())?;
    // A row whose every call failed still has a rate and a latency: the scripts that read the
    // report must not take it for a figure of charges (bench/run.sh stops on this exit).
    if report.every_call_failed() {
        anyhow::bail!(
            "every one of the {} calls failed (outcomes above): the figures are of failures, not of answers",
            report.requests
        );
    }
    Ok(())
}

/// The provider client the service would build for `base_url`, and the request `Charge` sends.
fn direct_provider(base_url: &str) -> anyhow::Result<load::DirectProvider> {
    let api_key = std::env::var(PROVIDER_KEY_ENV).with_context(|| format!("{PROVIDER_KEY_ENV} is not set"))?;
    let provider_config = crate::config::ProviderConfig {
        api_key: Some(Secret::new(api_key)),
        base_url: Some(base_url.to_owned()),
        ..Default::default()
    };
    let provider = StripeProvider::new(StripeProviderConfig::from_config(&provider_config)?)?;
    let metadata = [("bench".to_owned(), "provider".to_owned())];
    let params = ChargeParams::new(
        1_000,
        i64::MAX,
        Currency::parse("usd")?,
        PaymentMethodId::parse("pm_card_visa")?,
        None,
        Some(Description::parse("chargeguard bench")?),
        Metadata::parse(metadata.iter().map(|(key, value)| (key, value)))?,
    )
    ?;
    Ok(load::DirectProvider {
        provider: std::sync::Arc::new(provider),
        consumer: ConsumerName::parse("bench")?,
        params,
    })
}

async fn run_claim(args: ClaimArgs, config_file: Option<&Path>) -> anyhow::Result<()> {
    let settings = claim::ClaimSettings::new(
        args.batch_max,
        args.rows_max,
        Duration::from_secs(args.lease_seconds),
    )
    .map_err(anyhow::Error::msg)?;
    let store = connect_store(config_file, None)?;
    let report = claim::run(&store, &settings).await?;
    emit(&report.to_string(), &report.json_line(), args.json_out.as_deref())
}

async fn run_seed(args: SeedArgs, config_file: Option<&Path>) -> anyhow::Result<()> {
    let settings = seed::SeedSettings::new(args.settled, args.stuck, args.settle_unfinished)
        .map_err(anyhow::Error::msg)?;
    // Bulk statements run far longer than the service's statement timeout allows.
    let store = connect_store(config_file, Some(seed::SEED_STATEMENT_TIMEOUT))?;
    let report = seed::run(&store, &settings).await?;
    emit(&report.to_string(), &report.json_line(), args.json_out.as_deref())
}

/// One connection to the configured database (`CHARGEGUARD_DATABASE__URL` or the TOML file).
fn connect_store(
    config_file: Option<&Path>,
    statement_timeout: Option<Duration>,
) -> anyhow::Result<PostgresStore> {
    let config = Config::load(config_file)?;
    let url = config
        .database
        .url
        .context("database.url is not set (CHARGEGUARD_DATABASE__URL)")?;
    Ok(PostgresStore::connect_lazy(
        url.expose(),
        &PostgresPoolOptions {
            connections_max: 1,
            acquire_timeout: Duration::from_millis(config.database.acquire_timeout_ms),
            statement_timeout: statement_timeout
                .unwrap_or(Duration::from_millis(config.database.statement_timeout_ms)),
        },
    )?)
}

/// The report for people, then its JSON line, on stdout; the JSON line also in `file`. A reader
/// that went away (`chargeguard bench … | head`) is not an error: the run is done, and its file
/// is written all the same; `print!` would panic there.
fn emit(text: &str, json_line: &str, file: Option<&Path>) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match writeln!(stdout, "{text}{json_line}").and_then(|()| stdout.flush()) {
        Err(error) if error.kind() != std::io::ErrorKind::BrokenPipe => {
            return Err(error).context("writing the report to stdout");
        }
        _ => {}
    }
    if let Some(file) = file {
        std::fs::write(file, format!("{json_line}\n"))
            .with_context(|| format!("writing {}", file.display()))?;
    }
    Ok(())
}
