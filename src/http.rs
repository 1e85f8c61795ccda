//! chargeguard's HTTP port: metrics and health for operators; `webhook::route` adds the Stripe
//! webhook endpoint. `metrics_router` is the same metrics on a listener of their own.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use axum::Router;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;

use crate::store::AttemptStore;

#[derive(Clone)]
pub struct HttpState {
    pub store: Arc<dyn AttemptStore>,
}

/// The HTTP port's operator routes; `/metrics` only when no metrics listener of its own is
/// configured (`server.metrics_listen`).
pub fn router(state: HttpState, with_metrics: bool) -> Router {
    let router = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .with_state(state);
    match with_metrics {
        true => router.route("/metrics", get(metrics)),
        false => router,
    }
}

/// What `server.metrics_listen` serves, in plaintext.
pub fn metrics_router() -> Router {
    Router::new().route("/metrics", get(metrics)).route("/healthz", get(|| async { "ok" }))
}

/// Serves `router` on `listener` as `axum::serve` does, plus a bound on reading each request's
/// headers (`header_read_timeout`: axum's own serve sets no timer, so a client sending headers
/// a byte at a time would hold its connection for ever). Stops accepting when `shutdown` is
/// cancelled, lets each connection finish the request it is on, and returns once all closed.
pub async fn serve<L>(mut listener: L, router: Router, header_read_timeout: Duration, shutdown: CancellationToken)
where
    L: axum::serve::Listener,
{
    let mut builder = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
    builder.http1().timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(header_read_timeout);
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let (io, _peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let (builder, shutdown) = (builder.clone(), shutdown.clone());
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        connections.spawn(async move {
            let connection = builder.serve_connection_with_upgrades(hyper_util::rt::TokioIo::new(io), service);
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                _ = shutdown.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
        });
        // Reap finished connections so the set holds only open ones.
        while connections.try_join_next().is_some() {}
    }
    while connections.join_next().await.is_some() {}
}

/// Cuts off a request, with 408, that is not received and answered within `timeout`: a webhook
/// whose body never arrives must not hold its connection (and a task) for ever.
pub fn with_request_timeout(router: Router, timeout: Duration) -> Router {
    router.layer(axum::middleware::from_fn(move |request: Request, next: Next| async move {
        match tokio::time::timeout(timeout, next.run(request)).await {
            Ok(response) => response,
            Err(_) => {
                metrics::counter!("chargeguard_http_requests_timed_out_total").increment(1);
                tracing::info!(timeout_ms = timeout.as_millis() as u64, "HTTP request cut off: not received and answered in time");
                (StatusCode::REQUEST_TIMEOUT, [(axum::http::header::CONNECTION, "close")], "request not received in time\n").into_response()
            }
        }
    }))
}

async fn metrics() -> impl IntoResponse {
    (
        [(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        crate::telemetry::metrics_handle().render(),
    )
}

async fn ready(State(state): State<HttpState>) -> impl IntoResponse {
    match state.store.ping().await {
        Ok(()) => (StatusCode::OK, "ready"),
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "database unavailable"),
    }
}
