//! Webhooks (issue 5, SEMANTICS.md invariants 2, 8, 9) through the real HTTP server, a real
//! database and the simulator's webhook sender. Every behaviour test runs on both stores
//! (`webhooks::postgres::…`, `webhooks::sqlite::…`, issue 17). The application's own background
//! worker is idle here (a long interval): each test drives `try_drain_once` / `try_prune_once`
//! itself.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chargeguard::clock::Clock;
use chargeguard::grpc::proto;
use chargeguard::grpc::proto::{AttemptStatus, ChargeOutcome};
use chargeguard::secret::Secret;
use chargeguard::simulator::{AuthenticationOutcome, Endpoint, FaultKind, FaultSpec, WebhookMode};
use chargeguard::store::postgres::PostgresPoolOptions;
use chargeguard::store::sqlite::SqliteStoreOptions;
use chargeguard::store::{CallerTime, PostgresStore, SqliteStore};
use chargeguard::store::inbox::{Claim, ClaimOwner, InboxOutcome, InboxStore, SettleEvent};
use chargeguard::webhook::decision;
use chargeguard::webhook::event::{Subject, parse_subject};
use chargeguard::webhook::signature::sign;
use chargeguard::webhook::worker::SettledEvent;
use chargeguard::webhook::{
    DrainOutcome, InboxWorker, Retention, RetentionSettings, WorkerSettings,
};
use tonic::Code;

use crate::support::faketime::ClockOffset;
use crate::support::{
    Backend, SIM_API_KEY, TestApp, charge_request, error_code, on_both_backends, outcome_of,
    status_of,
};

pub(crate) const SECRET: &str = "whsec_chargeguard_it";
const OLD_SECRET: &str = "whsec_chargeguard_it_old";
const CLAIM: Duration = Duration::from_secs(60);
/// Bound on what a child process is waited for (its first log line, its first passes); only a
/// hung child reaches it.
const CHILD_WAIT_MAX: Duration = Duration::from_secs(60);
const CHILD_POLL: Duration = Duration::from_millis(50);
/// Bound on drain passes in one test: far more than any test's events.
const DRAINS_MAX: usize = 100;

/// The test's own connections to the app's database, for statements only a test makes.
pub(crate) enum InboxDatabase {
    Postgres(PostgresStore),
    Sqlite(SqliteStore),
}

/// Runs `$body` with `$pool` bound to the test's pool of either store: the same SQL (portable,
/// `$N` parameters, which SQLite reads too) against either database.
macro_rules! on_pool {
    ($hooked:expr, |$pool:ident| $body:expr) => {
        match &$hooked.database {
            $crate::webhooks::InboxDatabase::Postgres(store) => {
                let $pool = store.pool();
                $body
            }
            $crate::webhooks::InboxDatabase::Sqlite(store) => {
                let $pool = store.pool();
                $body
            }
        }
    };
}

/// The app with webhooks on, the simulator sending to it, and a worker and a retention job of
/// the test's own on the same database and clock.
pub(crate) struct Hooked {
    pub(crate) app: TestApp,
    pub(crate) store: Arc<dyn InboxStore>,
    pub(crate) database: InboxDatabase,
    pub(crate) worker: InboxWorker,
}

impl Hooked {
    /// On PostgreSQL.
    pub(crate) async fn spawn() -> Self {
        Self::spawn_on(Backend::Postgres).await
    }

    pub(crate) async fn spawn_on(backend: Backend) -> Self {
        Self::spawn_backend_with(backend, |_| {}).await
    }

    pub(crate) async fn spawn_backend_with(
        backend: Backend,
        customize: impl FnOnce(&mut chargeguard::config::Config),
    ) -> Self {
        let app = TestApp::spawn_backend_with(backend, |config| {
            config.webhooks.secrets = vec![Secret::new(OLD_SECRET), Secret::new(SECRET)];
            config.webhooks.worker_interval_ms = 3_600_000;
            config.webhooks.retention_interval_ms = 86_400_000;
            customize(config);
        })
        .await;
        app.sim()
            .set_webhook_target(format!("http://{}/webhooks/stripe", app.http_addr), SECRET)
            .await
            .unwrap();
        let (store, database) = store_of(&app).await;
        let worker = worker_on(&app, store.clone(), 100);
        Self { app, store, database, worker }
    }

    /// The test's own pool on PostgreSQL.
    pub(crate) fn database_pool(&self) -> &sqlx::PgPool {
        match &self.database {
            InboxDatabase::Postgres(store) => store.pool(),
            InboxDatabase::Sqlite(_) => panic!("a PostgreSQL test"),
        }
    }

    fn retention(&self, batch_max: u32) -> Retention {
        Retention::new(
            self.store.clone(),
            self.app.clock.clone(),
            RetentionSettings {
                retention: chrono::Duration::days(35),
                batch_max,
                interval: Duration::from_secs(3_600),
            },
        )
    }

    /// The next `count` creates are applied by the provider and their answers lost.
    async fn lose_create_answers(&self, count: u32) {
        let fault = FaultSpec::next(FaultKind::ApplyThenDrop, count);
        self.app
            .sim()
            .set_fault(Endpoint::CreatePaymentIntent, fault)
            .await
            .unwrap();
    }

    /// Delivers everything the simulator has queued; every delivery must be acknowledged.
    pub(crate) async fn flush(&self) {
        let report = self.app.sim().flush_webhooks().await.unwrap();
        assert_eq!(report.pending, 0, "{report:?}");
        assert_eq!(report.given_up_total, 0, "{report:?}");
    }

    /// Delivers what the simulator queued, then drains the inbox.
    pub(crate) async fn deliver(&self) -> Vec<SettledEvent> {
        self.flush().await;
        self.drain().await
    }

    /// Moves the simulator's clock past the settlement delay of `processing` payments.
    async fn settle_processing_payments(&self) {
        self.app
            .sim()
            .advance_clock(Duration::from_secs(120))
            .await
            .unwrap();
    }

    /// Drains the inbox until the worker finds it empty; what was settled, in order.
    pub(crate) async fn drain(&self) -> Vec<SettledEvent> {
        let mut settled = Vec::new();
        for _ in 0..DRAINS_MAX {
            match self.worker.try_drain_once().await.unwrap() {
                DrainOutcome::EmptyInbox => return settled,
                DrainOutcome::Batch(report) => {
                    assert_eq!((report.claims_lost, report.unsettled), (0, 0));
                    settled.extend(report.settled);
                }
            }
        }
        panic!("the inbox did not drain in {DRAINS_MAX} passes");
    }

