//! Configuration: defaults, then a TOML file, then `CHARGEGUARD_…` environment variables
//! (`__` separates sections: `CHARGEGUARD_DATABASE__URL`), then command-line flags. Every
//! option has a default and a bound, and `validate` checks them together at start.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};

use crate::domain::{CLOCK_SKEW_TOLERANCE, KeyWindow, PROVIDER_KEY_RETENTION};
use crate::orchestrator::{OrchestratorSettings, OutcomeCacheSettings, SweepSettings};
use crate::secret::Secret;
use crate::webhook::{RetentionSettings, WebhookSettings, WorkerSettings};

/// `server.grpc_request_bytes_max` by default: 4 MiB, tonic's own decode limit.
pub const GRPC_REQUEST_BYTES_DEFAULT: usize = 4 * 1024 * 1024;
/// Bounds of `server.grpc_request_bytes_max`. The floor is above the largest valid `Charge`
/// (metadata and description are bounded in `domain`: under 32 KiB in all); the ceiling keeps
/// one request from holding a large share of memory while it is decoded.
const GRPC_REQUEST_BYTES_RANGE: std::ops::RangeInclusive<usize> = 65_536..=64 * 1024 * 1024;

/// Bounds of `server.grpc_metadata_bytes_max`: at least hyper's own 16 KiB; at most 1 MiB, since
/// every stream of every connection may hold that much while its headers are read.
const GRPC_METADATA_BYTES_RANGE: std::ops::RangeInclusive<u32> = 16_384..=1_048_576;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: ServerConfig,
    pub database: DatabaseConfig,
    pub provider: ProviderConfig,
    pub charge: ChargeConfig,
    /// The first-run defaults: the built-in simulator and the demo consumer.
    pub embedded: EmbeddedConfig,
    pub sweep: SweepConfig,
    /// Callers and their bearer tokens (stored as SHA-256 hex, never in clear).
    pub consumers: Vec<ConsumerConfig>,
    pub report: ReportConfig,
    /// People and tools that read reports (finance, admin); tokens stored like consumers'.
    pub operators: Vec<OperatorConfig>,
    pub webhooks: WebhooksConfig,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    pub grpc_listen: SocketAddr,
    pub http_listen: SocketAddr,
    /// A separate plaintext listener for `/metrics` (and `/healthz`), for a Prometheus inside
    /// the cluster while the HTTP port speaks TLS to an ingress. Set, `/metrics` leaves the HTTP
    /// port. Exempt from `require_tls`: metrics carry counts and consumer names, no tokens and
    /// no payment data.
    pub metrics_listen: Option<SocketAddr>,
    /// Upper bound on one gRPC request, end to end.
    pub request_timeout_ms: u64,
    pub concurrent_requests_max: usize,
    /// Largest gRPC request message accepted (tonic's decode limit, set on every service);
    /// larger ones are refused with `request_too_large` before anything is read into a call.
    pub grpc_request_bytes_max: usize,
    /// Largest HTTP/2 header list (gRPC metadata) a call may send. Up to it, odd or oversized
    /// `authorization` metadata reaches the service and is answered UNAUTHENTICATED; beyond it,
    /// HTTP/2 itself refuses the stream (431) or, for a header flood, the connection.
    pub grpc_metadata_bytes_max: u32,
    /// How long shutdown waits for in-flight calls.
    pub shutdown_grace_ms: u64,
    /// PEM certificate chain of the server; with `tls_key_file`, the gRPC port (and the HTTP
    /// port, see `tls_on_http`) speaks TLS 1.2+ only. Re-read on SIGHUP and when the file changes.
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of `tls_cert_file` (PKCS#8, PKCS#1 or SEC1). Never logged.
    pub tls_key_file: Option<PathBuf>,
    /// PEM CA certificates; set, every gRPC client must present a certificate they signed.
    pub tls_client_ca_file: Option<PathBuf>,
    /// With TLS configured, the HTTP port (webhooks, metrics, health) speaks TLS too, with the
    /// same certificate and no client certificate. Off where an ingress ends TLS for it.
    pub tls_on_http: bool,
    /// Refuse to start when a listener on a non-loopback address would speak plaintext.
    pub require_tls: bool,
    /// How often the certificate files are checked for changes (SIGHUP re-reads at once).
    pub tls_reload_interval_ms: u64,
    /// A TLS handshake not finished within this is dropped (slow or idle clients).
    pub tls_handshake_timeout_ms: u64,
    /// An HTTP request (headers and body, e.g. a webhook) not received and answered within this
    /// is cut off with 408.
    pub http_request_timeout_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseConfig {
    /// `postgres://…` (PostgreSQL) or `sqlite:…` (a SQLite file); unset means the embedded
    /// SQLite file at `sqlite_path`. Secret-bearing: never logged.
    #[serde(skip_serializing)]
    pub url: Option<Secret>,
    /// The embedded store's file when `url` is unset; its directory is created at start.
    pub sqlite_path: PathBuf,
    pub connections_max: u32,
    pub acquire_timeout_ms: u64,
    pub statement_timeout_ms: u64,
    pub migrate_on_start: bool,
    /// PostgreSQL only: concurrent charges' inserts and results share statements and commits.
    pub group_commit: GroupCommitConfig,
}

/// `[database.group_commit]`: how concurrent `insert_pending` and `finish_round` calls are
/// grouped into shared statements, both kinds in one (store/group_commit.rs).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GroupCommitConfig {
    pub enabled: bool,
    /// Rows in one statement at most.
    pub batch_max: usize,
    /// How long a batch may be held open for more rows once the service is busy (the previous
    /// batch had company); 0 never holds one. An idle service's first caller never waits.
    pub wait_max_us: u64,
    /// Batches whose statements run at once, each on its own connection; 1 starts a batch
    /// only when the one before it answered.
    pub in_flight_max: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProviderConfig {
    /// Stripe secret key. Never logged or returned.
    #[serde(skip_serializing)]
    pub api_key: Option<Secret>,
    /// Base URL of a Stripe-compatible API (the simulator); unset means Stripe itself.
    pub base_url: Option<String>,
    pub call_timeout_ms: u64,
    /// Idle keep-alive connections to the provider; 0 opens a connection per call.
    pub idle_connections_max: usize,
    pub lookup_pages_max: u32,
    /// Longest answer body read from the provider; a longer one is an error, not read whole.
    pub response_body_bytes_max: usize,
    pub return_url: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ChargeConfig {
    pub amount_minor_max: i64,
    pub lease_ms: u64,
    pub concurrent_wait_ms: u64,
    /// Re-sends of a key stop this long after its first use (Stripe keeps keys 24 hours).
    pub key_window_safe_minutes: u64,
    pub recovery_grace_ms: u64,
    pub recheck_backoff_base_ms: u64,
    pub recheck_backoff_max_ms: u64,
    pub requires_action_age_max_minutes: u64,
    pub lookup_slack_minutes: u64,
    pub list_page_size_default: u32,
    pub list_page_size_max: u32,
    /// How long a decided outcome answers duplicates from memory; 0 turns that off.
    pub outcome_cache_ttl_ms: u64,
    pub outcome_cache_bytes_max: u64,
}

/// What `serve` does when it is started with nothing configured (see README "First run").
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EmbeddedConfig {
    /// Where the built-in Stripe simulator listens when `provider.api_key` is unset.
    pub simulator_listen: SocketAddr,
    /// Where the demo consumer's token is kept (mode 0600) when no consumers are configured and
    /// the provider is the built-in simulator. Relative paths are from the working directory.
    pub demo_token_file: std::path::PathBuf,
}

/// `POST /webhooks/stripe`, the inbox worker and inbox retention.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebhooksConfig {
    /// Stripe signing secrets (`whsec_…`); several while rotating. Empty disables the endpoint.
    /// Never logged.
    #[serde(skip_serializing)]
    pub secrets: Vec<Secret>,
    /// Allowed distance between the signature's timestamp and now (Stripe's libraries: 300).
    pub signature_tolerance_seconds: u64,
    /// Larger bodies are refused with 413.
    pub body_bytes_max: usize,
    pub worker_batch_max: u32,
    pub worker_interval_ms: u64,
    /// How long a claimed batch stays one worker's before another may finish it.
    pub worker_claim_ms: u64,
    /// Processed events older than this are pruned; at least 31 (Stripe resends for 30 days).
    pub retention_days: u32,
    pub retention_batch_max: u32,
    pub retention_interval_ms: u64,
}

/// The scheduled pending sweep (see README "Recovery").
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SweepConfig {
    /// Runs the sweep inside `serve`; turn off where `chargeguard sweep --once` runs from cron.
    pub enabled: bool,
    /// 6-field cron expression, seconds first, UTC.
    pub schedule: String,
    /// Rows one pass reconciles at most.
    pub batch_max: u32,
    /// Rows in flight at once (each holds a database connection for its statements).
    pub concurrency_max: u32,
    /// A flagged row is looked at (and logged) again this often; it is never sent again.
    pub review_reminder_hours: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumerConfig {
    pub name: String,
    /// Lowercase hex SHA-256 of each bearer token (`chargeguard hash-token` prints it); several
    /// while rotating. Empty when the consumer is identified by certificate only.
    #[serde(default)]
    pub token_sha256: Sha256List,
    /// Lowercase hex SHA-256 of the DER of each client certificate that identifies this consumer
    /// (needs `server.tls_client_ca_file`). With tokens too, a call needs both.
    #[serde(default)]
    pub client_cert_sha256: Sha256List,
    /// Names that identify this consumer's client certificates, matched exactly against the
    /// subject common name and the DNS and URI subject alternative names of a certificate the
    /// client CA signed (`orders.payments.internal`, `spiffe://example.org/orders`): a
    /// certificate renewed under the same name needs no configuration change. Needs
    /// `server.tls_client_ca_file`; with tokens too, a call needs both.
    #[serde(default)]
    pub client_cert_names: Vec<String>,
    /// Token bucket: calls per second sustained, and the burst above it.
    #[serde(default = "requests_per_second_max_default")]
    pub requests_per_second_max: u32,
    #[serde(default = "burst_max_default")]
    pub burst_max: u32,
    /// Calls of this consumer running at once; more are refused, not queued.
    #[serde(default = "calls_in_flight_max_default")]
    pub calls_in_flight_max: u32,
}

fn requests_per_second_max_default() -> u32 {
    500
}
fn burst_max_default() -> u32 {
    1_000
}
fn calls_in_flight_max_default() -> u32 {
    256
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            token_sha256: Sha256List::default(),
            client_cert_sha256: Sha256List::default(),
            client_cert_names: Vec::new(),
            requests_per_second_max: requests_per_second_max_default(),
            burst_max: burst_max_default(),
            calls_in_flight_max: calls_in_flight_max_default(),
        }
    }
}

