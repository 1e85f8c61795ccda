//! `/_sim` control routes (JSON in and out, no authentication: the simulator is a local tool)
//! and the types they exchange, shared with [`super::SimControl`].

use std::collections::BTreeMap;

use bytes::Bytes;
use http::{Method, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::WebhookTarget;
use super::faults::{FaultSpec, FaultTarget};
use super::model::{Confirmation, DisputeStatus, Origin};
use super::server::{App, Reply};
use crate::report::render::html::escape;
use super::webhooks::WebhookMode;

/// Everything really created or refunded at the provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ledger {
    /// In creation order.
    pub payment_intents: Vec<LedgerPaymentIntent>,
    /// In creation order, whatever their status (failed ones returned nothing).
    pub refunds: Vec<LedgerRefund>,
    /// In creation order.
    #[serde(default)]
    pub disputes: Vec<LedgerDispute>,
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

    /// The refunds of one intent, oldest first.
    pub fn refunds_of<'a>(&'a self, payment_intent: &'a str) -> impl Iterator<Item = &'a LedgerRefund> {
        self.refunds
            .iter()
            .filter(move |refund| refund.payment_intent == payment_intent)
    }

    /// Money really returned on one intent: the sum of its `succeeded` refunds (pending ones
    /// may still fail, failed ones returned nothing).
    pub fn refunded_minor(&self, payment_intent: &str) -> i64 {
        self.refunds_of(payment_intent)
            .filter(|refund| refund.status == "succeeded")
            .map(|refund| refund.amount)
            .sum()
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
    /// `pending`, `succeeded` or `failed`.
    pub status: String,
    /// Why a failed refund failed (`expired_or_canceled_card`, ...).
    #[serde(default)]
    pub failure_reason: Option<String>,
    /// The reason the request gave (`duplicate`, `fraudulent`, `requested_by_customer`).
    #[serde(default)]
    pub reason: Option<String>,
    pub created: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerDispute {
    pub id: String,
    pub payment_intent: String,
    pub charge: String,
    pub amount: i64,
    pub currency: String,
    /// `needs_response`, `won` or `lost`.
    pub status: String,
    pub reason: String,
    pub created: i64,
}

/// The status refunds created from now on start in (`POST /_sim/refunds/mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefundMode {
    /// As for cards: a refund succeeds at once.
    #[default]
    Succeeded,
    /// As for some payment methods: `pending` until `/_sim/refunds/{id}/settle` or `/fail`.
    Pending,
}

/// Fails a pending or succeeded refund (`POST /_sim/refunds/{id}/fail`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailRefund {
    /// Defaults to `expired_or_canceled_card`.
    #[serde(default)]
    pub failure_reason: Option<String>,
}

/// Opens a dispute on a succeeded intent's charge (`POST /_sim/payment_intents/{id}/dispute`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenDispute {
    /// Defaults to the amount charged.
    #[serde(default)]
    pub amount: Option<i64>,
    /// One of Stripe's dispute reasons; defaults to `general`.
    #[serde(default)]
    pub reason: Option<String>,
}

