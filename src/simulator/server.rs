//! Connections and the `/v1` request pipeline: route → authenticate → parse and validate →
//! (under the state lock) draw a fault and admit through the idempotency layer → execute in a
//! task of its own (so a client that goes away does not stop it, as at Stripe) → answer.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::SimulatorConfig;
use super::api::{Operation, route};
use super::clock::SimClock;
use super::control::{self, RequestLogEntry};
use super::faults::FaultKind;
use super::idempotency::{Admission, KEY_LENGTH_MAX};
use super::state::{ExecContext, State};
use super::webhooks::Webhooks;
use super::wire::{ApiError, ErrorType, Params, StoredResponse};

/// How often time-driven state (settlements, search index) catches up with the clock when no
/// request arrives.
const TICK_INTERVAL: Duration = Duration::from_secs(1);
/// Pause after a failed accept (e.g. out of file descriptors) before trying again.
const ACCEPT_RETRY_DELAY: Duration = Duration::from_millis(50);
/// Set (to `true`) on every answer replayed from the idempotency store, errors included, and
/// on no first answer, as Stripe does.
const REPLAYED_HEADER: &str = "idempotent-replayed";

/// A response about to be sent.
pub struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Reply {
    pub fn json(status: StatusCode, body: Bytes) -> Self {
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        Self {
            status,
            headers,
            body,
        }
    }

    /// A page for people (the 3-D Secure challenge).
    pub fn html(status: StatusCode, body: String) -> Self {
        let mut reply = Self::json(status, Bytes::from(body));
        reply.headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
        reply.headers.insert(http::header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        reply.headers.insert(
            http::header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static("default-src 'none'; form-action 'self'; frame-ancestors 'none'"),
        );
        reply
    }

    pub fn redirect(url: &str) -> Self {
        let mut reply = Self::json(StatusCode::FOUND, Bytes::new());
        if let Ok(location) = HeaderValue::from_str(url) {
            reply.headers.insert(http::header::LOCATION, location);
        }
        reply
    }

    fn stored(response: &StoredResponse) -> Self {
        Self::json(
            StatusCode::from_u16(response.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            response.body.clone(),
        )
    }

    fn error(error: &ApiError) -> Self {
        Self::stored(&error.clone().into_stored())
    }

    fn header(mut self, name: &'static str, value: &str) -> Self {
        if let Ok(value) = HeaderValue::from_str(value) {
            self.headers.insert(name, value);
        }
        self
    }

    fn into_response(self) -> Response<Full<Bytes>> {
        let mut response = Response::new(Full::new(self.body));
        *response.status_mut() = self.status;
        *response.headers_mut() = self.headers;
        response
    }
}

pub struct App {
    state: Mutex<State>,
    pub clock: SimClock,
    pub webhooks: Arc<Webhooks>,
    config: SimulatorConfig,
    base_url: String,
    shutdown: CancellationToken,
    /// Connections accepted since start: how a test sees whether clients keep them alive.
    connections_accepted: AtomicU64,
}

impl App {
    pub fn new(
        config: SimulatorConfig,
        local_addr: SocketAddr,
        shutdown: CancellationToken,
    ) -> anyhow::Result<Self> {
        let webhooks = Arc::new(Webhooks::new(
            config.webhook.clone(),
            config.seed,
            config.limits.clone(),
        )?);
        Ok(Self {
            state: Mutex::new(State::new(config.clone(), webhooks.clone())),
            clock: SimClock::default(),
            webhooks,
            config,
            base_url: format!("http://{local_addr}/"),
            shutdown,
            connections_accepted: AtomicU64::new(0),
        })
    }

    /// The state lock. A panic while holding it cannot leave money half-moved (operations
    /// build the new object first and store it last), so a poisoned lock is still used.
    pub fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn now(&self) -> i64 {
        self.clock.now()
    }

    pub fn connections_accepted(&self) -> u64 {
        self.connections_accepted.load(Ordering::Relaxed)
    }
}

pub async fn accept_loop(app: Arc<App>, listener: TcpListener) {
    let connections = Arc::new(Semaphore::new(app.config.limits.connections_max));
    loop {
        let permit = tokio::select! {
            () = app.shutdown.cancelled() => return,
            permit = connections.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return,
            },
        };
        let accepted = tokio::select! {
            () = app.shutdown.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, _peer)) => {
                app.connections_accepted.fetch_add(1, Ordering::Relaxed);
                let app = app.clone();
                tokio::spawn(async move {
                    serve_connection(app, stream).await;
                    drop(permit);
                });
            }
            Err(error) => {
                tracing::warn!(%error, "simulator accept failed");
                tokio::time::sleep(ACCEPT_RETRY_DELAY).await;
            }
        }
    }
}