/// One SHA-256 (a string) or several (a list) in configuration: `token_sha256 = "…"` stays valid
/// while `token_sha256 = ["…new…", "…old…"]` rotates. Kept lowercase as written; `validate`
/// refuses anything but 64 lowercase hex digits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sha256List(Vec<String>);

impl Sha256List {
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(String::as_str)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<String> for Sha256List {
    fn from(hash: String) -> Self {
        Self(vec![hash])
    }
}

impl From<Vec<String>> for Sha256List {
    fn from(hashes: Vec<String>) -> Self {
        Self(hashes)
    }
}

impl Serialize for Sha256List {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0.as_slice() {
            [one] => serializer.serialize_str(one),
            many => many.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for Sha256List {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum OneOrMany {
            One(String),
            Many(Vec<String>),
        }
        Ok(match OneOrMany::deserialize(deserializer)? {
            OneOrMany::One(hash) => Self(vec![hash]),
            OneOrMany::Many(hashes) => Self(hashes),
        })
    }
}

/// Reconciliation reports (`chargeguard report`, the `Reports` gRPC service).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReportConfig {
    /// A pending attempt older than this is a discrepancy (`stale_unfinished`).
    pub pending_age_max_minutes: u64,
    /// The same for requires_action; at least `charge.requires_action_age_max_minutes`, after
    /// which recovery cancels the payment anyway.
    pub requires_action_age_max_minutes: u64,
    /// The provider is listed in windows of this length, each paginated on its own.
    pub provider_window_minutes: u64,
    pub provider_page_size: u32,
    /// Bound on list pages per run (payments and refunds each); past it the run fails.
    pub provider_pages_max: u32,
    /// Provider objects are listed from this long before the period (clock skew) ...
    pub provider_lookbehind_minutes: u64,
    /// ... to this long after it: an attempt's object may be created after the attempt, up to
    /// the key window later when recovery re-sends.
    pub provider_lookahead_minutes: u64,
    /// Tries of one list call (reads are safe to repeat) before the run fails.
    pub provider_read_attempts_max: u32,
    pub provider_retry_backoff_ms: u64,
    /// Rows read from the database per page.
    pub rows_page_size: u32,
    /// Provider objects listed on one row (a row counts all of them).
    pub objects_listed_per_row_max: u32,
    /// Statement timeout of the report's long statements (the join).
    pub statement_timeout_ms: u64,
    pub period_days_max: u32,
    /// Staging of a run older than this belongs to a run that died; the next run deletes it.
    pub abandoned_run_minutes: u64,
}

/// Who may read reports over gRPC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OperatorRole {
    Finance,
    Admin,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorConfig {
    pub name: String,
    /// Lowercase hex SHA-256 of each bearer token (`chargeguard hash-token` prints it); several
    /// while rotating.
    pub token_sha256: Sha256List,
    pub role: OperatorRole,
}

impl Default for ReportConfig {
    fn default() -> Self {
        Self {
            pending_age_max_minutes: 60,
            requires_action_age_max_minutes: 25 * 60,
            provider_window_minutes: 60,
            provider_page_size: 100,
            provider_pages_max: 100_000,
            provider_lookbehind_minutes: 10,
            provider_lookahead_minutes: 25 * 60,
            provider_read_attempts_max: 4,
            provider_retry_backoff_ms: 500,
            rows_page_size: 1_000,
            objects_listed_per_row_max: 100,
            statement_timeout_ms: 300_000,
            period_days_max: 400,
            abandoned_run_minutes: 24 * 60,
        }
    }
}

impl Default for WebhooksConfig {
    fn default() -> Self {
        Self {
            secrets: Vec::new(),
            signature_tolerance_seconds: 300,
            body_bytes_max: 256 * 1024,
            worker_batch_max: 100,
            worker_interval_ms: 1_000,
            worker_claim_ms: 60_000,
            retention_days: 35,
            retention_batch_max: 500,
            retention_interval_ms: 3_600_000,
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            grpc_listen: "127.0.0.1:50051".parse().expect("literal address"),
            http_listen: "127.0.0.1:8080".parse().expect("literal address"),
            metrics_listen: None,
            request_timeout_ms: 30_000,
            concurrent_requests_max: 1024,
            // tonic's own default, now chosen rather than inherited.
            grpc_request_bytes_max: GRPC_REQUEST_BYTES_DEFAULT,
            grpc_metadata_bytes_max: 65_536,
            shutdown_grace_ms: 20_000,
            tls_cert_file: None,
            tls_key_file: None,
            tls_client_ca_file: None,
            tls_on_http: true,
            require_tls: false,
            tls_reload_interval_ms: 10_000,
            tls_handshake_timeout_ms: 10_000,
            http_request_timeout_ms: 15_000,
        }
    }
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        Self {
            url: None,
            sqlite_path: PathBuf::from("chargeguard-data/chargeguard.sqlite"),
            connections_max: 16,
            acquire_timeout_ms: 5_000,
            statement_timeout_ms: 5_000,
            migrate_on_start: true,
            group_commit: GroupCommitConfig::default(),
        }
    }
}