    /// (event id, event type, outcome) of every inbox row, oldest first.
    pub(crate) async fn inbox(&self) -> Vec<(String, String, Option<String>)> {
        on_pool!(self, |pool| {
            sqlx::query_as("SELECT event_id, event_type, outcome FROM webhook_inbox ORDER BY received_at, event_id")
                .fetch_all(pool)
                .await
                .unwrap()
        })
    }

    pub(crate) async fn post(&self, body: &str, signature: Option<String>) -> reqwest::StatusCode {
        let mut request = reqwest::Client::new()
            .post(format!("http://{}/webhooks/stripe", self.app.http_addr))
            .header("content-type", "application/json")
            .body(body.to_owned());
        if let Some(signature) = signature {
            request = request.header("stripe-signature", signature);
        }
        request.send().await.unwrap().status()
    }
}

/// A store of the test's own on the app's database (its own pool, as another replica's).
async fn store_of(app: &TestApp) -> (Arc<dyn InboxStore>, InboxDatabase) {
    match app.database.sqlite_path() {
        None => {
            let options = PostgresPoolOptions {
                connections_max: 4,
                acquire_timeout: Duration::from_secs(5),
                statement_timeout: Duration::from_secs(5),
            };
            let store = PostgresStore::connect_lazy(&app.database.url, &options).unwrap();
            (Arc::new(store.clone()), InboxDatabase::Postgres(store))
        }
        Some(path) => {
            let options = SqliteStoreOptions {
                connections_max: 4,
                acquire_timeout: Duration::from_secs(5),
                busy_timeout: Duration::from_secs(5),
            };
            let store = SqliteStore::open(SqliteStore::file(&path), &options).await.unwrap();
            (Arc::new(store.clone()), InboxDatabase::Sqlite(store))
        }
    }
}

/// A worker of the test's own on `store`, claiming `batch_max` events at a time.
fn worker_on(app: &TestApp, store: Arc<dyn InboxStore>, batch_max: u32) -> InboxWorker {
    InboxWorker::new(
        store,
        app.clock.clone(),
        WorkerSettings {
            batch_max,
            claim_duration: CLAIM,
            interval: Duration::from_secs(3_600),
        },
        app.orchestrator.outcome_cache().clone(),
    )
}

pub(crate) fn outcomes(settled: &[SettledEvent], event_type: &str) -> Vec<InboxOutcome> {
    settled
        .iter()
        .filter(|s| s.event_type == event_type)
        .map(|s| s.outcome)
        .collect()
}

pub(crate) fn status(attempt: &proto::Attempt) -> AttemptStatus {
    AttemptStatus::try_from(attempt.status).unwrap()
}

fn wall_now() -> i64 {
    chargeguard::clock::SystemClock.now().timestamp()
}

/// A payment_intent event as Stripe would send it, for requests the simulator cannot make.
fn intent_event(
    event_id: &str,
    event_type: &str,
    intent_id: &str,
    status: &str,
    attempt_id: &str,
) -> String {
    serde_json::json!({
        "id": event_id, "object": "event", "type": event_type, "created": wall_now(),
        "api_version": "2026-09-30.endive", "livemode": false,
        "data": {"object": {
            "id": intent_id, "object": "payment_intent", "status": status, "amount": 1_000,
            "amount_received": 1_000, "currency": "usd", "created": wall_now(),
            "metadata": {"chargeguard_attempt_id": attempt_id},
            "last_payment_error": null, "next_action": null,
        }},
    })
    .to_string()
}

/// A real `chargeguard serve` (the binary under test) on `hooked`'s database and simulator, its
/// wall clock moved by `clock`: its webhook worker drains every 50 ms with the tests' claim, its
/// sweep is off, its listeners on ports of their own, its log read as it goes. Killed when
/// dropped.
pub(crate) struct ServeBeside {
    pub(crate) process: tokio::process::Child,
    log: Arc<Mutex<Vec<String>>>,
    clock: ClockOffset,
    /// The real time just before it started.
    started_at: chrono::DateTime<chrono::Utc>,
}

impl ServeBeside {
    /// Starts it, `settings` added to its environment.
    pub(crate) fn start(hooked: &Hooked, clock: ClockOffset, settings: &[(&str, &str)]) -> Self {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_chargeguard"));
        command
            .args(["--log-format", "json", "serve"])
            .env("RUST_LOG", "info,sqlx=warn")
            .env("CHARGEGUARD_DATABASE__URL", &hooked.app.database.url)
            .env("CHARGEGUARD_PROVIDER__API_KEY", SIM_API_KEY)
            .env("CHARGEGUARD_PROVIDER__BASE_URL", hooked.app.simulator.base_url())
            .env("CHARGEGUARD_SERVER__GRPC_LISTEN", "127.0.0.1:0")
            .env("CHARGEGUARD_SERVER__HTTP_LISTEN", "127.0.0.1:0")
            .env("CHARGEGUARD_SWEEP__ENABLED", "false")
            .env("CHARGEGUARD_WEBHOOKS__WORKER_INTERVAL_MS", "50")
            .env("CHARGEGUARD_WEBHOOKS__WORKER_CLAIM_MS", CLAIM.as_millis().to_string())
            .envs(settings.iter().copied())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        clock.apply(&mut command);
        let started_at = chrono::Utc::now();
        let mut process = command.spawn().expect("chargeguard serve starts");
        let log = Arc::new(Mutex::new(Vec::new()));
        crate::recovery::child::drain(process.stderr.take().unwrap(), log.clone(), None);
        Self { process, log, clock, started_at }
    }

    /// Checks, by the first line it logs, that its clock runs as far off the real one as it
    /// was given (see `ClockOffset::assert_read_by_child`); waits for that line.
    pub(crate) async fn assert_clock(&self) {
        let stamped = wait_for_child(
            async || self.log.lock().unwrap().iter().find_map(|line| crate::recovery::child::log_timestamp(line)),
            Option::is_some,
            "the child logged no timestamped line",
        )
        .await;
        self.clock.assert_read_by_child(stamped.expect("waited for"), self.started_at);
    }
}

/// Reads with `read` every `CHILD_POLL` until `done` holds of the reading, and returns it;
/// panics with `never` and the last reading after `CHILD_WAIT_MAX`.
pub(crate) async fn wait_for_child<T: std::fmt::Debug>(
    mut read: impl AsyncFnMut() -> T,
    done: impl Fn(&T) -> bool,
    never: &str,
) -> T {
    let deadline = tokio::time::Instant::now() + CHILD_WAIT_MAX;
    loop {
        let reading = read().await;
        if done(&reading) {
            return reading;
        }
        assert!(tokio::time::Instant::now() < deadline, "{never}: {reading:?}");
        tokio::time::sleep(CHILD_POLL).await;
    }
}

