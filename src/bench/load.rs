//! The load generator: `concurrency` callers share `connections` gRPC connections and call
//! `Charge` in a closed loop (each caller sends its next call when the previous one answered),
//! first priming keys for duplicates, then warming up, then measuring until the duration or the
//! request count runs out, whichever comes first.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use super::mix::{CallKind, DuplicatePercent, KeyPool};
use super::report::{CallResult, LoadReport, Recorder, RunDescription};
use crate::domain::{AttemptId, ChargeParams, ConsumerName, OperationKey, derive_idempotency_key};
use crate::grpc::ERROR_CODE_METADATA;
use crate::provider::{CreatePayment, PaymentProvider, ProviderError};
use crate::grpc::proto::payments_client::PaymentsClient;
use crate::grpc::proto::payments_server::SERVICE_NAME as PAYMENTS_SERVICE_NAME;
use crate::grpc::proto::{ChargeOutcome, ChargeRequest};
use crate::secret::Secret;

pub const CONCURRENCY_MAX: u32 = 1_024;
pub const CONNECTIONS_MAX: u32 = 64;
pub const DURATION_SECONDS_MAX: u64 = 3_600;
pub const WARMUP_SECONDS_MAX: u64 = 600;
pub const REQUESTS_MAX: u64 = 10_000_000;
pub const PRIME_KEYS_MAX: u64 = 1_000_000;
pub const KEY_POOL_CAPACITY_MAX: usize = 1_000_000;
pub const REQUEST_TIMEOUT_MS_MIN: u64 = 100;
pub const REQUEST_TIMEOUT_MS_MAX: u64 = 300_000;
/// How long connecting to the service may take before the run gives up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Operation keys are at most 200 characters; the prefix leaves room for the worker and counter.
pub const KEY_PREFIX_LENGTH_MAX: usize = 120;

/// A validated load run. Built by [`LoadSettings::new`], which checks every bound.
#[derive(Debug, Clone)]
pub struct LoadSettings {
    pub label: String,
    /// `http://host:port` of chargeguard's gRPC server.
    pub endpoint: String,
    pub token: Secret,
    pub concurrency: u32,
    pub connections: u32,
    /// Measured phase length; with `requests` as well, whichever ends first.
    pub duration: Duration,
    pub requests: Option<u64>,
    pub warmup: Duration,
    pub duplicate_percent: DuplicatePercent,
    pub prime_keys: u64,
    pub key_pool_capacity: usize,
    /// Every operation key of the run starts with it, so a rerun never collides with old rows.
    pub key_prefix: String,
    pub payment_method: String,
    pub amount_minor: i64,
    pub request_timeout: Duration,
    pub seed: u64,
    pub target: CallTarget,
    /// TLS to the service (`--ca-file`, `--cert-file`, `--key-file`); `None` is plaintext.
    pub tls: Option<tonic::transport::ClientTlsConfig>,
}

/// What each call of the run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallTarget {
    /// `Payments/Charge`: the product's path.
    Charge,
    /// `grpc.health.v1.Health/Check` on the same server and connections: no database, no
    /// provider, no authentication. Its throughput is the ceiling of any unary call of this
    /// server on this machine, which tells how much of a charge's cost is gRPC itself.
    HealthCheck,
    /// A create straight to the provider (the simulator), through chargeguard's own provider
    /// client, one new idempotency key per call: the provider's own latency at this
    /// concurrency, which a charge's latency is compared with.
    ProviderCreate,
}

/// The parts of [`LoadSettings`] a caller chooses; `LoadSettings::new` checks them.
#[derive(Debug, Clone)]
pub struct LoadPlan {
    pub label: String,
    pub endpoint: String,
    pub token: Secret,
    pub concurrency: u32,
    pub connections: u32,
    pub duration_seconds: Option<u64>,
    pub requests: Option<u64>,
    pub warmup_seconds: u64,
    pub duplicate_percent: u8,
    pub prime_keys: u64,
    pub key_pool_capacity: usize,
    pub key_prefix: Option<String>,
    pub payment_method: String,
    pub amount_minor: i64,
    pub request_timeout_ms: u64,
    pub seed: u64,
    pub target: CallTarget,
    /// TLS to the service (`--ca-file`, `--cert-file`, `--key-file`); `None` is plaintext.
    pub tls: Option<tonic::transport::ClientTlsConfig>,
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("invalid bench settings:\n  - {}", .0.join("\n  - "))]
    Invalid(Vec<String>),
    #[error("cannot connect to {endpoint}: {reason}")]
    Connect { endpoint: String, reason: String },
}

