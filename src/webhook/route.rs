//! `POST /webhooks/stripe`: verify the signature over the raw body, store the event keyed by its
//! id, commit, answer 2xx. No business logic before the answer: the worker applies events later,
//! so a slow or failing apply never makes Stripe retry, and an acknowledged event is never lost.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;

use super::event::parse_envelope;
use super::signature::Verifier;
use crate::clock::Clock;
use crate::store::CallerTime;
use crate::store::inbox::{InboxInsert, InboxStore, NewInboxEvent};

pub const PATH: &str = "/webhooks/stripe";
const SIGNATURE_HEADER: &str = "stripe-signature";

#[derive(Clone)]
pub struct WebhookState {
    pub store: Arc<dyn InboxStore>,
    pub verifier: Arc<Verifier>,
    /// Checks the signature's timestamp. The sender signs with its wall clock, so this is wall
    /// time even where the service's business clock is moved (tests jump it by days).
    pub signature_clock: Arc<dyn Clock>,
    /// Its shift only (zero in the service) moves `received_at`, which the database stamps.
    pub clock: Arc<dyn Clock>,
}

/// The endpoint, with bodies over `body_bytes_max` refused with 413 before they are read whole.
pub fn router(state: WebhookState, body_bytes_max: usize) -> Router {
    Router::new()
        .route(PATH, post(receive))
        .layer(DefaultBodyLimit::max(body_bytes_max))
        .with_state(state)
}

type Answer = (StatusCode, &'static str);

async fn receive(
    State(state): State<WebhookState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    let (label, answer) = handle(&state, &headers, body).await;
    metrics::counter!("chargeguard_webhook_requests_total", "result" => label).increment(1);
    answer
}

async fn handle(
    state: &WebhookState,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> (&'static str, Answer) {
    let body = match body {
        Ok(body) => body,
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return (
                "too_large",
                (StatusCode::PAYLOAD_TOO_LARGE, "body too large"),
            );
        }
        Err(_) => {
            return (
                "unreadable_body",
                (StatusCode::BAD_REQUEST, "unreadable body"),
            );
        }
    };
    // A header that is not visible ASCII is as good as malformed.
    let signature = headers
        .get(SIGNATURE_HEADER)
        .map(|value| value.to_str().unwrap_or(""));
    if let Err(error) = state
        .verifier
        .verify(signature, &body, state.signature_clock.now())
    {
        tracing::warn!(reason = error.as_str(), "webhook rejected");
        return (
            error.as_str(),
            (StatusCode::BAD_REQUEST, "invalid signature"),
        );
    }
    let envelope = match parse_envelope(&body) {
        Ok(envelope) => envelope,
        Err(error) => {
            tracing::warn!(%error, "signed webhook is not a readable event");
            return (
                "not_an_event",
                (StatusCode::BAD_REQUEST, "not a readable event"),
            );
        }
    };
    let Ok(payload) = String::from_utf8(body.to_vec()) else {
        return (
            "not_an_event",
            (StatusCode::BAD_REQUEST, "not a readable event"),
        );
    };
    let event = NewInboxEvent {
        event_id: envelope.id,
        event_type: envelope.event_type,
        object_id: envelope.object_id,
        event_created_at: envelope.created,
        payload,
        time: CallerTime::of(state.clock.as_ref()),
    };
    match state.store.insert_event(&event).await {
        Ok(InboxInsert::Inserted) => {
            tracing::debug!(event_id = %event.event_id, event_type = %event.event_type, "webhook stored");
            ("stored", (StatusCode::OK, "stored"))
        }
        Ok(InboxInsert::AlreadyReceived) => ("redelivered", (StatusCode::OK, "already stored")),
        Err(error) => {
            // Not acknowledged: Stripe delivers it again later.
            tracing::error!(%error, event_id = %event.event_id, "webhook not stored");
            (
                "store_unavailable",
                (StatusCode::SERVICE_UNAVAILABLE, "not stored; retry"),
            )
        }
    }
}