/// A create whose answer is lost after the provider applied it: the call reports an unknown
/// outcome and the attempt stays pending with no provider object known.
async fn charge_with_lost_answer(hooked: &Hooked, operation_key: &str) -> proto::Attempt {
    send_with_lost_answer(hooked, charge_request(operation_key)).await
}

/// [`charge_with_lost_answer`] for a request of the caller's.
pub(crate) async fn send_with_lost_answer(hooked: &Hooked, request: proto::ChargeRequest) -> proto::Attempt {
    let operation_key = request.operation_key.clone();
    let error = hooked.app.charge(request).await.unwrap_err();
    assert_eq!(error.code(), Code::Unavailable, "{error:?}");
    assert_eq!(error_code(&error), "outcome_unknown");
    let attempt = hooked.app.attempt_of(&operation_key).await;
    assert_eq!(status(&attempt), AttemptStatus::Pending);
    assert!(
        attempt.provider_payment_id.is_empty(),
        "the answer naming the object was lost"
    );
    attempt
}

async fn a_charge_left_pending_by_a_lost_answer_is_completed_by_its_webhook(backend: Backend) {
    let hooked = Hooked::spawn_on(backend).await;
    hooked.lose_create_answers(1).await;
    charge_with_lost_answer(&hooked, "order-wh-1").await;

    let settled = hooked.deliver().await;
    assert_eq!(
        outcomes(&settled, "payment_intent.succeeded"),
        [InboxOutcome::Applied]
    );

    let attempt = hooked.app.attempt_of("order-wh-1").await;
    assert_eq!(status(&attempt), AttemptStatus::Succeeded);
    let ledger = hooked.app.sim().ledger().await.unwrap();
    assert_eq!(ledger.payment_intents.len(), 1);
    assert_eq!(
        attempt.provider_payment_id, ledger.payment_intents[0].id,
        "found by the metadata, bound to the object"
    );
    assert_eq!(attempt.provider_status, "succeeded");

    // The redelivered charge now gets the stored outcome without calling the provider again.
    let creates_before = hooked.app.sim().requests().await.unwrap().len();
    let again = hooked
        .app
        .charge(charge_request("order-wh-1"))
        .await
        .unwrap();
    assert_eq!(outcome_of(&again), ChargeOutcome::Duplicate);
    assert_eq!(status_of(&again), AttemptStatus::Succeeded);
    assert_eq!(
        hooked.app.sim().requests().await.unwrap().len(),
        creates_before
    );
}

async fn the_same_event_delivered_twice_is_stored_once_and_applied_once(backend: Backend) {
    let hooked = Hooked::spawn_on(backend).await;
    hooked
        .app
        .sim()
        .set_webhook_mode(WebhookMode::Twice)
        .await
        .unwrap();
    hooked.lose_create_answers(1).await;
    charge_with_lost_answer(&hooked, "order-wh-2").await;
    hooked.flush().await;

    let deliveries = hooked.app.sim().deliveries().await.unwrap();
    let succeeded: Vec<_> = deliveries
        .iter()
        .filter(|d| d.event_type == "payment_intent.succeeded")
        .collect();
    assert_eq!(succeeded.len(), 2, "delivered twice");
    assert_eq!(succeeded[0].event_id, succeeded[1].event_id);
    assert!(
        succeeded
            .iter()
            .all(|d| d.delivered && d.status == Some(200)),
        "both acknowledged: {succeeded:?}"
    );
    let stored: Vec<_> = hooked
        .inbox()
        .await
        .into_iter()
        .filter(|(id, _, _)| *id == succeeded[0].event_id)
        .collect();
    assert_eq!(stored.len(), 1, "one row per event id");

    let settled = hooked.drain().await;
    assert_eq!(
        outcomes(&settled, "payment_intent.succeeded"),
        [InboxOutcome::Applied]
    );
    assert_eq!(
        status(&hooked.app.attempt_of("order-wh-2").await),
        AttemptStatus::Succeeded
    );
}

async fn two_distinct_events_for_one_change_apply_once(backend: Backend) {
    let hooked = Hooked::spawn_on(backend).await;
    hooked
        .app
        .sim()
        .set_webhook_mode(WebhookMode::DistinctDuplicates)
        .await
        .unwrap();
    hooked.lose_create_answers(1).await;
    charge_with_lost_answer(&hooked, "order-wh-3").await;
    hooked.flush().await;

    let stored: Vec<_> = hooked
        .inbox()
        .await
        .into_iter()
        .filter(|(_, kind, _)| kind == "payment_intent.succeeded")
        .collect();
    assert_eq!(stored.len(), 2, "two distinct events, two rows");
    assert_ne!(stored[0].0, stored[1].0);

    let settled = hooked.drain().await;
    let mut succeeded = outcomes(&settled, "payment_intent.succeeded");
    succeeded.sort_by_key(|outcome| outcome.as_str());
    assert_eq!(succeeded, [InboxOutcome::Applied, InboxOutcome::Duplicate]);
    assert_eq!(
        status(&hooked.app.attempt_of("order-wh-3").await),
        AttemptStatus::Succeeded
    );
    let detail: (String,) = on_pool!(hooked, |pool| {
        sqlx::query_as("SELECT detail FROM webhook_inbox WHERE outcome = 'duplicate'")
            .fetch_one(pool)
            .await
            .unwrap()
    });
    assert!(detail.0.starts_with("duplicate of evt_"), "{}", detail.0);
}

/// Records what the simulator delivers to it, to hand it to chargeguard later (out of order).
#[derive(Clone, Default)]
pub(crate) struct Recorder {
    received: Arc<Mutex<Vec<(String, String, String)>>>,
}