impl Default for GroupCommitConfig {
    fn default() -> Self {
        Self { enabled: true, batch_max: 64, wait_max_us: 0, in_flight_max: 1 }
    }
}

impl Default for ProviderConfig {
    fn default() -> Self {
        Self {
            api_key: None,
            base_url: None,
            call_timeout_ms: 10_000,
            idle_connections_max: 64,
            lookup_pages_max: 50,
            // A list page of 100 payment intents is 100-300 KB; a create answer a few KB.
            response_body_bytes_max: 4 * 1024 * 1024,
            return_url: None,
        }
    }
}

impl Default for ChargeConfig {
    fn default() -> Self {
        Self {
            amount_minor_max: 99_999_999,
            lease_ms: 30_000,
            concurrent_wait_ms: 5_000,
            key_window_safe_minutes: 23 * 60,
            recovery_grace_ms: 60_000,
            recheck_backoff_base_ms: 30_000,
            recheck_backoff_max_ms: 3_600_000,
            requires_action_age_max_minutes: 24 * 60,
            lookup_slack_minutes: 1,
            list_page_size_default: 50,
            list_page_size_max: 500,
            outcome_cache_ttl_ms: 10_000,
            outcome_cache_bytes_max: 16 * 1024 * 1024,
        }
    }
}

impl Default for EmbeddedConfig {
    fn default() -> Self {
        Self {
            simulator_listen: "127.0.0.1:0".parse().expect("literal address"),
            demo_token_file: crate::embedded::DEMO_TOKEN_FILE_DEFAULT.into(),
        }
    }
}

impl Default for SweepConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            schedule: "0 * * * * *".to_owned(),
            batch_max: 200,
            concurrency_max: 8,
            // About three days at the default one-hour backoff cap.
            review_reminder_hours: 24,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read configuration:\n  - {0}")]
    Load(String),
    #[error("invalid configuration:\n  - {}", .0.join("\n  - "))]
    Invalid(Vec<String>),
}

/// `CHARGEGUARD_…` variables that belong to the command line, not to `Config` (lowercase, as
/// figment sees them); any other unknown `CHARGEGUARD_…` variable is an error, so typos show.
const NOT_OPTIONS: [&str; 10] = [
    "config", "log_format", "token", "token_file", "server_url", "sim_listen", "sim_webhook_secret", "ca_file", "cert_file", "key_file",
];