/// Serves one connection. A handler that must drop the connection (fault `ApplyThenDrop`)
/// cancels `drop_connection`; this future then drops the hyper connection, which closes the
/// socket with no response written.
async fn serve_connection(app: Arc<App>, stream: tokio::net::TcpStream) {
    let drop_connection = CancellationToken::new();
    let service = {
        let app = app.clone();
        let drop_connection = drop_connection.clone();
        hyper::service::service_fn(move |request: Request<Incoming>| {
            let app = app.clone();
            let drop_connection = drop_connection.clone();
            async move {
                Ok::<_, Infallible>(
                    handle(&app, request, &drop_connection)
                        .await
                        .into_response(),
                )
            }
        })
    };
    let connection =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    tokio::select! {
        result = connection => {
            if let Err(error) = result {
                tracing::debug!(%error, "simulator connection ended with an error");
            }
        }
        () = drop_connection.cancelled() => tracing::debug!("simulator dropped a connection (fault)"),
        () = app.shutdown.cancelled() => {}
    }
}

/// Brings settlements and the search index up to the clock while no request arrives.
pub async fn tick_loop(app: Arc<App>) {
    loop {
        tokio::select! {
            () = app.shutdown.cancelled() => return,
            () = tokio::time::sleep(TICK_INTERVAL) => {}
        }
        let now = app.now();
        app.state().catch_up(now);
    }
}

async fn handle(
    app: &Arc<App>,
    request: Request<Incoming>,
    drop_connection: &CancellationToken,
) -> Reply {
    let request_id = format!("req_{}", &uuid::Uuid::new_v4().simple().to_string()[..14]);
    let path = request.uri().path().to_owned();
    let reply = if path.starts_with("/v1/") {
        handle_api(app, request, &request_id, drop_connection).await
    } else if path.starts_with("/_sim/") {
        let method = request.method().clone();
        match read_body(request.into_body(), app.config.limits.body_bytes_max).await {
            Ok(body) => control::handle(app, &method, &path, &body).await,
            Err(error) => Reply::error(&error),
        }
    } else {
        Reply::error(&unrecognized(request.method(), &path))
    };
    reply.header("request-id", &request_id)
}

fn unrecognized(method: &Method, path: &str) -> ApiError {
    let mut error = ApiError::invalid_request(
        None,
        format!("Unrecognized request URL ({method}: {path})."),
    );
    error.status = 404;
    error
}

async fn read_body(body: Incoming, bytes_max: usize) -> Result<Bytes, ApiError> {
    match Limited::new(body, bytes_max).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => {
            let mut error = ApiError::invalid_request(
                None,
                format!("The request body exceeds {bytes_max} bytes."),
            );
            error.status = 413;
            Err(error)
        }
        Err(_) => Err(ApiError::invalid_request(
            None,
            "The request body could not be read.",
        )),
    }
}