impl LoadSettings {
    pub fn new(plan: LoadPlan) -> Result<Self, LoadError> {
        let mut problems = Vec::new();
        let mut check = |ok: bool, problem: &str| {
            if !ok {
                problems.push(problem.to_owned());
            }
        };
        check(
            (1..=CONCURRENCY_MAX).contains(&plan.concurrency),
            &format!("concurrency must be 1-{CONCURRENCY_MAX}"),
        );
        check(
            (1..=CONNECTIONS_MAX.min(plan.concurrency.max(1))).contains(&plan.connections),
            &format!("connections must be 1-{CONNECTIONS_MAX} and at most the concurrency"),
        );
        check(
            plan.duration_seconds
                .is_none_or(|s| (1..=DURATION_SECONDS_MAX).contains(&s)),
            &format!("duration must be 1-{DURATION_SECONDS_MAX} seconds"),
        );
        check(
            plan.requests
                .is_none_or(|n| (1..=REQUESTS_MAX).contains(&n)),
            &format!("requests must be 1-{REQUESTS_MAX}"),
        );
        check(
            plan.warmup_seconds <= WARMUP_SECONDS_MAX,
            &format!("warm-up must be at most {WARMUP_SECONDS_MAX} seconds"),
        );
        check(
            DuplicatePercent::new(plan.duplicate_percent).is_some(),
            "duplicate percent must be 0-100",
        );
        check(
            plan.prime_keys <= PRIME_KEYS_MAX,
            &format!("prime keys must be at most {PRIME_KEYS_MAX}"),
        );
        check(
            (1..=KEY_POOL_CAPACITY_MAX).contains(&plan.key_pool_capacity),
            &format!("key pool capacity must be 1-{KEY_POOL_CAPACITY_MAX}"),
        );
        check(
            plan.key_prefix.as_ref().is_none_or(|p| {
                p.len() <= KEY_PREFIX_LENGTH_MAX && p.bytes().all(|b| (0x21..=0x7e).contains(&b))
            }),
            &format!(
                "key prefix must be at most {KEY_PREFIX_LENGTH_MAX} printable ASCII characters without spaces"
            ),
        );
        check(plan.amount_minor > 0, "amount must be positive");
        check(
            (REQUEST_TIMEOUT_MS_MIN..=REQUEST_TIMEOUT_MS_MAX).contains(&plan.request_timeout_ms),
            &format!(
                "request timeout must be {REQUEST_TIMEOUT_MS_MIN}-{REQUEST_TIMEOUT_MS_MAX} ms"
            ),
        );
        check(!plan.token.is_empty(), "the bearer token is empty");
        check(
            plan.target == CallTarget::Charge || (plan.duplicate_percent == 0 && plan.prime_keys == 0),
            "only Charge runs have duplicates: duplicate percent and prime keys must be 0",
        );
        check(
            plan.endpoint.starts_with("http://") || plan.endpoint.starts_with("https://"),
            "endpoint must be an http:// or https:// URL",
        );
        if !problems.is_empty() {
            return Err(LoadError::Invalid(problems));
        }
        // A run bounded by count alone still ends: after the longest duration allowed.
        let duration_seconds = plan.duration_seconds.unwrap_or(DURATION_SECONDS_MAX);
        let key_prefix = plan.key_prefix.unwrap_or_else(|| {
            format!(
                "bench-{}-",
                &uuid::Uuid::new_v4().simple().to_string()[..12]
            )
        });
        Ok(Self {
            label: plan.label,
            endpoint: plan.endpoint,
            token: plan.token,
            concurrency: plan.concurrency,
            connections: plan.connections,
            duration: Duration::from_secs(duration_seconds),
            requests: plan.requests,
            warmup: Duration::from_secs(plan.warmup_seconds),
            duplicate_percent: DuplicatePercent::new(plan.duplicate_percent)
                .expect("checked above"),
            prime_keys: plan.prime_keys,
            key_pool_capacity: plan.key_pool_capacity,
            key_prefix,
            payment_method: plan.payment_method,
            amount_minor: plan.amount_minor,
            request_timeout: Duration::from_millis(plan.request_timeout_ms),
            seed: plan.seed,
            target: plan.target,
            tls: plan.tls,
        })
    }
}