impl Config {
    /// Defaults, then the TOML file (if given), then `CHARGEGUARD_…` variables.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        let mut figment = Figment::from(Serialized::defaults(Config::default()));
        if let Some(file) = file {
            if !file.exists() {
                return Err(ConfigError::Load(format!("{} does not exist", file.display())));
            }
            figment = figment.merge(Toml::file(file));
        }
        figment = figment.merge(Env::prefixed("CHARGEGUARD_").split("__").ignore(&NOT_OPTIONS));
        figment.extract().map_err(|error| ConfigError::Load(describe_load_error(error)))
    }

    /// Checks every bound and every relation between options; lists all problems at once.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        let mut check = |ok: bool, problem: &str| {
            if !ok {
                problems.push(problem.to_owned());
            }
        };
        let charge = &self.charge;
        let provider = &self.provider;
        if let Err(problem) = crate::store::DatabaseLocation::from_config(&self.database) {
            check(false, &problem.to_string());
        }
        check((1..=1_000).contains(&self.database.connections_max), "database.connections_max must be 1-1000");
        check((100..=600_000).contains(&self.database.statement_timeout_ms), "database.statement_timeout_ms must be 100-600000");
        check((100..=600_000).contains(&self.database.acquire_timeout_ms), "database.acquire_timeout_ms must be 100-600000");
        check((1..=1_000).contains(&self.database.group_commit.batch_max), "database.group_commit.batch_max must be 1-1000");
        check(self.database.group_commit.wait_max_us <= 100_000, "database.group_commit.wait_max_us must be 0-100000");
        check(
            (1..=8).contains(&self.database.group_commit.in_flight_max)
                && self.database.group_commit.in_flight_max as u64 <= u64::from(self.database.connections_max),
            "database.group_commit.in_flight_max must be 1-8 and at most database.connections_max",
        );
        check((100..=300_000).contains(&provider.call_timeout_ms), "provider.call_timeout_ms must be 100-300000");
        check(provider.idle_connections_max <= 1_024, "provider.idle_connections_max must be 0-1024");
        check((1..=1_000).contains(&provider.lookup_pages_max), "provider.lookup_pages_max must be 1-1000");
        check(
            (1_048_576..=67_108_864).contains(&provider.response_body_bytes_max),
            "provider.response_body_bytes_max must be 1048576-67108864 (1-64 MiB; a list page of 100 payment \
             intents must fit)",
        );
        check((1..=10_000_000_000).contains(&charge.amount_minor_max), "charge.amount_minor_max must be 1-10000000000");
        check(
            charge.lease_ms > provider.call_timeout_ms * 2 + self.database.statement_timeout_ms,
            "charge.lease_ms must exceed twice provider.call_timeout_ms plus database.statement_timeout_ms \
             (a round is a lookup of several calls and a write), so a live round never loses its lease",
        );
        check(charge.lease_ms <= 3_600_000, "charge.lease_ms must be at most one hour");
        check(charge.concurrent_wait_ms <= 60_000, "charge.concurrent_wait_ms must be at most 60000");
        check(charge.recovery_grace_ms >= charge.lease_ms, "charge.recovery_grace_ms must be at least charge.lease_ms, so recovery never races a live call");
        check(charge.key_window_safe_minutes >= 60, "charge.key_window_safe_minutes must be at least 60");
        if let Err(problem) = key_window_fits_retention(charge.key_window_safe_minutes, provider.call_timeout_ms) {
            check(false, &problem);
        }
        check(charge.recheck_backoff_base_ms >= 100, "charge.recheck_backoff_base_ms must be at least 100");
        check(charge.recheck_backoff_max_ms >= charge.recheck_backoff_base_ms, "charge.recheck_backoff_max_ms must be at least the base");
        check(charge.requires_action_age_max_minutes >= 5, "charge.requires_action_age_max_minutes must be at least 5");
        check(charge.lookup_slack_minutes <= 24 * 60, "charge.lookup_slack_minutes must be at most 1440");
        check((1..=10_000).contains(&charge.list_page_size_max), "charge.list_page_size_max must be 1-10000");
        check((1..=charge.list_page_size_max).contains(&charge.list_page_size_default), "charge.list_page_size_default must be 1..list_page_size_max");
        check(charge.outcome_cache_ttl_ms <= 3_600_000, "charge.outcome_cache_ttl_ms must be at most 3600000 (one hour)");
        check(charge.outcome_cache_bytes_max <= 1 << 30, "charge.outcome_cache_bytes_max must be at most 1073741824 (1 GiB)");
        check(self.server.request_timeout_ms >= 1_000, "server.request_timeout_ms must be at least 1000");
        check(self.server.concurrent_requests_max >= 1, "server.concurrent_requests_max must be at least 1");
        check(
            GRPC_METADATA_BYTES_RANGE.contains(&self.server.grpc_metadata_bytes_max),
            &format!("server.grpc_metadata_bytes_max must be {}-{}", GRPC_METADATA_BYTES_RANGE.start(), GRPC_METADATA_BYTES_RANGE.end()),
        );
        check(
            GRPC_REQUEST_BYTES_RANGE.contains(&self.server.grpc_request_bytes_max),
            &format!(
                "server.grpc_request_bytes_max must be {}-{}",
                GRPC_REQUEST_BYTES_RANGE.start(),
                GRPC_REQUEST_BYTES_RANGE.end()
            ),
        );
        check(
            provider.base_url.is_none() || provider.api_key.is_some(),
            "provider.base_url is set but provider.api_key is not: set both, or neither to use the built-in simulator",
        );
        check(
            self.server.shutdown_grace_ms > provider.call_timeout_ms && self.server.shutdown_grace_ms <= 600_000,
            "server.shutdown_grace_ms must exceed provider.call_timeout_ms (a call in flight finishes) and be at most 600000",
        );
        check(!self.embedded.demo_token_file.as_os_str().is_empty(), "embedded.demo_token_file must not be empty");
        let webhooks = &self.webhooks;
        check((1..=3_600).contains(&webhooks.signature_tolerance_seconds), "webhooks.signature_tolerance_seconds must be 1-3600");
        check((4_096..=16 * 1024 * 1024).contains(&webhooks.body_bytes_max), "webhooks.body_bytes_max must be 4096-16777216");
        check((1..=1_000).contains(&webhooks.worker_batch_max), "webhooks.worker_batch_max must be 1-1000");
        check((10..=3_600_000).contains(&webhooks.worker_interval_ms), "webhooks.worker_interval_ms must be 10-3600000");
        check((1_000..=3_600_000).contains(&webhooks.worker_claim_ms), "webhooks.worker_claim_ms must be 1000-3600000");
        check(webhooks.worker_claim_ms >= self.database.statement_timeout_ms * 2, "webhooks.worker_claim_ms must be at least twice database.statement_timeout_ms, so a live worker keeps its claim");
        check((crate::webhook::retention::RETENTION_DAYS_MIN..=3_650).contains(&webhooks.retention_days), "webhooks.retention_days must be 31-3650: Stripe resends events manually for up to 30 days");
        check((1..=10_000).contains(&webhooks.retention_batch_max), "webhooks.retention_batch_max must be 1-10000");
        check((1_000..=86_400_000).contains(&webhooks.retention_interval_ms), "webhooks.retention_interval_ms must be 1000-86400000");
        check(webhooks.secrets.iter().all(|secret| !secret.is_empty()), "webhooks.secrets must not contain an empty secret");
        let sweep = &self.sweep;
        check(crate::sweep_job::schedule_is_valid(&sweep.schedule), &format!("sweep.schedule {:?} must be a 6-field cron expression, seconds first (\"0 * * * * *\")", sweep.schedule));
        check((1..=10_000).contains(&sweep.batch_max), "sweep.batch_max must be 1-10000");
        check((1..=self.database.connections_max).contains(&sweep.concurrency_max), "sweep.concurrency_max must be 1..database.connections_max");
        check((1..=24 * 30).contains(&sweep.review_reminder_hours), "sweep.review_reminder_hours must be 1-720");
        for consumer in &self.consumers {
            check(crate::domain::ConsumerName::parse(&consumer.name).is_ok(), &format!("consumers: name {:?} must be 1-64 of A-Z a-z 0-9 - _ .", consumer.name));
            check(consumer.token_sha256.iter().all(is_sha256_hex), &format!("consumers: token_sha256 of {:?} must be 64 lowercase hex digits", consumer.name));
            check(consumer.client_cert_sha256.iter().all(is_sha256_hex), &format!("consumers: client_cert_sha256 of {:?} must be 64 lowercase hex digits", consumer.name));
            check(
                consumer.client_cert_names.iter().all(|name| is_certificate_name(name)),
                &format!("consumers: client_cert_names of {:?} must be 1-{CERTIFICATE_NAME_BYTES_MAX} printable characters without spaces each", consumer.name),
            );
            check(
                !consumer.token_sha256.is_empty() || !consumer.client_cert_sha256.is_empty() || !consumer.client_cert_names.is_empty(),
                &format!("consumers: {:?} needs a token_sha256, a client_cert_sha256 or client_cert_names", consumer.name),
            );
            check(
                consumer.client_cert_sha256.is_empty() || self.server.tls_client_ca_file.is_some(),
                &format!("consumers: {:?} has a client_cert_sha256 but server.tls_client_ca_file is unset: no client certificate would ever be asked for", consumer.name),
            );
            check(
                consumer.client_cert_names.is_empty() || self.server.tls_client_ca_file.is_some(),
                &format!("consumers: {:?} has client_cert_names but server.tls_client_ca_file is unset: no client certificate would ever be asked for", consumer.name),
            );
            check((1..=100_000).contains(&consumer.requests_per_second_max), &format!("consumers: requests_per_second_max of {:?} must be 1-100000", consumer.name));
            check((1..=100_000).contains(&consumer.burst_max), &format!("consumers: burst_max of {:?} must be 1-100000", consumer.name));
            check((1..=100_000).contains(&consumer.calls_in_flight_max), &format!("consumers: calls_in_flight_max of {:?} must be 1-100000", consumer.name));
        }
        self.validate_tls(&mut problems);
        self.validate_report(&mut problems);
        self.validate_identities(&mut problems);
        if problems.is_empty() { Ok(()) } else { Err(ConfigError::Invalid(problems)) }
    }

    fn validate_report(&self, problems: &mut Vec<String>) {
        let mut check = |ok: bool, problem: &str| {
            if !ok {
                problems.push(problem.to_owned());
            }
        };
        let report = &self.report;
        check(report.pending_age_max_minutes >= 1, "report.pending_age_max_minutes must be at least 1");
        check(report.requires_action_age_max_minutes >= self.charge.requires_action_age_max_minutes, "report.requires_action_age_max_minutes must be at least charge.requires_action_age_max_minutes");
        check((1..=7 * 24 * 60).contains(&report.provider_window_minutes), "report.provider_window_minutes must be 1-10080");
        check((1..=100).contains(&report.provider_page_size), "report.provider_page_size must be 1-100");
        check((1..=10_000_000).contains(&report.provider_pages_max), "report.provider_pages_max must be 1-10000000");
        check(report.provider_lookbehind_minutes <= 24 * 60, "report.provider_lookbehind_minutes must be at most 1440");
        check(report.provider_lookahead_minutes <= 7 * 24 * 60, "report.provider_lookahead_minutes must be at most 10080");
        check((1..=20).contains(&report.provider_read_attempts_max), "report.provider_read_attempts_max must be 1-20");
        check(report.provider_retry_backoff_ms <= 60_000, "report.provider_retry_backoff_ms must be at most 60000");
        check((1..=10_000).contains(&report.rows_page_size), "report.rows_page_size must be 1-10000");
        check((1..=1_000).contains(&report.objects_listed_per_row_max), "report.objects_listed_per_row_max must be 1-1000");
        check((1_000..=3_600_000).contains(&report.statement_timeout_ms), "report.statement_timeout_ms must be 1000-3600000");
        check((1..=3_660).contains(&report.period_days_max), "report.period_days_max must be 1-3660");
        check(report.abandoned_run_minutes >= 60, "report.abandoned_run_minutes must be at least 60");
        for operator in &self.operators {
            check(crate::domain::ConsumerName::parse(&operator.name).is_ok(), &format!("operators: name {:?} must be 1-64 of A-Z a-z 0-9 - _ .", operator.name));
            check(
                !operator.token_sha256.is_empty() && operator.token_sha256.iter().all(is_sha256_hex),
                &format!("operators: token_sha256 of {:?} must be 64 lowercase hex digits", operator.name),
            );
        }
    }

    /// One token, one identity; one name, one consumer. A token hash on two entries makes one
    /// caller act as the other (the authenticators keep whichever entry they read last), and two
    /// consumers of one name share one key space: either way one caller's charge could be
    /// answered with another's. Problems name the entries, never a hash.
    fn validate_identities(&self, problems: &mut Vec<String>) {
        let consumers = self.consumers.iter().flat_map(|consumer| consumer.token_sha256.iter().map(|hash| ("consumer", consumer.name.as_str(), hash)));
        let operators = self.operators.iter().flat_map(|operator| operator.token_sha256.iter().map(|hash| ("operator", operator.name.as_str(), hash)));
        // Authentication compares lowercase hashes, so `AB…` and `ab…` are the same token.
        let mut first_by_hash: std::collections::HashMap<String, (&str, &str)> = std::collections::HashMap::new();
        for (kind, name, hash) in consumers.chain(operators) {
            match first_by_hash.entry(hash.to_ascii_lowercase()) {
                std::collections::hash_map::Entry::Occupied(first) => {
                    let (first_kind, first_name) = *first.get();
                    problems.push(format!(
                        "{kind}s: {name:?} has the same token_sha256 as {first_kind} {first_name:?}: every consumer and operator needs its own token"
                    ));
                }
                std::collections::hash_map::Entry::Vacant(vacant) => {
                    vacant.insert((kind, name));
                }
            }
        }
        // A certificate names one consumer, or a call with it could act as either.
        let mut first_by_cert: std::collections::HashMap<&str, &str> = std::collections::HashMap::new();
        for consumer in &self.consumers {
            for hash in consumer.client_cert_sha256.iter() {
                if let Some(first) = first_by_cert.insert(hash, consumer.name.as_str())
                    && first != consumer.name
                {
                    problems.push(format!(
                        "consumers: {:?} has the same client_cert_sha256 as consumer {first:?}: every consumer needs its own certificate",
                        consumer.name
                    ));
                }
            }
        }
        let mut first_by_cert_name: std::collections::HashMap<&str, &str> = std::collections::HashMap::new();
        for consumer in &self.consumers {
            for name in &consumer.client_cert_names {
                if let Some(first) = first_by_cert_name.insert(name.as_str(), consumer.name.as_str())
                    && first != consumer.name
                {
                    problems.push(format!(
                        "consumers: {:?} has the client_cert_names entry {name:?} of consumer {first:?}: every consumer needs its own certificate name",
                        consumer.name
                    ));
                }
            }
        }
        let mut names = std::collections::HashSet::new();
        for consumer in &self.consumers {
            if !names.insert(consumer.name.as_str()) {
                problems.push(format!("consumers: {:?} is listed twice: two consumers of one name share one key space", consumer.name));
            }
        }
    }

    fn validate_tls(&self, problems: &mut Vec<String>) {
        let server = &self.server;
        let mut check = |ok: bool, problem: &str| {
            if !ok {
                problems.push(problem.to_owned());
            }
        };
        check(
            server.tls_cert_file.is_some() == server.tls_key_file.is_some(),
            "server.tls_cert_file and server.tls_key_file go together: set both, or neither",
        );
        check(
            server.tls_client_ca_file.is_none() || server.tls_cert_file.is_some(),
            "server.tls_client_ca_file needs server.tls_cert_file and server.tls_key_file: client certificates are asked for in a TLS handshake",
        );
        check((100..=3_600_000).contains(&server.tls_reload_interval_ms), "server.tls_reload_interval_ms must be 100-3600000");
        check((100..=60_000).contains(&server.tls_handshake_timeout_ms), "server.tls_handshake_timeout_ms must be 100-60000");
        check((100..=300_000).contains(&server.http_request_timeout_ms), "server.http_request_timeout_ms must be 100-300000");
        if let Some(metrics) = server.metrics_listen {
            for (option, address) in [("server.grpc_listen", server.grpc_listen), ("server.http_listen", server.http_listen)] {
                check(
                    metrics.port() == 0 || metrics != address,
                    &format!("server.metrics_listen {metrics} is {option} too: metrics need a listener of their own"),
                );
            }
        }
        if server.require_tls {
            let grpc_tls = server.tls_cert_file.is_some();
            let http_tls = grpc_tls && server.tls_on_http;
            for (option, address, tls) in [("server.grpc_listen", server.grpc_listen, grpc_tls), ("server.http_listen", server.http_listen, http_tls)] {
                check(
                    tls || address.ip().is_loopback(),
                    &format!("{option} {address} is not a loopback address and would speak plaintext, which server.require_tls = true refuses: set server.tls_cert_file and server.tls_key_file"),
                );
            }
        }
    }

    pub fn orchestrator_settings(&self) -> OrchestratorSettings {
        let charge = &self.charge;
        let minutes = |m: u64| Duration::from_secs(m * 60);
        OrchestratorSettings {
            amount_minor_max: charge.amount_minor_max,
            lease_duration: Duration::from_millis(charge.lease_ms),
            concurrent_wait_max: Duration::from_millis(charge.concurrent_wait_ms),
            key_window: KeyWindow::new(chrono::Duration::minutes(charge.key_window_safe_minutes as i64))
                .expect("validated: inside the provider's retention"),
            recovery_grace: Duration::from_millis(charge.recovery_grace_ms),
            recheck_backoff_base: Duration::from_millis(charge.recheck_backoff_base_ms),
            recheck_backoff_max: Duration::from_millis(charge.recheck_backoff_max_ms),
            requires_action_age_max: minutes(charge.requires_action_age_max_minutes),
            lookup_slack: minutes(charge.lookup_slack_minutes),
            lookup_pages_per_round: self.provider.lookup_pages_max,
            return_url: self.provider.return_url.clone(),
            list_page_size_default: charge.list_page_size_default,
            list_page_size_max: charge.list_page_size_max,
            outcome_cache: OutcomeCacheSettings {
                ttl: Duration::from_millis(charge.outcome_cache_ttl_ms),
                bytes_max: charge.outcome_cache_bytes_max,
            },
            sweep: SweepSettings {
                batch_max: self.sweep.batch_max,
                concurrency_max: self.sweep.concurrency_max,
                review_reminder: Duration::from_secs(self.sweep.review_reminder_hours * 3600),
            },
        }
    }

    pub fn webhook_settings(&self) -> WebhookSettings {
        let webhooks = &self.webhooks;
        WebhookSettings {
            secrets: webhooks.secrets.clone(),
            signature_tolerance: chrono::Duration::seconds(webhooks.signature_tolerance_seconds as i64),
            body_bytes_max: webhooks.body_bytes_max,
            worker: WorkerSettings {
                batch_max: webhooks.worker_batch_max,
                claim_duration: Duration::from_millis(webhooks.worker_claim_ms),
                interval: Duration::from_millis(webhooks.worker_interval_ms),
            },
            retention: RetentionSettings {
                retention: chrono::Duration::days(i64::from(webhooks.retention_days)),
                batch_max: webhooks.retention_batch_max,
                interval: Duration::from_millis(webhooks.retention_interval_ms),
            },
        }
    }
}