/// Closes a dispute (`POST /_sim/disputes/{id}/close`), `won` or `lost`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloseDispute {
    pub status: DisputeStatus,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct SetRefundMode {
    pub mode: RefundMode,
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
    // An empty body is an empty object: controls whose fields all have defaults need none.
    let body = if body.iter().all(u8::is_ascii_whitespace) { b"{}".as_slice() } else { body };
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
        ("GET", ["faults", "fired"]) => ok_json(app.state().faults.fired()),
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
        ("POST", ["refunds", "mode"]) => {
            let mode: SetRefundMode = parse(body)?;
            app.state().set_refund_mode(mode.mode);
            no_content()
        }
        ("POST", ["refunds", id, "fail"]) => {
            let fail_refund: FailRefund = parse(body)?;
            let now = app.now();
            let refund = app
                .state()
                .fail_refund(id, fail_refund, now)
                .map_err(|error| fail(StatusCode::BAD_REQUEST, error))?;
            ok_json(&refund)
        }
        ("POST", ["refunds", id, "settle"]) => {
            let now = app.now();
            let refund = app
                .state()
                .settle_refund(id, now)
                .map_err(|error| fail(StatusCode::BAD_REQUEST, error))?;
            ok_json(&refund)
        }
        ("POST", ["payment_intents", id, "dispute"]) => {
            let open: OpenDispute = parse(body)?;
            let now = app.now();
            let dispute = app
                .state()
                .open_dispute(id, open, now)
                .map_err(|error| fail(StatusCode::BAD_REQUEST, error))?;
            ok_json(&dispute)
        }
        ("POST", ["disputes", id, "close"]) => {
            let close: CloseDispute = parse(body)?;
            let now = app.now();
            let dispute = app
                .state()
                .close_dispute(id, close, now)
                .map_err(|error| fail(StatusCode::BAD_REQUEST, error))?;
            ok_json(&dispute)
        }
        // The `next_action.redirect_to_url.url` of a `requires_action` intent: a page with
        // "Complete" and "Fail" buttons, as a bank's challenge shows the customer. Opening it
        // changes nothing (a GET a link preview or crawler may send); the buttons POST.
        ("GET", ["3ds", id]) => {
            let waiting = app.state().awaiting_authentication(id);
            challenge_page(id, waiting)
        }
        // A button of that page (`outcome=succeed` or `fail`, a form): authenticates, then
        // returns to `return_url` as Stripe does, or says what happened.
        ("POST", ["3ds", id]) => {
            let form: ChallengeForm = serde_urlencoded::from_bytes(body)
                .map_err(|error| fail(StatusCode::BAD_REQUEST, format!("invalid form: {error}")))?;
            let now = app.now();
            let mut state = app.state();
            state
                .authenticate(id, form.outcome, now)
                .map_err(|error| fail(StatusCode::BAD_REQUEST, error))?;
            match state.return_url(id) {
                Some(url) => Reply::redirect(&url),
                None => {
                    let done = match form.outcome {
                        AuthenticationOutcome::Succeed => "completed",
                        AuthenticationOutcome::Fail => "failed",
                    };
                    Reply::html(StatusCode::OK, page(&format!("Authentication {done}"), &format!(
                        "<p id=\"result\">Payment {} authentication {done}. You can close this page.</p>",
                        escape(id)
                    )))
                }
            }
        }
        _ => fail(
            StatusCode::NOT_FOUND,
            format!("no control route {method} {path}"),
        ),
    };
    Ok(reply)
}

#[derive(Deserialize)]
struct ChallengeForm {
    outcome: AuthenticationOutcome,
}

/// The 3-D Secure challenge of `id`: two POST forms, or why there is nothing to authenticate.
fn challenge_page(id: &str, waiting: Option<(i64, String)>) -> Reply {
    let Some((amount, currency)) = waiting else {
        return Reply::html(
            StatusCode::NOT_FOUND,
            page("Nothing to authenticate", &format!("<p id=\"result\">Payment {} is not waiting for authentication.</p>", escape(id))),
        );
    };
    let action = format!("/_sim/3ds/{}", escape(id));
    let button = |outcome: &str, label: &str| {
        format!(
            "<form method=\"post\" action=\"{action}\"><input type=\"hidden\" name=\"outcome\" value=\"{outcome}\">\
             <button type=\"submit\" id=\"{outcome}\">{label}</button></form>"
        )
    };
    let body = format!(
        "<p>Payment {} of {} asks for 3-D Secure authentication (simulated: no bank is involved).</p>{}{}",
        escape(id),
        escape(&crate::report::money(&currency, amount)),
        button("succeed", "Complete"),
        button("fail", "Fail")
    );
    Reply::html(StatusCode::OK, page("3-D Secure (simulator)", &body))
}

fn page(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{0}</title></head>\
         <body><h1>{0}</h1>{body}</body></html>\n",
        escape(title)
    )
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