impl Recorder {
    pub(crate) async fn start() -> (Self, String) {
        let recorder = Self::default();
        let app = axum::Router::new()
            .route("/hook", axum::routing::post(record))
            .with_state(recorder.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (recorder, url)
    }

    /// (signature, body) of the recorded event of `event_type`.
    fn take(&self, event_type: &str) -> (String, String) {
        let received = self.received.lock().unwrap();
        let (_, signature, body) = received
            .iter()
            .find(|(kind, _, _)| kind == event_type)
            .expect("recorded");
        (signature.clone(), body.clone())
    }
}

async fn record(
    axum::extract::State(recorder): axum::extract::State<Recorder>,
    headers: axum::http::HeaderMap,
    body: String,
) -> axum::http::StatusCode {
    let signature = headers
        .get("stripe-signature")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let kind = serde_json::from_str::<serde_json::Value>(&body).unwrap()["type"]
        .as_str()
        .unwrap()
        .to_owned();
    recorder
        .received
        .lock()
        .unwrap()
        .push((kind, signature, body));
    axum::http::StatusCode::OK
}

async fn a_processing_event_after_success_never_moves_the_attempt_backwards(backend: Backend) {
    let hooked = Hooked::spawn_on(backend).await;
    // The processing event goes to a recorder first, so chargeguard sees it only after success.
    let (recorder, recorder_url) = Recorder::start().await;
    hooked
        .app
        .sim()
        .set_webhook_target(recorder_url, SECRET)
        .await
        .unwrap();
    let mut request = charge_request("order-wh-4");
    request.payment_method = "pm_sim_processing_succeeds".into();
    let response = hooked.app.charge(request).await.unwrap();
    assert_eq!(status_of(&response), AttemptStatus::Pending);
    hooked.flush().await;

    hooked
        .app
        .sim()
        .set_webhook_target(
            format!("http://{}/webhooks/stripe", hooked.app.http_addr),
            SECRET,
        )
        .await
        .unwrap();
    hooked.settle_processing_payments().await;
    let settled = hooked.deliver().await;
    assert_eq!(
        outcomes(&settled, "payment_intent.succeeded"),
        [InboxOutcome::Applied]
    );
    let succeeded = hooked.app.attempt_of("order-wh-4").await;
    assert_eq!(status(&succeeded), AttemptStatus::Succeeded);

    let (signature, body) = recorder.take("payment_intent.processing");
    assert_eq!(
        hooked.post(&body, Some(signature)).await,
        reqwest::StatusCode::OK,
        "stored like any event"
    );
    let settled = hooked.drain().await;
    assert_eq!(
        outcomes(&settled, "payment_intent.processing"),
        [InboxOutcome::Stale]
    );
    let after = hooked.app.attempt_of("order-wh-4").await;
    assert_eq!(status(&after), AttemptStatus::Succeeded);
    assert_eq!(after.provider_status, "succeeded");
    assert_eq!(
        after.updated_at, succeeded.updated_at,
        "the stale event wrote nothing"
    );

    // A decline arriving after success (hand-signed: the simulator never sends one) is stale too.
    let late_failure = intent_event(
        "evt_late_failure",
        "payment_intent.payment_failed",
        &after.provider_payment_id,
        "requires_payment_method",
        &after.attempt_id,
    );
    let signature = sign(&Secret::new(SECRET), wall_now(), late_failure.as_bytes());
    assert_eq!(
        hooked.post(&late_failure, Some(signature)).await,
        reqwest::StatusCode::OK
    );
    let settled = hooked.drain().await;
    assert_eq!(
        outcomes(&settled, "payment_intent.payment_failed"),
        [InboxOutcome::Stale]
    );
    assert_eq!(
        status(&hooked.app.attempt_of("order-wh-4").await),
        AttemptStatus::Succeeded
    );
}

async fn forged_stale_and_oversized_requests_are_rejected_and_nothing_is_stored(backend: Backend) {
    let hooked = Hooked::spawn_backend_with(backend, |config| config.webhooks.body_bytes_max = 4_096).await;
    let body = intent_event(
        "evt_signed",
        "payment_intent.succeeded",
        "pi_unknown",
        "succeeded",
        "00000000-0000-0000-0000-000000000000",
    );
    let secret = Secret::new(SECRET);
    let now = wall_now();
    let good = sign(&secret, now, body.as_bytes());
    let good_v1 = good.split_once(",v1=").unwrap().1.to_owned();

    let rejected = [
        ("no signature", body.clone(), None),
        (
            "another secret",
            body.clone(),
            Some(sign(&Secret::new("whsec_attacker"), now, body.as_bytes())),
        ),
        (
            "tampered body",
            body.replace("1000", "1"),
            Some(good.clone()),
        ),
        (
            "signature moved to another timestamp",
            body.clone(),
            Some(format!("t={},v1={good_v1}", now - 1)),
        ),
        (
            "stale",
            body.clone(),
            Some(sign(&secret, now - 301, body.as_bytes())),
        ),
        (
            // Ten minutes ahead, not 301 s: `now` is whole seconds, read before the requests
            // above; once the server's clock passed the next second (a CI run did), +301 s was
            // 300 s ahead, inside the inclusive tolerance. The exact bounds are signature.rs's
            // unit test, on a fixed clock.
            "from the future",
            body.clone(),
            Some(sign(&secret, now + 600, body.as_bytes())),
        ),
        ("malformed", body.clone(), Some("t=soon,v1=zz".to_owned())),
        (
            "signed, not an event",
            "{}".to_owned(),
            Some(sign(&secret, now, b"{}")),
        ),
    ];
    for (case, body, signature) in rejected {
        assert_eq!(
            hooked.post(&body, signature).await,
            reqwest::StatusCode::BAD_REQUEST,
            "{case}"
        );
    }
    let oversized = format!("{{\"pad\":\"{}\"}}", "x".repeat(5_000));
    let signature = sign(&secret, now, oversized.as_bytes());
    assert_eq!(
        hooked.post(&oversized, Some(signature)).await,
        reqwest::StatusCode::PAYLOAD_TOO_LARGE
    );
    assert!(hooked.inbox().await.is_empty(), "nothing stored");

    // Rotation: the old secret still verifies, and so does one good v1 among bad ones.
    let old = sign(&Secret::new(OLD_SECRET), now, body.as_bytes());
    assert_eq!(hooked.post(&body, Some(old)).await, reqwest::StatusCode::OK);
    let other = intent_event(
        "evt_signed_2",
        "payment_intent.succeeded",
        "pi_unknown",
        "succeeded",
        "00000000-0000-0000-0000-000000000000",
    );
    let other_v1 = sign(&secret, now, other.as_bytes())
        .split_once(",v1=")
        .unwrap()
        .1
        .to_owned();
    let several = format!("t={now},v1={},v1={other_v1}", "ab".repeat(32));
    assert_eq!(
        hooked.post(&other, Some(several)).await,
        reqwest::StatusCode::OK
    );
    assert_eq!(hooked.inbox().await.len(), 2);
}

async fn a_payment_that_settles_later_is_completed_by_its_webhook(backend: Backend) {
    let hooked = Hooked::spawn_on(backend).await;
    let mut request = charge_request("order-wh-5");
    request.payment_method = "pm_sim_processing_succeeds".into();
    let response = hooked.app.charge(request).await.unwrap();
    assert_eq!(status_of(&response), AttemptStatus::Pending);
    let settled = hooked.deliver().await;
    assert_eq!(
        outcomes(&settled, "payment_intent.processing"),
        [InboxOutcome::Stale],
        "pending stays pending"
    );
    assert_eq!(
        status(&hooked.app.attempt_of("order-wh-5").await),
        AttemptStatus::Pending
    );

    hooked.settle_processing_payments().await;
    let settled = hooked.deliver().await;
    assert_eq!(
        outcomes(&settled, "payment_intent.succeeded"),
        [InboxOutcome::Applied]
    );
    let attempt = hooked.app.attempt_of("order-wh-5").await;
    assert_eq!(status(&attempt), AttemptStatus::Succeeded);
    assert_eq!(
        attempt.provider_calls, 1,
        "the webhook, not a provider call, completed it"
    );
}

async fn three_d_secure_completed_by_the_customer_is_applied_by_its_webhook(backend: Backend) {
    let hooked = Hooked::spawn_on(backend).await;
    let mut request = charge_request("order-wh-6");
    request.payment_method = "pm_card_threeDSecure2Required".into();
    let response = hooked.app.charge(request).await.unwrap();
    assert_eq!(status_of(&response), AttemptStatus::RequiresAction);
    let intent_id = response.attempt.unwrap().provider_payment_id;
    let settled = hooked.deliver().await;
    assert_eq!(
        outcomes(&settled, "payment_intent.requires_action"),
        [InboxOutcome::Stale]
    );

    hooked
        .app
        .sim()
        .authenticate(&intent_id, AuthenticationOutcome::Succeed)
        .await
        .unwrap();
    let settled = hooked.deliver().await;
    assert_eq!(
        outcomes(&settled, "payment_intent.succeeded"),
        [InboxOutcome::Applied]
    );
    let attempt = hooked.app.attempt_of("order-wh-6").await;
    assert_eq!(status(&attempt), AttemptStatus::Succeeded);
    assert!(
        attempt.next_action.is_none(),
        "nothing left for the customer to do"
    );
}

async fn a_refund_made_outside_chargeguard_is_kept_as_an_unknown_object_and_counted(backend: Backend) {
    let hooked = Hooked::spawn_on(backend).await;
    let paid = hooked
        .app
        .charge(charge_request("order-wh-7"))
        .await
        .unwrap()
        .attempt
        .unwrap();
    let stripe = stripe::ClientBuilder::new(SIM_API_KEY)
        .url(hooked.app.simulator.base_url())
        .build()
        .unwrap();
    stripe_core::refund::CreateRefund::new()
        .payment_intent(paid.provider_payment_id.as_str())
        .send(&stripe)
        .await
        .unwrap();
    let settled = hooked.deliver().await;
    assert_eq!(
        outcomes(&settled, "payment_intent.succeeded"),
        [InboxOutcome::Stale],
        "the call already recorded it"
    );
    assert_eq!(
        outcomes(&settled, "refund.created"),
        [InboxOutcome::UnknownObject]
    );
    assert_eq!(
        outcomes(&settled, "charge.refunded"),
        [InboxOutcome::Stale],
        "a charge chargeguard made: its refunds settle by their own events"
    );
    assert_eq!(hooked.inbox().await.len(), 3, "kept, not dropped");
    assert_eq!(
        status(&hooked.app.attempt_of("order-wh-7").await),
        AttemptStatus::Succeeded,
        "a refund is a new operation"
    );

    let metrics = crate::support::metrics_text(hooked.app.http_addr).await;
    for needle in [
        r#"chargeguard_webhook_events_total{event_type="refund.created",outcome="unknown_object"}"#,
        r#"chargeguard_webhook_events_total{event_type="charge.refunded",outcome="stale"}"#,
        "chargeguard_webhook_inbox_depth",
        "chargeguard_webhook_inbox_oldest_age_seconds",
        r#"chargeguard_webhook_requests_total{result="stored"}"#,
    ] {
        assert!(metrics.contains(needle), "/metrics shows {needle}");
    }
}

async fn an_event_for_a_second_object_flags_the_attempt_and_changes_nothing_else(backend: Backend) {
    let hooked = Hooked::spawn_on(backend).await;
    let paid = hooked
        .app
        .charge(charge_request("order-wh-8"))
        .await
        .unwrap()
        .attempt
        .unwrap();
    let body = intent_event(
        "evt_second_object",
        "payment_intent.succeeded",
        "pi_second_object",
        "succeeded",
        &paid.attempt_id,
    );
    let signature = sign(&Secret::new(SECRET), wall_now(), body.as_bytes());
    assert_eq!(
        hooked.post(&body, Some(signature)).await,
        reqwest::StatusCode::OK
    );
    let settled = hooked.deliver().await;
    assert_eq!(
        settled
            .iter()
            .find(|s| s.event_id == "evt_second_object")
            .map(|s| s.outcome),
        Some(InboxOutcome::Conflict)
    );
    let attempt = hooked.app.attempt_of("order-wh-8").await;
    assert_eq!(status(&attempt), AttemptStatus::Succeeded);
    assert_eq!(
        attempt.provider_payment_id, paid.provider_payment_id,
        "keeps the object it adopted"
    );
    assert!(attempt.needs_review);
    assert!(
        attempt.review_reason.starts_with("double charge")
            && attempt.review_reason.contains("pi_second_object"),
        "{}",
        attempt.review_reason
    );
}

async fn a_flag_from_a_webhook_reaches_the_next_duplicate_at_once(backend: Backend) {
    // Decided outcomes are remembered far longer than this test runs.
    let hooked = Hooked::spawn_backend_with(backend, |config| config.charge.outcome_cache_ttl_ms = 600_000).await;
    let paid = hooked.app.charge(charge_request("order-wh-cache")).await.unwrap().attempt.unwrap();
    let remembered = hooked.app.charge(charge_request("order-wh-cache")).await.unwrap();
    assert_eq!(remembered.attempt.as_ref(), Some(&paid));

    let body = intent_event("evt_cache_second", "payment_intent.succeeded", "pi_cache_second", "succeeded", &paid.attempt_id);
    let signature = sign(&Secret::new(SECRET), wall_now(), body.as_bytes());
    assert_eq!(hooked.post(&body, Some(signature)).await, reqwest::StatusCode::OK);
    hooked.deliver().await;

    // The worker that flagged the row made this process forget its outcome.
    let again = hooked.app.charge(charge_request("order-wh-cache")).await.unwrap();
    assert_eq!(outcome_of(&again), ChargeOutcome::Duplicate);
    let attempt = again.attempt.unwrap();
    assert!(attempt.needs_review, "read from the database after the flag");
    assert!(attempt.review_reason.contains("pi_cache_second"), "{}", attempt.review_reason);
    assert_eq!(attempt.provider_payment_id, paid.provider_payment_id);
}

async fn pruning_deletes_only_processed_events_older_than_the_retention_in_batches(backend: Backend) {
    let hooked = Hooked::spawn_on(backend).await;
    let day = chrono::Duration::days(1);
    // An event a worker claimed and never settled: unprocessed rows are kept however old.
    hooked
        .app
        .charge(charge_request("order-old-stuck"))
        .await
        .unwrap();
    hooked.flush().await;
    let stuck_claim = Claim {
        owner: ClaimOwner::new(),
        duration: day * 365,
        time: CallerTime::of(&*hooked.app.clock),
    };
    let stuck = hooked.store.claim_events(stuck_claim, 1).await.unwrap();
    assert_eq!(stuck.len(), 1);

    for index in 0..3 {
        hooked
            .app
            .charge(charge_request(&format!("order-old-{index}")))
            .await
            .unwrap();
    }
    hooked.flush().await;
    assert_eq!(hooked.drain().await.len(), 3);

    hooked.app.clock.advance(day * 20);
    for index in 0..2 {
        hooked
            .app
            .charge(charge_request(&format!("order-recent-{index}")))
            .await
            .unwrap();
    }
    hooked.flush().await;
    assert_eq!(hooked.drain().await.len(), 2);
    let recent: Vec<String> = hooked
        .inbox()
        .await
        .into_iter()
        .skip(4)
        .map(|(id, _, _)| id)
        .collect();
    assert_eq!(recent.len(), 2);

    // 36 days after the first events, 16 after the recent ones; retention is 35 days.
    hooked.app.clock.advance(day * 16);
    let retention = hooked.retention(2);
    let mut batches = Vec::new();
    for _ in 0..10 {
        let counts = retention.try_prune_once().await.unwrap();
        batches.push((counts.inbox_rows, counts.dedup_rows));
        if counts.inbox_rows == 0 && counts.dedup_rows == 0 {
            break;
        }
    }
    assert_eq!(
        batches,
        [(2, 2), (1, 1), (0, 0)],
        "three old events, deleted two at a time"
    );

    let left = hooked.inbox().await;
    assert_eq!(left.len(), 3);
    assert_eq!(
        left[0].0, stuck[0].event_id,
        "the unprocessed old event is kept"
    );
    assert_eq!(left[0].2, None);
    let kept: Vec<String> = left.into_iter().skip(1).map(|(id, _, _)| id).collect();
    assert_eq!(kept, recent, "the recent events are kept");
    assert_eq!(
        hooked.app.attempt_rows().await,
        6,
        "payment_attempts is never pruned"
    );
}

/// Two workers in one process drain one inbox at once (issue 17's guarantee on SQLite, checked
/// on both stores). Claims taken concurrently never share an event; after those claims expire,
/// two workers drain concurrently, and each event is applied exactly once.
async fn two_workers_in_one_process_drain_one_inbox_and_each_event_is_applied_once(backend: Backend) {
    const CHARGES: usize = 6;
    let hooked = Hooked::spawn_on(backend).await;
    hooked.lose_create_answers(CHARGES as u32).await;
    for index in 0..CHARGES {
        charge_with_lost_answer(&hooked, &format!("order-two-workers-{index}")).await;
    }
    hooked.flush().await;
    assert_eq!(hooked.inbox().await.len(), CHARGES);

    // Two claims at once, each asking for more than half: they split the inbox between them.
    let claim = || Claim {
        owner: ClaimOwner::new(),
        duration: chrono::Duration::from_std(CLAIM).unwrap(),
        time: CallerTime::of(&*hooked.app.clock),
    };
    let (first, second) = tokio::join!(hooked.store.claim_events(claim(), 4), hooked.store.claim_events(claim(), 4));
    let mut claimed: Vec<String> =
        first.unwrap().into_iter().chain(second.unwrap()).map(|event| event.event_id).collect();
    claimed.sort();
    claimed.dedup();
    assert_eq!(claimed.len(), CHARGES, "every event claimed once, none twice");

    // Those claims expire unsettled (their holders "died"); two workers, batches of two, drain
    // at once on the runtime's two threads.
    hooked.app.clock.advance(chrono::Duration::from_std(CLAIM).unwrap() + chrono::Duration::seconds(1));
    let drains = (0..2).map(|_| {
        let worker = worker_on(&hooked.app, hooked.store.clone(), 2);
        tokio::spawn(async move {
            let mut settled = Vec::new();
            for _ in 0..DRAINS_MAX {
                match worker.try_drain_once().await.unwrap() {
                    DrainOutcome::EmptyInbox => return settled,
                    DrainOutcome::Batch(report) => {
                        assert_eq!((report.claims_lost, report.unsettled), (0, 0), "{report:?}");
                        settled.extend(report.settled);
                    }
                }
            }
            panic!("the inbox did not drain in {DRAINS_MAX} passes");
        })
    });
    let mut settled = Vec::new();
    for drain in drains.collect::<Vec<_>>() {
        settled.extend(drain.await.unwrap());
    }
    assert_eq!(settled.len(), CHARGES, "each event settled by one worker: {settled:?}");
    let mut ids: Vec<&str> = settled.iter().map(|event| event.event_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), CHARGES, "no event settled twice");
    assert!(settled.iter().all(|event| event.outcome == InboxOutcome::Applied), "{settled:?}");
    let applied: (i64,) = on_pool!(hooked, |pool| {
        sqlx::query_as("SELECT count(*) FROM webhook_inbox WHERE outcome = 'applied' AND claim_count = 2")
            .fetch_one(pool)
            .await
            .unwrap()
    });
    assert_eq!(applied.0, CHARGES as i64, "claimed twice (the expired claim, then a worker), applied once");
    for index in 0..CHARGES {
        let attempt = hooked.app.attempt_of(&format!("order-two-workers-{index}")).await;
        assert_eq!(status(&attempt), AttemptStatus::Succeeded);
    }
    assert_eq!(hooked.app.sim().ledger().await.unwrap().payment_intents.len(), CHARGES);
}