/// The key window's bound. A re-send is decided while the key's age, read on the deciding
/// replica's clock, is under the safe window; that clock may run up to the skew tolerance behind
/// the clock that stamped the window's start (`KeyWindow::is_open` accepts that much) and the
/// create may still reach the provider up to one call timeout after the decision. All three must
/// fit in the provider's retention, or a re-send could find its key forgotten and charge again.
/// Only a create counts: the lookups of a past-window round (search, list, retrieve) carry no
/// idempotency key, so however many calls a round makes, the key itself travels in one call.
fn key_window_fits_retention(safe_minutes: u64, call_timeout_ms: u64) -> Result<(), String> {
    let safe_ms = safe_minutes.saturating_mul(60_000);
    let skew_ms = CLOCK_SKEW_TOLERANCE.num_milliseconds().unsigned_abs();
    let retention_ms = PROVIDER_KEY_RETENTION.num_milliseconds().unsigned_abs();
    let sum_ms = safe_ms.saturating_add(skew_ms).saturating_add(call_timeout_ms);
    if sum_ms < retention_ms {
        return Ok(());
    }
    Err(format!(
        "charge.key_window_safe_minutes ({safe_minutes} min) + the clock skew tolerance ({} min) + provider.call_timeout_ms ({call_timeout_ms} ms) \
         = {}, which must stay under the provider's key retention ({} = {} h): a re-send could reach the provider after it forgot the key, and charge again",
        skew_ms / 60_000,
        seconds(sum_ms),
        seconds(retention_ms),
        retention_ms / 3_600_000,
    ))
}

