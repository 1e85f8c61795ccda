//! `/_sim` control routes (JSON in and out, no authentication: the simulator is a local tool)
//! and the types they exchange, shared with [`super::SimControl`].

use std::collections::BTreeMap;

use bytes::Bytes;
use http::{Method, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::WebhookTarget;
use super::faults::{FaultSpec, FaultTarget};
use super::model::{Confirmation, Origin};
use super::server::{App, Reply};
use super::webhooks::WebhookMode;

/// Everything really created or refunded at the provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ledger {
    /// In creation order.
    pub payment_intents: Vec<LedgerPaymentIntent>,
    /// In creation order.
    pub refunds: Vec<LedgerRefund>,
}

impl Ledger {
    /// Intents that hold money now (`succeeded`).
    pub fn succeeded_payment_intents(&self) -> impl Iterator<Item = &LedgerPaymentIntent> {
        self.payment_intents
            .iter()
            .filter(|intent| intent.status == "succeeded")
    }

    /// Intents whose metadata has `key` = `value`.
    pub fn payment_intents_with_metadata<'a>(
        &'a self,
        key: &'a str,
        value: &'a str,
    ) -> impl Iterator<Item = &'a LedgerPaymentIntent> {
        self.payment_intents
            .iter()
            .filter(move |intent| intent.metadata.get(key).is_some_and(|found| found == value))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerPaymentIntent {
    pub id: String,
    /// The key of the request that created it (`None`: no key, or seeded).
    pub idempotency_key: Option<String>,
    pub metadata: BTreeMap<String, String>,
    pub amount: i64,
    pub amount_received: i64,
    pub amount_refunded: i64,
    pub currency: String,
    pub status: String,
    /// Sim clock.
    pub created: i64,
    pub origin: Origin,
    /// Where the customer is sent back after an action, as the last create or confirm set it.
    #[serde(default)]
    pub return_url: Option<String>,
    /// Its latest confirmations (payments attempted on it), oldest first.
    #[serde(default)]
    pub confirmations: Vec<Confirmation>,
    /// Every confirmation, including those no longer listed.
    #[serde(default)]
    pub confirmations_total: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerRefund {
    pub id: String,
    pub payment_intent: String,
    pub idempotency_key: Option<String>,
    pub metadata: BTreeMap<String, String>,
    pub amount: i64,
    pub currency: String,
    pub status: String,
    pub created: i64,
}

/// One `/v1` request as the simulator saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestLogEntry {
    /// Increasing; gaps mean the ring dropped entries.
    pub seq: u64,
    pub request_id: String,
    pub method: String,
    pub path: String,
    /// The URL's query string as sent (list parameters such as `starting_after`); `None`
    /// when the URL had none.
    #[serde(default)]
    pub query: Option<String>,
    /// `None` for unknown routes.
    pub endpoint: Option<String>,
    pub idempotency_key: Option<String>,
    /// Answered from the idempotency store (the answer carried `Idempotent-Replayed: true`).
    pub replayed: bool,
    /// `None` when no response was sent: the connection was dropped (fault), or the client went
    /// away before the answer (the request still executed).
    pub status: Option<u16>,
    /// The fault applied, if any (`latency`, `fail_before_apply`, …).
    pub fault: Option<String>,
    /// Sim clock when the request arrived.
    pub sim_time: i64,
}

