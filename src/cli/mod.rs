//! The client half of the command line: `chargeguard charge`, `chargeguard refund` and
//! `chargeguard attempt get|list`
//! talk gRPC to a running server and print a table or JSON. Like any other consumer, they know
//! the server only through the public API (`proto/`).
//!
//! Exit codes: 0 when the server answered (a declined charge included: a decline is an outcome),
//! 75 (`EX_TEMPFAIL`) when the same command is safe to retry (UNAVAILABLE: outcome unknown, in
//! progress, database down, server unreachable), 1 for any other error, 2 for usage errors.

mod connect;
mod finance;
mod render;

pub use finance::{FinanceLinkArgs, finance_link};

use std::collections::HashMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::grpc::proto;
use connect::ClientError;

/// Where the CLI looks for a server unless told otherwise: `serve`'s default gRPC address.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:50051";
/// Longest a command waits for the server's answer, unless `--timeout-ms` says otherwise.
const REQUEST_TIMEOUT_MS_DEFAULT: u64 = 60_000;
/// Most `--metadata` pairs one command takes (the server enforces its own, tighter bounds).
const METADATA_PAIRS_MAX: usize = 64;
/// `EX_TEMPFAIL` of sysexits.h: the same command may be retried.
const EXIT_RETRYABLE: u8 = 75;

/// How to reach the server; shared by every client command.
#[derive(Debug, clap::Args)]
pub struct ClientArgs {
    /// chargeguard's gRPC address.
    #[arg(long, env = "CHARGEGUARD_SERVER_URL", default_value = DEFAULT_SERVER)]
    pub server: String,
    /// Bearer token of a consumer. Prefer the environment variable: a command line is visible
    /// to other users of the machine. Never printed.
    #[arg(long, env = "CHARGEGUARD_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// File holding the bearer token (must be readable by you only). Without --token and
    /// --token-file, the demo token of a first-run server started in this directory is used.
    #[arg(long, env = "CHARGEGUARD_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Longest wait for the server's answer, in milliseconds.
    #[arg(long, default_value_t = REQUEST_TIMEOUT_MS_DEFAULT, value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub timeout_ms: u64,
    #[command(flatten)]
    pub tls: crate::tls::ClientTlsArgs,
}

#[derive(Debug, clap::Args)]
pub struct ChargeArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// The business operation, e.g. order-1234:charge. The same operation with the same
    /// parameters is the same charge, however often it is sent.
    #[arg(long)]
    pub operation: String,
    /// Which attempt of the operation this is, from 1 (the default). Attempt N + 1 is made only
    /// after attempt N failed (declined, canceled, expired), e.g. with the customer's new card;
    /// it may change the payment method, customer or amount.
    #[arg(long)]
    pub attempt: Option<u32>,
    /// Amount in the currency's minor unit (cents for usd).
    #[arg(long, allow_negative_numbers = true)]
    pub amount: i64,
    /// ISO 4217 code, e.g. usd.
    #[arg(long)]
    pub currency: String,
    /// Provider payment method id, e.g. pm_card_visa.
    #[arg(long)]
    pub payment_method: String,
    /// Provider customer id, e.g. cus_123.
    #[arg(long)]
    pub customer: Option<String>,
    /// Free text shown at the provider.
    #[arg(long)]
    pub description: Option<String>,
    /// Metadata copied to the provider object, as key=value (repeatable).
    #[arg(long = "metadata", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub metadata: Vec<(String, String)>,
}

#[derive(Debug, clap::Args)]
#[group(id = "charge", required = true, multiple = false, args = ["charge_operation", "charge_attempt"])]
pub struct RefundArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// The refund's own business operation, e.g. order-1234:refund-1. The same operation with
    /// the same parameters is the same refund, however often it is sent.
    #[arg(long)]
    pub operation: String,
    /// The charge to refund, by its operation key (the operation's succeeded attempt).
    #[arg(long)]
    pub charge_operation: Option<String>,
    /// The charge to refund, by its attempt id (a UUID).
    #[arg(long)]
    pub charge_attempt: Option<String>,
    /// Amount in the charge currency's minor unit; what is left to refund when omitted.
    #[arg(long, allow_negative_numbers = true)]
    pub amount: Option<i64>,
    /// duplicate, fraudulent or requested_by_customer.
    #[arg(long)]
    pub reason: Option<String>,
    /// Metadata copied to the provider's refund, as key=value (repeatable).
    #[arg(long = "metadata", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub metadata: Vec<(String, String)>,
}