/// The secret key of `Authorization: Bearer sk_…` (or HTTP Basic with the key as user, as
/// `curl -u sk_test_…:` sends), if it is one of ours.
fn authenticate<'a>(headers: &HeaderMap, api_keys: &'a [String]) -> Result<&'a str, ApiError> {
    let unauthorized = |message: &str| {
        let mut error = ApiError::invalid_request(None, message);
        error.status = 401;
        error
    };
    let header = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .ok_or_else(|| {
            unauthorized("You did not provide an API key. Provide it as a Bearer token.")
        })?;
    let presented = if let Some(token) = header.strip_prefix("Bearer ") {
        token.trim().to_owned()
    } else if let Some(encoded) = header.strip_prefix("Basic ") {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .unwrap_or_default();
        decoded.split(':').next().unwrap_or_default().to_owned()
    } else {
        return Err(unauthorized(
            "Invalid authorization header: use Bearer <secret key>.",
        ));
    };
    api_keys
        .iter()
        .find(|key| key.as_str() == presented)
        .map(String::as_str)
        .ok_or_else(|| unauthorized("Invalid API Key provided."))
}

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let key = value.to_str().map_err(|_| {
        ApiError::invalid_request(None, "The Idempotency-Key header must be visible ASCII.")
    })?;
    if key.is_empty() {
        return Err(ApiError::invalid_request(
            None,
            "The Idempotency-Key header cannot be empty.",
        ));
    }
    if key.len() > KEY_LENGTH_MAX {
        return Err(ApiError::invalid_request(
            None,
            format!(
                "Keys for idempotent requests can only be up to {KEY_LENGTH_MAX} characters long."
            ),
        ));
    }
    Ok(Some(key.to_owned()))
}

fn injected_failure() -> ApiError {
    ApiError::new(
        500,
        ErrorType::Api,
        "An unexpected error occurred (injected by the simulator).",
    )
}

async fn handle_api(
    app: &Arc<App>,
    request: Request<Incoming>,
    request_id: &str,
    drop_connection: &CancellationToken,
) -> Reply {
    let mut log = LoggedRequest {
        app: app.clone(),
        entry: RequestLogEntry {
            seq: 0,
            request_id: request_id.to_owned(),
            method: request.method().to_string(),
            path: request.uri().path().to_owned(),
            query: request.uri().query().map(str::to_owned),
            endpoint: None,
            idempotency_key: None,
            replayed: false,
            status: None,
            fault: None,
            sim_time: app.now(),
        },
    };
    let outcome = run_api(app, request, request_id, &mut log.entry).await;
    let reply = match outcome {
        Outcome::Reply(reply) => reply,
        Outcome::Drop => {
            drop(log);
            drop_connection.cancel();
            // The connection task drops this future; nothing is ever sent.
            let never: Infallible = std::future::pending().await;
            match never {}
        }
    };
    log.entry.status = Some(reply.status.as_u16());
    drop(log);
    let version = super::WEBHOOK_API_VERSION;
    reply.header("stripe-version", version)
}

/// The request-log entry of one `/v1` request, written when the request ends, however it
/// ends: answered, dropped by a fault, or abandoned by a client that went away. In the last
/// case hyper drops the handler's future while the detached execution still creates the
/// object, so an entry written only after the answer would be missing for an object the ledger
/// has. An entry written without an answer keeps `status: None`.
struct LoggedRequest {
    app: Arc<App>,
    entry: RequestLogEntry,
}

impl Drop for LoggedRequest {
    fn drop(&mut self) {
        // Never dropped while this task holds the state lock: the lock is not held across an
        // `.await`, and the future is only dropped at one.
        self.app
            .state()
            .log_request(std::mem::take(&mut self.entry));
    }
}

enum Outcome {
    Reply(Reply),
    Drop,
}