/// A signed post to the app's webhook endpoint.
async fn post_signed(app: &TestApp) -> reqwest::StatusCode {
    let body = intent_event(
        "evt_1",
        "payment_intent.succeeded",
        "pi_1",
        "succeeded",
        "x",
    );
    reqwest::Client::new()
        .post(format!("http://{}/webhooks/stripe", app.http_addr))
        .header(
            "stripe-signature",
            sign(&Secret::new(SECRET), wall_now(), body.as_bytes()),
        )
        .body(body)
        .send()
        .await
        .unwrap()
        .status()
}

async fn without_a_signing_secret_the_endpoint_does_not_exist(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    assert_eq!(
        post_signed(&app).await,
        reqwest::StatusCode::NOT_FOUND,
        "an endpoint that cannot verify accepts nothing"
    );
}

async fn an_event_for_a_corrupt_attempt_row_does_not_block_the_others(backend: Backend) {
    let hooked = Hooked::spawn_on(backend).await;
    hooked.lose_create_answers(2).await;
    let broken = charge_with_lost_answer(&hooked, "order-wh-broken").await;
    charge_with_lost_answer(&hooked, "order-wh-fine").await;
    let broken_id: uuid::Uuid = broken.attempt_id.parse().unwrap();
    on_pool!(hooked, |pool| {
        sqlx::query("UPDATE payment_attempts SET currency = 'not a currency' WHERE id = $1")
            .bind(broken_id)
            .execute(pool)
            .await
            .unwrap()
            .rows_affected()
    });
    hooked.flush().await;

    let DrainOutcome::Batch(report) = hooked.worker.try_drain_once().await.unwrap() else {
        panic!("two events to drain")
    };
    assert_eq!(report.unsettled, 1, "{report:?}");
    assert_eq!(report.count(InboxOutcome::Applied), 1, "{report:?}");
    assert_eq!(
        status(&hooked.app.attempt_of("order-wh-fine").await),
        AttemptStatus::Succeeded
    );
    let unsettled: (i64,) = on_pool!(hooked, |pool| {
        sqlx::query_as("SELECT count(*) FROM webhook_inbox WHERE processed_at IS NULL")
            .fetch_one(pool)
            .await
            .unwrap()
    });
    assert_eq!(unsettled.0, 1, "kept for a person to look at, not dropped");
}