#[derive(Debug, clap::Args)]
pub struct AttemptArgs {
    #[command(subcommand)]
    pub command: AttemptCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum AttemptCommand {
    /// Shows one attempt, by attempt id or operation key.
    Get(GetArgs),
    /// Lists attempts, newest first, one page at a time.
    List(ListArgs),
    /// Operators: clears an attempt's review flag once its cause is gone (the reason stays in
    /// its history) and re-checks it with the provider at once. Reads the service's own
    /// configuration (`--config`, environment) and talks to its database, like `sweep`.
    Recheck(RecheckArgs),
}

#[derive(Debug, clap::Args)]
pub struct RecheckArgs {
    /// The attempt id (a UUID), as `attempt get` shows it.
    pub id: uuid::Uuid,
}

#[derive(Debug, clap::Args)]
#[group(id = "selector", required = true, multiple = false, args = ["id", "operation"])]
pub struct GetArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// The attempt id (a UUID).
    #[arg(long)]
    pub id: Option<String>,
    /// The operation key.
    #[arg(long)]
    pub operation: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Only attempts in this status.
    #[arg(long, value_enum)]
    pub status: Option<StatusFilter>,
    /// Every attempt of this operation key.
    #[arg(long)]
    pub operation: Option<String>,
    /// Only attempts of this kind.
    #[arg(long, value_enum)]
    pub kind: Option<KindFilter>,
    /// Only attempts created at or after this instant (RFC 3339, e.g. 2026-12-01T00:00:00Z).
    #[arg(long)]
    pub from: Option<DateTime<Utc>>,
    /// Only attempts created before this instant (RFC 3339).
    #[arg(long)]
    pub to: Option<DateTime<Utc>>,
    /// Attempts per page; the server's default when omitted.
    #[arg(long)]
    pub page_size: Option<u32>,
    /// The token printed after the previous page.
    #[arg(long)]
    pub page_token: Option<String>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum StatusFilter {
    Pending,
    RequiresAction,
    Succeeded,
    Failed,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum KindFilter {
    Charge,
    Refund,
}

impl KindFilter {
    fn to_proto(self) -> proto::AttemptKind {
        match self {
            KindFilter::Charge => proto::AttemptKind::Charge,
            KindFilter::Refund => proto::AttemptKind::Refund,
        }
    }
}

impl StatusFilter {
    fn to_proto(self) -> proto::AttemptStatus {
        match self {
            StatusFilter::Pending => proto::AttemptStatus::Pending,
            StatusFilter::RequiresAction => proto::AttemptStatus::RequiresAction,
            StatusFilter::Succeeded => proto::AttemptStatus::Succeeded,
            StatusFilter::Failed => proto::AttemptStatus::Failed,
        }
    }
}

fn parse_key_value(pair: &str) -> Result<(String, String), String> {
    match pair.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("expected KEY=VALUE, got {pair:?}")),
    }
}

/// `chargeguard charge`.
pub async fn charge(args: ChargeArgs) -> ExitCode {
    let json = args.client.json;
    let result = async {
        let metadata = metadata_map(args.metadata)?;
        let mut client = connect::client(&args.client).await?;
        let request = proto::ChargeRequest {
            operation_key: args.operation,
            amount_minor: args.amount,
            currency: args.currency,
            payment_method: args.payment_method,
            customer: args.customer,
            description: args.description,
            metadata,
            attempt: args.attempt,
        };
        Ok::<_, ClientError>(client.charge(request).await?.into_inner())
    }
    .await;
    finish(result, |response| render::outcome(response.outcome, response.attempt.as_ref(), json))
}

