//! An example consumer: "order placed" events from RabbitMQ (or NATS JetStream, `--broker
//! nats`) become one charge each through chargeguard, however often they are delivered.
//!
//! The rule it follows (README "Calling chargeguard from a consumer"):
//! - the operation key comes from the order id, never from a delivery or message id;
//! - a decided answer is written to the consumer's own table, then the message is acked;
//! - "retry later" answers go back to the broker with a delay; refusals are recorded and
//!   dead-lettered, never retried;
//! - a crash anywhere is harmless: an unacked message is delivered again, and either the table
//!   already has the order's answer or chargeguard returns the stored one.

mod decision;
mod event;
mod handler;
mod ledger;
mod nats;
mod produce;
mod rabbit;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use chargeguard_client::{Backoff, Client, ClientConfig};
use clap::{Parser, Subcommand, ValueEnum};
use tokio::sync::watch;

#[derive(Debug, Parser)]
#[command(name = "order-consumer", about = "Charges placed orders through chargeguard, at most once each")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Consume order-placed events and charge them.
    Run(RunArgs),
    /// Publish N order-placed events (the demo's and the chaos test's producer).
    Publish(PublishArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BrokerKind {
    Rabbitmq,
    Nats,
}

#[derive(Debug, clap::Args)]
struct BrokerArgs {
    #[arg(long, value_enum, default_value = "rabbitmq", env = "ORDER_CONSUMER_BROKER")]
    broker: BrokerKind,
    /// RabbitMQ's address, with the virtual host.
    #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f", env = "ORDER_CONSUMER_AMQP_URL", hide_env_values = true)]
    amqp_url: String,
    #[arg(long, default_value = "nats://127.0.0.1:4222", env = "ORDER_CONSUMER_NATS_URL")]
    nats_url: String,
    /// The work queue (RabbitMQ) or subject (NATS); `<name>.dead` is the dead-letter one.
    #[arg(long, default_value = "orders", env = "ORDER_CONSUMER_QUEUE")]
    queue: String,
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    #[command(flatten)]
    broker: BrokerArgs,
    /// The consumer's own PostgreSQL database (its order_payments table).
    #[arg(long, env = "ORDER_CONSUMER_DATABASE_URL", hide_env_values = true)]
    database_url: String,
    /// chargeguard's gRPC address; repeat it to spread calls across replicas.
    #[arg(long = "chargeguard", required = true, env = "ORDER_CONSUMER_CHARGEGUARD", value_delimiter = ',')]
    endpoints: Vec<String>,
    /// A file holding the consumer's bearer token (never a flag: flags show in `ps`).
    #[arg(long, env = "ORDER_CONSUMER_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// Unacked deliveries at most (RabbitMQ prefetch, JetStream max_ack_pending).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..=1_000))]
    prefetch: u16,
    /// Deadline of one chargeguard call.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(100..=120_000))]
    call_timeout_ms: u64,
}

#[derive(Debug, clap::Args)]
struct PublishArgs {
    #[command(flatten)]
    broker: BrokerArgs,
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    count: u32,
    /// Order ids are `<prefix>-<n>`.
    #[arg(long, default_value = "order")]
    prefix: String,
    #[arg(long, default_value_t = 1999)]
    amount_minor: i64,
    #[arg(long, default_value = "usd")]
    currency: String,
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=100))]
    decline_percent: u32,
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=100))]
    duplicate_percent: u32,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Messages per second at most (RabbitMQ); as fast as confirmed when unset.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    rate_per_second: Option<u32>,
    /// Writes what was meant (one JSON line per order) for a checker.
    #[arg(long)]
    manifest: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "order_consumer=info,warn".into()))
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Run(args) => run(args).await,
        Command::Publish(args) => publish(args).await,
    }
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let token = match &args.token_file {
        Some(path) => Some(std::fs::read_to_string(path).with_context(|| format!("reading the token file {}", path.display()))?.trim().to_owned()),
        None => None,
    };
    let config = ClientConfig {
        endpoints: args.endpoints.clone(),
        token,
        call_timeout: Duration::from_millis(args.call_timeout_ms),
        ..ClientConfig::default()
    };
    let client = Client::connect_lazy(config).context("chargeguard client")?;
    let ledger = ledger::Ledger::connect_lazy(&args.database_url, u32::from(args.prefetch).clamp(2, 16)).context("consumer database")?;
    create_tables(&ledger).await;
    let handler = handler::Handler::new(client, ledger.clone(), Backoff { max: Duration::from_secs(30), ..Backoff::default() });
    let (stop_sender, stop) = watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("stopping: deliveries in hand finish, the rest return to the broker");
        let _ = stop_sender.send(true);
    });
    match args.broker.broker {
        BrokerKind::Rabbitmq => {
            let topology = rabbit::Topology { queue: args.broker.queue.clone() };
            rabbit::run(&args.broker.amqp_url, topology, args.prefetch, handler, stop).await;
        }
        BrokerKind::Nats => {
            let subjects = nats::Subjects { subject: args.broker.queue.clone() };
            nats::run(&args.broker.nats_url, subjects, args.prefetch, handler, stop).await?;
        }
    }
    ledger.close().await;
    Ok(())
}

/// The tables are created when the database first answers: a consumer started while its
/// database restarts waits rather than exits.
async fn create_tables(ledger: &ledger::Ledger) {
    let mut delay = Duration::from_millis(100);
    loop {
        match ledger.create_tables().await {
            Ok(()) => return,
            Err(error) => {
                tracing::warn!(%error, "creating the consumer's tables; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        }
    }
}

async fn shutdown_signal() {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
}

async fn publish(args: PublishArgs) -> anyhow::Result<()> {
    let plan = produce::Plan {
        count: args.count,
        prefix: args.prefix,
        amount_minor: args.amount_minor,
        currency: args.currency,
        decline_percent: args.decline_percent,
        duplicate_percent: args.duplicate_percent,
        seed: args.seed,
    };
    let (bodies, manifest) = produce::plan(&plan);
    if let Some(path) = &args.manifest {
        let lines: Vec<String> = manifest.iter().map(|planned| serde_json::to_string(planned).expect("serializes")).collect();
        std::fs::write(path, lines.join("\n") + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    match args.broker.broker {
        BrokerKind::Rabbitmq => {
            rabbit::publish(&args.broker.amqp_url, &rabbit::Topology { queue: args.broker.queue }, &bodies, args.rate_per_second).await?;
        }
        BrokerKind::Nats => {
            nats::publish(&args.broker.nats_url, &nats::Subjects { subject: args.broker.queue }, &bodies).await?;
        }
    }
    let duplicated = manifest.iter().filter(|planned| planned.published > 1).count();
    let declining = manifest.iter().filter(|planned| planned.declining).count();
    println!("{{\"orders\":{},\"messages\":{},\"published_twice\":{duplicated},\"declining\":{declining}}}", manifest.len(), bodies.len());
    Ok(())
}