/// Everything the callers share.
struct Shared {
    settings: LoadSettings,
    authorization: MetadataValue<tonic::metadata::Ascii>,
    pool: Mutex<KeyPool>,
    /// Tickets of the measured phase, when the run is bounded by count.
    tickets: AtomicU64,
    /// Numbers the priming calls.
    primed: AtomicU64,
    /// For [`CallTarget::ProviderCreate`]: the provider client and the request every call sends.
    provider: Option<DirectProvider>,
}

/// What a [`CallTarget::ProviderCreate`] run sends, built once.
pub struct DirectProvider {
    pub provider: Arc<dyn PaymentProvider>,
    pub consumer: ConsumerName,
    pub params: ChargeParams,
}

/// Runs the whole plan and returns what the measured phase saw.
pub async fn run(settings: LoadSettings, provider: Option<DirectProvider>) -> Result<LoadReport, LoadError> {
    if (settings.target == CallTarget::ProviderCreate) != provider.is_some() {
        return Err(LoadError::Invalid(vec!["a provider run needs the provider, and only it".to_owned()]));
    }
    let channels = connect(&settings).await?;
    let authorization = format!("Bearer {}", settings.token.expose())
        .parse()
        .map_err(|_| {
            LoadError::Invalid(vec![
                "the bearer token is not valid ASCII metadata".to_owned(),
            ])
        })?;
    let shared = Arc::new(Shared {
        pool: Mutex::new(KeyPool::new(settings.key_pool_capacity)),
        authorization,
        tickets: AtomicU64::new(0),
        primed: AtomicU64::new(0),
        provider,
        settings,
    });

    if shared.settings.prime_keys > 0 {
        let primers = spawn_callers(&shared, &channels, |shared, client, worker| {
            prime(shared, client, worker)
        });
        for primer in primers {
            let _ = primer.await;
        }
    }

    let warmup_end = Instant::now() + shared.settings.warmup;
    let measure_end = warmup_end + shared.settings.duration;
    let callers = spawn_callers(&shared, &channels, move |shared, client, worker| {
        call_loop(shared, client, worker, warmup_end, measure_end)
    });
    let mut total = Recorder::default();
    let mut last_finish = warmup_end;
    for caller in callers {
        if let Ok((recorder, finished)) = caller.await {
            total.merge(&recorder);
            last_finish = last_finish.max(finished);
        }
    }
    let settings = &shared.settings;
    let run = RunDescription {
        label: settings.label.clone(),
        concurrency: settings.concurrency,
        connections: settings.connections,
        duplicate_percent: settings.duplicate_percent.get(),
        primed_keys: shared.primed.load(Ordering::Relaxed),
        warmup_seconds: settings.warmup.as_secs(),
    };
    Ok(total.report(run, last_finish.saturating_duration_since(warmup_end)))
}

async fn connect(settings: &LoadSettings) -> Result<Vec<Channel>, LoadError> {
    let error = |reason: String| LoadError::Connect {
        endpoint: settings.endpoint.clone(),
        reason,
    };
    let endpoint = Endpoint::from_shared(settings.endpoint.clone())
        .map_err(|e| error(e.to_string()))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true);
    let endpoint = match &settings.tls {
        Some(tls) => endpoint.tls_config(tls.clone()).map_err(|e| error(format!("TLS: {e:?}")))?,
        None => endpoint,
    };
    let mut channels = Vec::with_capacity(settings.connections as usize);
    if settings.target == CallTarget::ProviderCreate {
        // No call goes to the service: channels that never connect keep the callers uniform.
        channels.push(endpoint.connect_lazy());
        return Ok(channels);
    }
    for _ in 0..settings.connections {
        channels.push(
            endpoint
                .connect()
                .await
                .map_err(|e| error(format!("{e:?}")))?,
        );
    }
    Ok(channels)
}

/// One caller's clients, on the connection it was given.
struct Clients {
    payments: PaymentsClient<Channel>,
    health: HealthClient<Channel>,
}

fn spawn_callers<F, Fut, T>(
    shared: &Arc<Shared>,
    channels: &[Channel],
    body: F,
) -> Vec<tokio::task::JoinHandle<T>>
where
    F: Fn(Arc<Shared>, Clients, u32) -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    (0..shared.settings.concurrency)
        .map(|worker| {
            let channel = channels[worker as usize % channels.len()].clone();
            let clients = Clients { payments: PaymentsClient::new(channel.clone()), health: HealthClient::new(channel) };
            tokio::spawn(body(shared.clone(), clients, worker))
        })
        .collect()
}