/// `86410 s`, or `86400.5 s` when the milliseconds do not make whole seconds.
fn seconds(ms: u64) -> String {
    let fraction = format!("{:03}", ms % 1_000);
    let fraction = fraction.trim_end_matches('0');
    if fraction.is_empty() { format!("{} s", ms / 1_000) } else { format!("{}.{fraction} s", ms / 1_000) }
}

/// 64 lowercase hex digits: the form `chargeguard hash-token` prints and authentication compares.
/// Longest `client_cert_names` entry: a DNS name is at most 253 bytes; URIs get more room.
const CERTIFICATE_NAME_BYTES_MAX: usize = 1_024;

fn is_certificate_name(name: &str) -> bool {
    (1..=CERTIFICATE_NAME_BYTES_MAX).contains(&name.len()) && name.bytes().all(|byte| byte.is_ascii_graphic())
}

fn is_sha256_hex(hash: &str) -> bool {
    hash.len() == 64 && hash.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
}

/// One line per problem, each naming the option and where its value came from: the file, or the
/// exact environment variable (figment alone says "CHARGE.LEASE_MS in `CHARGEGUARD_` …").
fn describe_load_error(error: figment::Error) -> String {
    let problems: Vec<String> = error
        .into_iter()
        .map(|error| {
            let option = error.path.join(".");
            let source = match error.metadata.as_ref() {
                Some(metadata) => match &metadata.source {
                    Some(figment::Source::File(path)) => format!(" in {}", path.display()),
                    _ if metadata.name.contains("environment") => {
                        format!(" in environment variable CHARGEGUARD_{}", option.to_ascii_uppercase().replace('.', "__"))
                    }
                    _ => String::new(),
                },
                None => String::new(),
            };
            let option = if option.is_empty() { "(top level)".to_owned() } else { option };
            format!("{option}: {}{source}", error.kind)
        })
        .collect();
    problems.join("\n  - ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        Config::default().validate().unwrap();
    }

    #[test]
    fn operator_tokens_are_checked_and_never_shared_with_consumers() {
        let hash = "a".repeat(64);
        let config = Config {
            consumers: vec![ConsumerConfig { name: "orders".into(), token_sha256: hash.clone().into(), ..ConsumerConfig::default() }],
            operators: vec![
                OperatorConfig { name: "finance".into(), token_sha256: hash.into(), role: OperatorRole::Finance },
                OperatorConfig { name: "admin".into(), token_sha256: "B".repeat(64).into(), role: OperatorRole::Admin },
            ],
            ..Config::default()
        };
        let ConfigError::Invalid(problems) = config.validate().unwrap_err() else { panic!() };
        assert!(problems.iter().any(|p| p.contains("operators: \"finance\" has the same token_sha256 as consumer \"orders\"")), "{problems:?}");
        assert!(problems.iter().any(|p| p.contains("token_sha256 of \"admin\"")), "{problems:?}");
    }

    #[test]
    fn tls_and_certificate_identities_are_checked_together() {
        let consumer = |name: &str, cert: &str| ConsumerConfig {
            name: name.into(),
            client_cert_sha256: cert.to_owned().into(),
            ..ConsumerConfig::default()
        };
        let mut config = Config {
            consumers: vec![
                consumer("orders", &"a".repeat(64)),
                consumer("billing", &"a".repeat(64)),
                ConsumerConfig { name: "bare".into(), ..ConsumerConfig::default() },
                ConsumerConfig { name: "ledger".into(), client_cert_names: vec!["ledger.internal".into()], ..ConsumerConfig::default() },
                ConsumerConfig { name: "refunds".into(), client_cert_names: vec!["ledger.internal".into(), "has space".into()], ..ConsumerConfig::default() },
            ],
            ..Config::default()
        };
        config.server.tls_key_file = Some("key.pem".into());
        config.server.require_tls = true;
        config.server.grpc_listen = "0.0.0.0:50051".parse().unwrap();
        let ConfigError::Invalid(problems) = config.validate().unwrap_err() else { panic!() };
        for expected in [
            "\"orders\" has a client_cert_sha256 but server.tls_client_ca_file is unset",
            "\"billing\" has the same client_cert_sha256 as consumer \"orders\"",
            "\"bare\" needs a token_sha256, a client_cert_sha256 or client_cert_names",
            "\"ledger\" has client_cert_names but server.tls_client_ca_file is unset",
            "\"refunds\" has the client_cert_names entry \"ledger.internal\" of consumer \"ledger\"",
            "client_cert_names of \"refunds\" must be 1-1024 printable characters without spaces",
            "server.tls_cert_file and server.tls_key_file go together",
            "server.grpc_listen 0.0.0.0:50051 is not a loopback address and would speak plaintext",
        ] {
            assert!(problems.iter().any(|p| p.contains(expected)), "{expected} in {problems:?}");
        }
        assert!(!problems.iter().any(|p| p.contains("server.http_listen")), "loopback plaintext is allowed: {problems:?}");
    }

    #[test]
    fn a_token_hash_is_one_string_or_a_list() {
        let toml = format!(
            "[[consumers]]\nname = \"orders\"\ntoken_sha256 = \"{a}\"\n[[consumers]]\nname = \"billing\"\ntoken_sha256 = [\"{b}\", \"{c}\"]\n",
            a = "a".repeat(64),
            b = "b".repeat(64),
            c = "c".repeat(64)
        );
        let file = std::env::temp_dir().join(format!("cg-hashes-{}.toml", std::process::id()));
        std::fs::write(&file, toml).unwrap();
        let loaded = Config::load(Some(&file));
        std::fs::remove_file(&file).unwrap();
        let config = loaded.unwrap();
        assert_eq!(config.consumers[0].token_sha256.iter().count(), 1);
        assert_eq!(config.consumers[1].token_sha256.iter().collect::<Vec<_>>(), ["b".repeat(64), "c".repeat(64)]);
        config.validate().unwrap();
    }

    #[test]
    fn an_unknown_operator_role_does_not_load() {
        let toml = "[[operators]]\nname = \"support\"\ntoken_sha256 = \"x\"\nrole = \"support\"\n";
        let file = std::env::temp_dir().join(format!("cg-role-{}.toml", std::process::id()));
        std::fs::write(&file, toml).unwrap();
        let loaded = Config::load(Some(&file));
        std::fs::remove_file(&file).unwrap();
        assert!(matches!(loaded, Err(ConfigError::Load(message)) if message.contains("support")));
    }

    #[test]
    fn lists_every_problem() {
        let mut config = Config::default();
        config.charge.key_window_safe_minutes = 24 * 60;
        config.charge.lease_ms = 1;
        let ConfigError::Invalid(problems) = config.validate().unwrap_err() else { panic!() };
        assert!(problems.iter().any(|p| p.contains("key_window_safe_minutes")));
        assert!(problems.iter().any(|p| p.contains("lease_ms")));
    }

    #[test]
    fn webhook_retention_must_outlast_stripes_resend_window() {
        let mut config = Config::default();
        config.webhooks.retention_days = 30;
        let ConfigError::Invalid(problems) = config.validate().unwrap_err() else { panic!() };
        assert!(problems.iter().any(|p| p.contains("webhooks.retention_days")));
        config.webhooks.retention_days = 31;
        config.validate().unwrap();
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment::Jail's closure must return figment's own error
    fn webhook_secrets_come_from_the_environment_as_a_list() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("CHARGEGUARD_WEBHOOKS__SECRETS", r#"["whsec_old", "whsec_new"]"#);
            let config = Config::load(None).expect("loads");
            let secrets: Vec<&str> = config.webhooks.secrets.iter().map(Secret::expose).collect();
            assert_eq!(secrets, ["whsec_old", "whsec_new"]);
            assert!(!format!("{config:?}").contains("whsec_"), "never printed");
            Ok(())
        });
    }

    #[test]
    fn sweep_bounds_and_schedule_are_checked() {
        let mut config = Config::default();
        config.sweep.schedule = "* * * * *".into();
        config.sweep.batch_max = 0;
        config.sweep.concurrency_max = config.database.connections_max + 1;
        let ConfigError::Invalid(problems) = config.validate().unwrap_err() else { panic!() };
        for option in ["sweep.schedule", "sweep.batch_max", "sweep.concurrency_max"] {
            assert!(problems.iter().any(|p| p.contains(option)), "{option} in {problems:?}");
        }
        config.sweep = SweepConfig { schedule: "*/10 * * * * *".into(), ..SweepConfig::default() };
        config.validate().unwrap();
    }

    #[test]
    fn group_commit_batches_in_flight_are_bounded_by_the_pool() {
        let mut config = Config::default();
        for in_flight_max in [0, 9] {
            config.database.group_commit.in_flight_max = in_flight_max;
            let ConfigError::Invalid(problems) = config.validate().unwrap_err() else { panic!() };
            assert!(problems.iter().any(|p| p.contains("database.group_commit.in_flight_max")), "{problems:?}");
        }
        config.database.group_commit.in_flight_max = 8;
        config.validate().unwrap();
        config.database.connections_max = 7;
        let ConfigError::Invalid(problems) = config.validate().unwrap_err() else { panic!() };
        assert!(
            problems.iter().any(|p| p.contains("database.group_commit.in_flight_max")),
            "more batches in flight than connections: {problems:?}"
        );
    }
}