/// A counter's value on `/metrics` (0 when not yet rendered). The recorder is one per test
/// binary, so tests compare before and after.
pub(crate) async fn counter(app: &TestApp, name: &str) -> f64 {
    let text = crate::support::metrics_text(app.http_addr).await;
    crate::support::series_value(&text, &format!("{name} ")).unwrap_or(0.0)
}

/// A charge declined through chargeguard: the attempt is failed and its intent, left
/// `requires_payment_method` by the provider, can still be confirmed by anyone holding the key.
async fn declined_charge(hooked: &Hooked, operation_key: &str) -> proto::Attempt {
    let mut request = charge_request(operation_key);
    request.payment_method = "pm_card_chargeDeclined".into();
    let declined = hooked.app.charge(request).await.unwrap();
    assert_eq!(status_of(&declined), AttemptStatus::Failed);
    let attempt = declined.attempt.unwrap();
    assert!(!attempt.provider_payment_id.is_empty(), "the decline names its intent");
    assert!(!attempt.needs_review);
    attempt
}

async fn a_declined_intent_confirmed_later_flags_the_failed_attempt_and_is_reported(backend: Backend) {
    // Decided outcomes are remembered far longer than this test runs.
    let hooked = Hooked::spawn_backend_with(backend, |config| config.charge.outcome_cache_ttl_ms = 600_000).await;
    let key = "order-wh-reconfirmed";
    let failed = declined_charge(&hooked, key).await;
    let settled = hooked.deliver().await;
    assert_eq!(
        outcomes(&settled, "payment_intent.payment_failed"),
        [InboxOutcome::Stale],
        "the call already recorded the decline"
    );
    let mut duplicate = charge_request(key);
    duplicate.payment_method = "pm_card_chargeDeclined".into();
    let remembered = hooked.app.charge(duplicate.clone()).await.unwrap();
    assert_eq!(remembered.attempt.as_ref(), Some(&failed), "answered from memory");

    // Someone holding the key confirms the same intent again, with a card that works.
    let stripe = stripe::ClientBuilder::new(SIM_API_KEY)
        .url(hooked.app.simulator.base_url())
        .build()
        .unwrap();
    let paid = stripe_core::payment_intent::ConfirmPaymentIntent::new(
        failed.provider_payment_id.as_str(),
    )
    .payment_method("pm_card_visa")
    .send(&stripe)
    .await
    .unwrap();
    assert_eq!(paid.status, stripe_core::PaymentIntentStatus::Succeeded);

    let counted_before = counter(&hooked.app, "chargeguard_succeeded_after_failure_total").await;
    let flagged_before = counter(&hooked.app, "chargeguard_attempts_flagged_total{reason=\"succeeded_after_failure\"}").await;
    let settled = hooked.deliver().await;
    assert_eq!(
        outcomes(&settled, "payment_intent.succeeded"),
        [InboxOutcome::Flagged]
    );
    let counted = counter(&hooked.app, "chargeguard_succeeded_after_failure_total").await;
    assert!(counted >= counted_before + 1.0, "{counted_before} → {counted}");
    let flagged = counter(&hooked.app, "chargeguard_attempts_flagged_total{reason=\"succeeded_after_failure\"}").await;
    assert!(flagged >= flagged_before + 1.0, "flagged by its kind: {flagged_before} → {flagged}");

    let attempt = hooked.app.attempt_of(key).await;
    assert_eq!(status(&attempt), AttemptStatus::Failed, "states only move forward");
    assert_eq!(attempt.failure_code, failed.failure_code, "the decline stays recorded");
    assert_eq!(attempt.provider_payment_id, failed.provider_payment_id);
    assert!(attempt.needs_review);
    assert!(
        attempt.review_reason.starts_with("succeeded_after_failure: provider object")
            && attempt.review_reason.contains(&failed.provider_payment_id)
            && attempt.review_reason.contains("10.00 usd"),
        "{}",
        attempt.review_reason
    );
    let (outcome, detail): (String, String) = on_pool!(hooked, |pool| {
        sqlx::query_as(
            "SELECT outcome, detail FROM webhook_inbox WHERE event_type = 'payment_intent.succeeded'",
        )
        .fetch_one(pool)
        .await
        .unwrap()
    });
    assert_eq!((outcome.as_str(), detail.as_str()), ("flagged", attempt.review_reason.as_str()));

    // The worker made this process forget the decided outcome: the duplicate reads the flag.
    let again = hooked.app.charge(duplicate).await.unwrap();
    assert_eq!(outcome_of(&again), ChargeOutcome::Duplicate);
    assert_eq!(status_of(&again), AttemptStatus::Failed);
    assert!(again.attempt.unwrap().needs_review, "read from the database after the flag");

    // Reports run on PostgreSQL only on this branch: `ReportStore` on SQLite is another part of
    // issue 17.
    if backend != Backend::Postgres {
        return;
    }
    let (code, report) = crate::reports::run_json(&hooked.app, &[]).await;
    assert_eq!(code, 1, "a discrepancy makes the report unclean");
    let row = report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["attempt"]["operation_key"] == key)
        .expect("the attempt is reported");
    assert_eq!(row["category"], "status_mismatch");
    assert_eq!(row["discrepancy"], true);
    let detail = row["detail"].as_str().unwrap();
    assert!(detail.starts_with("succeeded_after_failure:"), "{detail}");
    assert_eq!(row["attempt"]["review_reason"], attempt.review_reason.as_str());
}