/// Charges new keys until `prime_keys` were sent; the answered ones become duplicates-to-be.
async fn prime(shared: Arc<Shared>, mut clients: Clients, worker: u32) {
    let mut rng = ChaCha8Rng::seed_from_u64(shared.settings.seed ^ 0x5052_494d ^ u64::from(worker));
    loop {
        let n = shared.primed.fetch_add(1, Ordering::Relaxed);
        if n >= shared.settings.prime_keys {
            shared.primed.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        let key: Arc<str> = Arc::from(format!("{}p{n}", shared.settings.key_prefix));
        if matches!(
            call(&shared, &mut clients, &key).await,
            CallResult::Answered(_)
        ) {
            shared.pool.lock().expect("pool lock").insert(key, &mut rng);
        }
    }
}

async fn call_loop(
    shared: Arc<Shared>,
    mut clients: Clients,
    worker: u32,
    warmup_end: Instant,
    measure_end: Instant,
) -> (Recorder, Instant) {
    let settings = &shared.settings;
    let mut rng = ChaCha8Rng::seed_from_u64(settings.seed ^ u64::from(worker));
    let mut recorder = Recorder::default();
    let mut sequence: u64 = 0;
    let mut finished = Instant::now();
    loop {
        let started = Instant::now();
        if started >= measure_end {
            break;
        }
        let measured = started >= warmup_end;
        if measured
            && let Some(requests) = settings.requests
            && shared.tickets.fetch_add(1, Ordering::Relaxed) >= requests
        {
            break;
        }
        let duplicate = {
            let pool = shared.pool.lock().expect("pool lock");
            match settings.duplicate_percent.choose(&mut rng, pool.is_empty()) {
                CallKind::Duplicate => pool.pick(&mut rng),
                CallKind::New => None,
            }
        };
        let (kind, key) = match duplicate {
            Some(key) => (CallKind::Duplicate, key),
            None => {
                sequence += 1;
                (
                    CallKind::New,
                    Arc::from(format!("{}w{worker}-{sequence}", settings.key_prefix)),
                )
            }
        };
        let result = match settings.target {
            CallTarget::Charge => call(&shared, &mut clients, &key).await,
            CallTarget::HealthCheck => health_check(&shared, &mut clients.health).await,
            CallTarget::ProviderCreate => provider_create(&shared, &key).await,
        };
        finished = Instant::now();
        if kind == CallKind::New && matches!(result, CallResult::Answered(_)) {
            shared.pool.lock().expect("pool lock").insert(key, &mut rng);
        }
        if measured {
            recorder.record(kind, finished - started, result);
        }
    }
    (recorder, finished)
}

/// One `Charge` call. The parameters depend only on the key, so a duplicate repeats its
/// original request exactly (a different one would be an `operation_mismatch`).
async fn call(shared: &Shared, clients: &mut Clients, key: &str) -> CallResult {
    let settings = &shared.settings;
    let mut request = tonic::Request::new(ChargeRequest {
        operation_key: key.to_owned(),
        amount_minor: settings.amount_minor,
        currency: "usd".to_owned(),
        payment_method: settings.payment_method.clone(),
        customer: None,
        description: Some("chargeguard bench".to_owned()),
        metadata: HashMap::from([("bench".to_owned(), settings.label.clone())]),
        attempt: None,
    });
    request
        .metadata_mut()
        .insert("authorization", shared.authorization.clone());
    match tokio::time::timeout(settings.request_timeout, clients.payments.charge(request)).await {
        Err(_) => CallResult::Failed("client_timeout".to_owned()),
        Ok(Ok(response)) => match ChargeOutcome::try_from(response.get_ref().outcome) {
            Ok(ChargeOutcome::Applied) => CallResult::Answered("applied"),
            Ok(ChargeOutcome::Duplicate) => CallResult::Answered("duplicate"),
            Ok(ChargeOutcome::Reconciled) => CallResult::Answered("reconciled"),
            Ok(ChargeOutcome::Unspecified) | Err(_) => CallResult::Answered("unspecified"),
        },
        Ok(Err(status)) => {
            let code = status
                .metadata()
                .get(ERROR_CODE_METADATA)
                .and_then(|value| value.to_str().ok())
                .unwrap_or("none");
            CallResult::Failed(format!("{}/{code}", crate::grpc::code_name(status.code())))
        }
    }
}

/// One health check of the Payments service (answered from memory by the server).
async fn health_check(shared: &Shared, client: &mut HealthClient<Channel>) -> CallResult {
    let request = HealthCheckRequest { service: PAYMENTS_SERVICE_NAME.to_owned() };
    match tokio::time::timeout(shared.settings.request_timeout, client.check(request)).await {
        Err(_) => CallResult::Failed("client_timeout".to_owned()),
        Ok(Ok(response)) => match ServingStatus::try_from(response.get_ref().status) {
            Ok(ServingStatus::Serving) => CallResult::Answered("serving"),
            _ => CallResult::Answered("not_serving"),
        },
        Ok(Err(status)) => CallResult::Failed(crate::grpc::code_name(status.code()).to_owned()),
    }
}

/// One create at the provider under a key of its own (the operation key doubles as it).
async fn provider_create(shared: &Shared, key: &str) -> CallResult {
    let Some(direct) = &shared.provider else {
        return CallResult::Failed("no_provider".to_owned());
    };
    let Ok(operation_key) = OperationKey::parse(key) else {
        return CallResult::Failed("bad_key".to_owned());
    };
    let idempotency_key = derive_idempotency_key(&direct.consumer, &operation_key, 0);
    let create = CreatePayment {
        attempt_id: AttemptId::from_uuid(uuid::Uuid::now_v7()),
        consumer: &direct.consumer,
        operation_key: &operation_key,
        params: &direct.params,
        idempotency_key: &idempotency_key,
        return_url: None,
    };
    match tokio::time::timeout(shared.settings.request_timeout, direct.provider.create_payment(create)).await {
        Err(_) => CallResult::Failed("client_timeout".to_owned()),
        Ok(Ok(_)) => CallResult::Answered("created"),
        Ok(Err(error)) => CallResult::Failed(
            match error {
                ProviderError::OutcomeUnknown(_) => "outcome_unknown",
                ProviderError::ReplayedFailure(_) => "replayed_failure",
                ProviderError::NotExecuted(_) => "not_executed",
                ProviderError::NotFound(_) => "not_found",
                ProviderError::KeyConflict(_) => "key_conflict",
            }
            .to_owned(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> LoadPlan {
        LoadPlan {
            label: "t".into(),
            endpoint: "http://127.0.0.1:50051".into(),
            token: Secret::new("token"),
            concurrency: 16,
            connections: 4,
            duration_seconds: Some(10),
            requests: None,
            warmup_seconds: 0,
            duplicate_percent: 0,
            prime_keys: 0,
            key_pool_capacity: 1_000,
            key_prefix: None,
            payment_method: "pm_card_visa".into(),
            amount_minor: 1_000,
            request_timeout_ms: 30_000,
            seed: 0,
            target: CallTarget::Charge,
            tls: None,
        }
    }

    #[test]
    fn every_bound_is_checked_and_all_problems_are_listed() {
        LoadSettings::new(plan()).unwrap();
        let mut bad = plan();
        bad.concurrency = CONCURRENCY_MAX + 1;
        bad.duration_seconds = Some(DURATION_SECONDS_MAX + 1);
        bad.requests = Some(REQUESTS_MAX + 1);
        bad.duplicate_percent = 101;
        bad.prime_keys = PRIME_KEYS_MAX + 1;
        bad.request_timeout_ms = 1;
        bad.key_prefix = Some("has space".into());
        let LoadError::Invalid(problems) = LoadSettings::new(bad).unwrap_err() else {
            panic!()
        };
        assert_eq!(problems.len(), 7, "{problems:?}");
    }

    #[test]
    fn more_connections_than_callers_is_refused_and_a_count_only_run_is_still_bounded() {
        let mut bad = plan();
        bad.concurrency = 2;
        bad.connections = 3;
        assert!(LoadSettings::new(bad).is_err());
        let mut count_only = plan();
        count_only.duration_seconds = None;
        count_only.requests = Some(10);
        let settings = LoadSettings::new(count_only).unwrap();
        assert_eq!(settings.duration, Duration::from_secs(DURATION_SECONDS_MAX));
    }
}