async fn run_api(
    app: &Arc<App>,
    request: Request<Incoming>,
    request_id: &str,
    log: &mut RequestLogEntry,
) -> Outcome {
    let reject = |error: ApiError| Outcome::Reply(Reply::error(&error));
    let Some((endpoint, id)) = route(request.method(), request.uri().path()) else {
        return reject(unrecognized(request.method(), request.uri().path()));
    };
    log.endpoint = Some(endpoint.as_str().to_owned());
    let api_key = match authenticate(request.headers(), &app.config.api_keys) {
        Ok(key) => key.to_owned(),
        Err(error) => return reject(error),
    };
    // Stripe ignores idempotency keys on GET (they are idempotent by definition).
    let key = if request.method() == Method::POST {
        match idempotency_key(request.headers()) {
            Ok(key) => key,
            Err(error) => return reject(error),
        }
    } else {
        None
    };
    log.idempotency_key.clone_from(&key);
    let query = request.uri().query().unwrap_or_default().to_owned();
    let is_post = request.method() == Method::POST;
    let body = match read_body(request.into_body(), app.config.limits.body_bytes_max).await {
        Ok(body) => body,
        Err(error) => return reject(error),
    };
    let raw = if is_post {
        match std::str::from_utf8(&body) {
            Ok(text) => text.to_owned(),
            Err(_) => {
                return reject(ApiError::invalid_request(
                    None,
                    "The request body must be UTF-8.",
                ));
            }
        }
    } else {
        query
    };
    let params = match Params::parse(&raw, app.config.limits.params_max) {
        Ok(params) => params,
        Err(error) => return reject(error),
    };
    let fingerprint = format!(
        "{} {} {}",
        endpoint.as_str(),
        id.as_deref().unwrap_or_default(),
        params.fingerprint()
    );
    let operation = match Operation::parse(endpoint, id, params) {
        Ok(operation) => operation,
        Err(error) => return reject(error),
    };

    // Admission: the fault draw and the key reservation happen under one lock, so of two
    // concurrent requests with one key the one holding the key is the one delayed.
    let now = app.now();
    let fault = {
        let mut guard = app.state();
        let state = &mut *guard;
        state.catch_up(now);
        let fault = state.faults.draw(endpoint, &mut state.fault_rng);
        log.fault = fault.map(|kind| kind.name().to_owned());
        if fault == Some(FaultKind::FailBeforeApply) {
            return reject(injected_failure());
        }
        if let Some(key) = &key {
            match state.idempotency.admit(&api_key, key, &fingerprint, now) {
                Admission::Execute => {}
                Admission::Replay(stored) => {
                    log.replayed = true;
                    return Outcome::Reply(Reply::stored(&stored).header(REPLAYED_HEADER, "true"));
                }
                Admission::Reject(error) => return reject(error),
            }
        }
        if fault == Some(FaultKind::FailSaved) {
            // Execution "began" (the key is admitted) and failed before anything was applied:
            // the 500 is what the key now answers.
            let failure = injected_failure().into_stored();
            if let Some(key) = &key {
                state.idempotency.complete(&api_key, key, failure.clone());
            }
            return Outcome::Reply(Reply::stored(&failure));
        }
        fault
    };

    let ctx = ExecContext {
        now,
        request_id: request_id.to_owned(),
        idempotency_key: key.clone(),
        base_url: app.base_url.clone(),
    };
    let latency = match fault {
        Some(FaultKind::Latency(ms)) => Duration::from_millis(ms),
        _ => Duration::ZERO,
    };
    let saved_instead = match fault {
        Some(FaultKind::ApplyThenFailSaved) => Some(injected_failure().into_stored()),
        _ => None,
    };
    let save = Save {
        api_key,
        key,
        instead: saved_instead.clone(),
    };
    let stored = execute_detached(app, operation, ctx, save, latency).await;
    match fault {
        Some(FaultKind::ApplyThenFail) => reject(injected_failure()),
        Some(FaultKind::ApplyThenDrop) => Outcome::Drop,
        _ => Outcome::Reply(Reply::stored(saved_instead.as_ref().unwrap_or(&stored))),
    }
}

/// What an executed request saves under its idempotency key.
struct Save {
    api_key: String,
    /// `None`: the request has no key, nothing is saved.
    key: Option<String>,
    /// Saved (and answered) instead of the executed result (fault `ApplyThenFailSaved`).
    instead: Option<StoredResponse>,
}

/// Executes in its own task: once admitted, a request completes and saves its response even if
/// the client disconnects meanwhile (as at Stripe).
async fn execute_detached(
    app: &Arc<App>,
    operation: Operation,
    ctx: ExecContext,
    save: Save,
    latency: Duration,
) -> StoredResponse {
    let app = app.clone();
    let task = tokio::spawn(async move {
        // Not even a zero sleep: tokio's timer rounds every deadline up to its next
        // millisecond tick, which added up to 1 ms to every create at "zero added latency".
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        let mut state = app.state();
        let stored = state.execute(operation, &ctx);
        if let Some(key) = &save.key {
            let saved = save.instead.unwrap_or_else(|| stored.clone());
            state.idempotency.complete(&save.api_key, key, saved);
        }
        stored
    });
    task.await.unwrap_or_else(|_| {
        ApiError::internal("The simulator failed to execute the request.").into_stored()
    })
}