/// `chargeguard refund`.
pub async fn refund(args: RefundArgs) -> ExitCode {
    use proto::refund_request::Charge;
    let json = args.client.json;
    let charge = match (args.charge_operation, args.charge_attempt) {
        (Some(operation), _) => Charge::ChargeOperationKey(operation),
        (None, Some(id)) => Charge::ChargeAttemptId(id),
        (None, None) => unreachable!("clap requires one of --charge-operation and --charge-attempt"),
    };
    let result = async {
        let metadata = metadata_map(args.metadata)?;
        let mut client = connect::client(&args.client).await?;
        let request = proto::RefundRequest {
            operation_key: args.operation,
            charge: Some(charge),
            amount_minor: args.amount,
            reason: args.reason,
            metadata,
        };
        Ok::<_, ClientError>(client.refund(request).await?.into_inner())
    }
    .await;
    finish(result, |response| render::outcome(response.outcome, response.attempt.as_ref(), json))
}

/// `chargeguard attempt get|list`.
pub async fn attempt(args: AttemptArgs) -> ExitCode {
    match args.command {
        AttemptCommand::Get(args) => get(args).await,
        AttemptCommand::List(args) => list(args).await,
        // main runs it with the service's configuration, before this client-side dispatch.
        AttemptCommand::Recheck(_) => {
            eprintln!("attempt recheck runs with the service's configuration: call it through the chargeguard binary");
            ExitCode::from(2)
        }
    }
}

async fn get(args: GetArgs) -> ExitCode {
    use proto::get_attempt_request::Selector;
    let json = args.client.json;
    let selector = match (args.id, args.operation) {
        (Some(id), _) => Selector::AttemptId(id),
        (None, Some(operation)) => Selector::OperationKey(operation),
        (None, None) => unreachable!("clap requires one of --id and --operation"),
    };
    let result = async {
        let mut client = connect::client(&args.client).await?;
        let request = proto::GetAttemptRequest {
            selector: Some(selector),
        };
        Ok::<_, ClientError>(client.get_attempt(request).await?.into_inner())
    }
    .await;
    finish(result, |response| match response.attempt {
        Some(attempt) => render::attempt(&attempt, json),
        None => String::new(),
    })
}

async fn list(args: ListArgs) -> ExitCode {
    let json = args.client.json;
    let result = async {
        let mut client = connect::client(&args.client).await?;
        let request = proto::ListAttemptsRequest {
            status: args
                .status
                .map_or(proto::AttemptStatus::Unspecified, StatusFilter::to_proto)
                as i32,
            created_from: args.from.map(timestamp),
            created_to: args.to.map(timestamp),
            page_size: args.page_size.unwrap_or(0),
            page_token: args.page_token.unwrap_or_default(),
            operation_key: args.operation.unwrap_or_default(),
            kind: args.kind.map_or(proto::AttemptKind::Unspecified, KindFilter::to_proto) as i32,
        };
        Ok::<_, ClientError>(client.list_attempts(request).await?.into_inner())
    }
    .await;
    finish(result, |response| render::list(&response, json))
}

fn timestamp(instant: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: instant.timestamp(),
        nanos: instant.timestamp_subsec_nanos() as i32,
    }
}

fn metadata_map(pairs: Vec<(String, String)>) -> Result<HashMap<String, String>, ClientError> {
    if pairs.len() > METADATA_PAIRS_MAX {
        return Err(ClientError::Usage(format!(
            "at most {METADATA_PAIRS_MAX} --metadata pairs"
        )));
    }
    let mut metadata = HashMap::with_capacity(pairs.len());
    for (key, value) in pairs {
        if metadata.insert(key.clone(), value).is_some() {
            return Err(ClientError::Usage(format!(
                "--metadata key {key:?} given twice"
            )));
        }
    }
    Ok(metadata)
}

/// Prints the answer on stdout, or the error on stderr, and picks the exit code.
fn finish<T>(result: Result<T, ClientError>, render: impl FnOnce(T) -> String) -> ExitCode {
    match result {
        Ok(response) => print_answer(&render(response)),
        Err(error) => {
            eprintln!("{}", render::error(&error));
            if error.is_retryable() {
                ExitCode::from(EXIT_RETRYABLE)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// Writes a command's answer to stdout. A reader that went away (`chargeguard charge … | head -1`)
/// is not an error: the command's work is done (a charge made and recorded, which `attempt get`
/// shows again), so it ends quietly, as `head` expects; `println!` would panic there.
pub fn print_answer(answer: &str) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    match writeln!(stdout, "{answer}").and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: cannot write the answer to stdout: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Longest the CLI waits to connect before reporting the server unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