impl RequestLogEntry {
    /// One parameter of the query string, decoded (`None`: absent, or no query string).
    pub fn query_param(&self, name: &str) -> Option<String> {
        let pairs: Vec<(String, String)> =
            serde_urlencoded::from_str(self.query.as_deref()?).ok()?;
        pairs.into_iter().find(|(key, _)| key == name).map(|(_, value)| value)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuthenticationOutcome {
    Succeed,
    Fail,
}

/// A payment intent created directly, bypassing `/v1` and idempotency.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeedPaymentIntent {
    pub amount: i64,
    pub currency: String,
    /// A Stripe status name; `succeeded` gets a charge.
    pub status: String,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Sim clock; defaults to now.
    #[serde(default)]
    pub created: Option<i64>,
}

/// Overwrites fields of an existing intent (no event is sent).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForcePaymentIntent {
    #[serde(default)]
    pub amount: Option<i64>,
    #[serde(default)]
    pub status: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct AdvanceClock {
    pub seconds: u64,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Clock {
    pub now: i64,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Connections {
    pub accepted: u64,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct SetFault {
    pub target: FaultTarget,
    pub spec: FaultSpec,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct SetWebhookTarget {
    pub url: String,
    pub secret: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct SetWebhookMode {
    pub mode: WebhookMode,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Authenticate {
    pub outcome: AuthenticationOutcome,
}

fn ok_json(value: &impl Serialize) -> Reply {
    match serde_json::to_vec(value) {
        Ok(body) => Reply::json(StatusCode::OK, Bytes::from(body)),
        Err(error) => fail(StatusCode::INTERNAL_SERVER_ERROR, error.to_string()),
    }
}

fn fail(status: StatusCode, message: impl Into<String>) -> Reply {
    Reply::json(
        status,
        Bytes::from(json!({ "error": message.into() }).to_string()),
    )
}

// A `Reply` is the error path of every control route; boxing it buys nothing here.
#[allow(clippy::result_large_err)]
fn parse<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, Reply> {
    serde_json::from_slice(body)
        .map_err(|error| fail(StatusCode::BAD_REQUEST, format!("invalid body: {error}")))
}

/// Serves one `/_sim` request.
pub(super) async fn handle(app: &App, method: &Method, path: &str, body: &[u8]) -> Reply {
    match route(app, method, path, body).await {
        Ok(reply) | Err(reply) => reply,
    }
}

#[allow(clippy::result_large_err)]
async fn route(app: &App, method: &Method, path: &str, body: &[u8]) -> Result<Reply, Reply> {
    let segments: Vec<&str> = path.trim_start_matches("/_sim/").split('/').collect();
    let no_content = || Reply::json(StatusCode::OK, Bytes::from_static(b"{}"));
    let reply = match (method.as_str(), segments.as_slice()) {
        ("GET", ["clock"]) => ok_json(&Clock { now: app.now() }),
        ("GET", ["connections"]) => ok_json(&Connections { accepted: app.connections_accepted() }),
        ("POST", ["clock", "advance"]) => {
            let advance: AdvanceClock = parse(body)?;
            let now = app
                .clock
                .advance(advance.seconds)
                .map_err(|error| fail(StatusCode::BAD_REQUEST, error))?;
            app.state().catch_up(now);
            ok_json(&Clock { now })
        }
        ("GET", ["faults"]) => {
            let faults: Vec<SetFault> = app
                .state()
                .faults
                .list()
                .into_iter()
                .map(|(target, spec)| SetFault { target, spec })
                .collect();
            ok_json(&faults)
        }
        ("POST", ["faults"]) => {
            let fault: SetFault = parse(body)?;
            app.state()
                .faults
                .set(fault.target, fault.spec)
                .map_err(|error| fail(StatusCode::BAD_REQUEST, error))?;
            no_content()
        }
        ("DELETE", ["faults"]) => {
            app.state().faults.clear();
            no_content()
        }
        ("GET", ["ledger"]) => ok_json(&app.state().ledger()),
        ("GET", ["requests"]) => ok_json(&app.state().requests()),
        ("POST", ["webhooks", "target"]) => {
            let target: SetWebhookTarget = parse(body)?;
            app.webhooks.set_target(Some(WebhookTarget {
                url: target.url,
                secret: target.secret,
            }));
            no_content()
        }
        ("DELETE", ["webhooks", "target"]) => {
            app.webhooks.set_target(None);
            no_content()
        }
        ("POST", ["webhooks", "mode"]) => {
            let mode: SetWebhookMode = parse(body)?;
            app.webhooks.set_mode(mode.mode);
            no_content()
        }
        ("POST", ["webhooks", "flush"]) => ok_json(&app.webhooks.flush().await),
        ("GET", ["webhooks", "events"]) => ok_json(&app.webhooks.events()),
        ("GET", ["webhooks", "deliveries"]) => ok_json(&app.webhooks.deliveries()),
        ("POST", ["payment_intents"]) => {
            let seed: SeedPaymentIntent = parse(body)?;
            let now = app.now();
            let entry = app
                .state()
                .seed_payment_intent(seed, now)
                .map_err(|error| fail(StatusCode::BAD_REQUEST, error))?;
            ok_json(&entry)
        }
        ("POST", ["payment_intents", id, "force"]) => {
            let force: ForcePaymentIntent = parse(body)?;
            let now = app.now();
            app.state()
                .force_payment_intent(id, force, now)
                .map_err(|error| fail(StatusCode::BAD_REQUEST, error))?;
            no_content()
        }
        ("POST", ["payment_intents", id, "authenticate"]) => {
            let authenticate: Authenticate = parse(body)?;
            let now = app.now();
            let intent = app
                .state()
                .authenticate(id, authenticate.outcome, now)
                .map_err(|error| fail(StatusCode::BAD_REQUEST, error))?;
            ok_json(&intent)
        }
        // The `next_action.redirect_to_url.url` of a `requires_action` intent: opening it
        // completes authentication, as a customer would, then returns to `return_url`.
        ("GET", ["3ds", id]) => {
            let now = app.now();
            let mut state = app.state();
            state
                .authenticate(id, AuthenticationOutcome::Succeed, now)
                .map_err(|error| fail(StatusCode::BAD_REQUEST, error))?;
            match state.return_url(id) {
                Some(url) => Reply::redirect(&url),
                None => Reply::json(
                    StatusCode::OK,
                    Bytes::from(json!({ "authenticated": id }).to_string()),
                ),
            }
        }
        _ => fail(
            StatusCode::NOT_FOUND,
            format!("no control route {method} {path}"),
        ),
    };
    Ok(reply)
}

#[cfg(test)]
mod tests {
    use super::RequestLogEntry;

    #[test]
    fn a_query_parameter_is_read_decoded_from_the_logged_query_string() {
        let entry = |query: Option<&str>| RequestLogEntry { query: query.map(str::to_owned), ..Default::default() };
        let listed = entry(Some("created%5Bgte%5D=5&limit=100&starting_after=pi_a%2Bb"));
        assert_eq!(listed.query_param("starting_after").as_deref(), Some("pi_a+b"));
        assert_eq!(listed.query_param("created[gte]").as_deref(), Some("5"));
        assert_eq!(listed.query_param("ending_before"), None);
        assert_eq!(entry(None).query_param("limit"), None);
    }
}