async fn a_success_decided_while_the_attempt_looked_pending_still_flags_it_once_keeping_earlier_reasons(backend: Backend) {
    let hooked = Hooked::spawn_on(backend).await;
    let failed = declined_charge(&hooked, "order-wh-raced").await;
    hooked.deliver().await;
    let failed_id: uuid::Uuid = failed.attempt_id.parse().unwrap();
    on_pool!(hooked, |pool| {
        sqlx::query("UPDATE payment_attempts SET review_reason = 'checked by ops' WHERE id = $1")
            .bind(failed_id)
            .execute(pool)
            .await
            .unwrap()
            .rows_affected()
    });

    assert_eq!(
        settle_as_if_pending(&hooked, &failed, "evt_raced_1").await,
        InboxOutcome::Flagged
    );
    let attempt = hooked.app.attempt_of("order-wh-raced").await;
    assert_eq!(status(&attempt), AttemptStatus::Failed);
    assert!(
        attempt.review_reason.starts_with("checked by ops; succeeded_after_failure: "),
        "the earlier reason is kept: {}",
        attempt.review_reason
    );

    // The same news again adds nothing.
    assert_eq!(
        settle_as_if_pending(&hooked, &failed, "evt_raced_2").await,
        InboxOutcome::Stale
    );
    assert_eq!(hooked.app.attempt_of("order-wh-raced").await.review_reason, attempt.review_reason);
}

/// Stores a `payment_intent.succeeded` event for `failed`'s intent and settles it as the worker
/// would have decided from a read taken before the decline was recorded (the attempt pending):
/// move to succeeded. Only the database's guard sees that the attempt is failed.
async fn settle_as_if_pending(
    hooked: &Hooked,
    failed: &proto::Attempt,
    event_id: &str,
) -> InboxOutcome {
    let body = intent_event(
        event_id,
        "payment_intent.succeeded",
        &failed.provider_payment_id,
        "succeeded",
        &failed.attempt_id,
    );
    let signature = sign(&Secret::new(SECRET), wall_now(), body.as_bytes());
    assert_eq!(hooked.post(&body, Some(signature)).await, reqwest::StatusCode::OK);
    let claim = Claim {
        owner: ClaimOwner::new(),
        duration: chrono::Duration::minutes(1),
        time: CallerTime::of(&*hooked.app.clock),
    };
    let claimed = hooked.store.claim_events(claim, 10).await.unwrap();
    assert_eq!(claimed.len(), 1);
    let Subject::Payment { snapshot, .. } =
        parse_subject(&claimed[0].event_type, &claimed[0].payload).unwrap()
    else {
        panic!("a payment event")
    };
    let mut looked_pending = attempt_record(hooked, &failed.attempt_id).await;
    looked_pending.status = chargeguard::domain::AttemptStatus::Pending;
    let settlement = decision::for_payment(event_id, &snapshot, Some(&looked_pending));
    let settle = SettleEvent {
        event_id: event_id.to_owned(),
        owner: claim.owner,
        // A key of its own per event: each is judged by the attempt guard, not found a
        // duplicate of the other.
        dedup_key: Some((format!("{event_id}-object"), "payment_intent.succeeded".into())),
        settlement,
        time: CallerTime::of(&*hooked.app.clock),
    };
    hooked.store.settle_event(&settle).await.unwrap().expect("the claim is held")
}

/// The attempt as the store reads it.
pub(crate) async fn attempt_record(hooked: &Hooked, attempt_id: &str) -> chargeguard::domain::Attempt {
    let id = chargeguard::domain::AttemptId::from_uuid(attempt_id.parse().unwrap());
    hooked.store.find_attempt_for_payment("pi_none", Some(id)).await.unwrap().unwrap()
}

on_both_backends!(
    a_charge_left_pending_by_a_lost_answer_is_completed_by_its_webhook,
    the_same_event_delivered_twice_is_stored_once_and_applied_once,
    two_distinct_events_for_one_change_apply_once,
    a_processing_event_after_success_never_moves_the_attempt_backwards,
    forged_stale_and_oversized_requests_are_rejected_and_nothing_is_stored,
    a_payment_that_settles_later_is_completed_by_its_webhook,
    three_d_secure_completed_by_the_customer_is_applied_by_its_webhook,
    a_refund_made_outside_chargeguard_is_kept_as_an_unknown_object_and_counted,
    an_event_for_a_second_object_flags_the_attempt_and_changes_nothing_else,
    a_flag_from_a_webhook_reaches_the_next_duplicate_at_once,
    pruning_deletes_only_processed_events_older_than_the_retention_in_batches,
    without_a_signing_secret_the_endpoint_does_not_exist,
    an_event_for_a_corrupt_attempt_row_does_not_block_the_others,
    a_declined_intent_confirmed_later_flags_the_failed_attempt_and_is_reported,
    a_success_decided_while_the_attempt_looked_pending_still_flags_it_once_keeping_earlier_reasons,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    two_workers_in_one_process_drain_one_inbox_and_each_event_is_applied_once,
);

/// A worker killed mid-batch by a crash point, on both stores.
#[cfg(feature = "failpoints")]
mod killed;
/// Webhooks for intents that later attempts of their operation confirmed again (issue 16).
mod reconfirmed;
/// What a worker, a receiver or a pruner whose clock is off writes and deletes.
mod skewed;
