//! Reads the few fields chargeguard needs from a Stripe event's raw JSON. Deliberately not
//! async-stripe's event types: those are pinned to one API version, and an event of another
//! version must still be stored and applied.

use std::collections::BTreeMap;

use chrono::{DateTime, TimeZone, Utc};
use serde::Deserialize;

use crate::domain::{
    AttemptId, Failure, NextAction, PaymentSnapshot, ProviderPaymentStatus, RefundSnapshot,
};
use crate::provider::METADATA_ATTEMPT_ID;

/// Bound on ids and type names we store (Stripe's are well under 100 characters).
pub const EVENT_FIELD_LENGTH_MAX: usize = 255;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    #[error("not a Stripe event: {0}")]
    NotAnEvent(String),
    #[error("event field {0} is missing or too long")]
    BadField(&'static str),
    #[error("payment intent unreadable: {0}")]
    BadObject(String),
}

/// What the endpoint stores alongside the raw body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    pub id: String,
    pub event_type: String,
    pub created: DateTime<Utc>,
    pub object_id: Option<String>,
}

#[derive(Deserialize)]
struct RawEnvelope {
    id: String,
    #[serde(rename = "type")]
    event_type: String,
    created: i64,
    data: RawData,
}

#[derive(Deserialize)]
struct RawData {
    object: serde_json::Value,
}

pub fn parse_envelope(body: &[u8]) -> Result<Envelope, EventError> {
    let raw: RawEnvelope =
        serde_json::from_slice(body).map_err(|error| EventError::NotAnEvent(error.to_string()))?;
    let bounded = |value: &str| !value.is_empty() && value.len() <= EVENT_FIELD_LENGTH_MAX;
    if !bounded(&raw.id) {
        return Err(EventError::BadField("id"));
    }
    if !bounded(&raw.event_type) {
        return Err(EventError::BadField("type"));
    }
    let object_id = match raw.data.object.get("id") {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(id)) if bounded(id) => Some(id.clone()),
        Some(_) => return Err(EventError::BadField("data.object.id")),
    };
    Ok(Envelope {
        id: raw.id,
        event_type: raw.event_type,
        created: timestamp(raw.created),
        object_id,
    })
}

/// The event's object, as far as chargeguard acts on it.
#[derive(Debug, Clone, PartialEq)]
pub enum Subject {
    /// A `payment_intent.*` event: the intent as the provider holds it, and the attempt id its
    /// metadata names (if any, and well-formed).
    Payment {
        snapshot: Box<PaymentSnapshot>,
        attempt_id: Option<AttemptId>,
    },
    /// A refund object (`refund.created`, `refund.updated`, `refund.failed`,
    /// `charge.refund.updated`): the refund as the provider holds it, and the refund attempt its
    /// metadata names.
    Refund(Box<RefundSubject>),
    /// `charge.refunded`: the charge's refunds when the payload lists them (older API versions
    /// and expanded payloads do; current ones carry only the charge's `amount_refunded`).
    ChargeRefunded {
        charge_id: String,
        payment_intent: Option<String>,
        amount_refunded_minor: i64,
        refunds: Vec<RefundSubject>,
    },
    /// `charge.dispute.*`: a dispute on a charge.
    Dispute(Box<DisputeFacts>),
    /// Anything else: no attempt record exists for these.
    Untracked,
}

/// A refund as an event carries it, with the attempt id its metadata names (if well-formed).
#[derive(Debug, Clone, PartialEq)]
pub struct RefundSubject {
    pub snapshot: RefundSnapshot,
    pub attempt_id: Option<AttemptId>,
}

/// The fields of a dispute a person needs to find it and judge it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DisputeFacts {
    pub id: String,
    pub charge: Option<String>,
    pub payment_intent: Option<String>,
    pub amount_minor: i64,
    pub currency: String,
    /// Stripe's reason (`fraudulent`, `product_not_received`, ...).
    pub reason: String,
    /// `needs_response`, `won`, `lost`, ...
    pub status: String,
}

#[derive(Deserialize)]
struct RawPaymentIntent {
    id: String,
    object: String,
    status: String,
    amount: i64,
    #[serde(default)]
    amount_received: i64,
    currency: String,
    created: i64,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
    #[serde(default)]
    last_payment_error: Option<RawPaymentError>,
    #[serde(default)]
    next_action: Option<RawNextAction>,
}

#[derive(Deserialize)]
struct RawPaymentError {
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    decline_code: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

#[derive(Deserialize)]
struct RawNextAction {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    redirect_to_url: Option<RawRedirect>,
}

#[derive(Deserialize)]
struct RawRedirect {
    #[serde(default)]
    url: Option<String>,
}

/// Reads the subject of a stored event. Field for field the same snapshot the provider module
/// builds from an API answer, so `domain::resolve_snapshot` treats both alike.
pub fn parse_subject(event_type: &str, payload: &str) -> Result<Subject, EventError> {
    let kind = SubjectKind::of(event_type);
    if kind == SubjectKind::Untracked {
        return Ok(Subject::Untracked);
    }
    let raw: RawEnvelope =
        serde_json::from_str(payload).map_err(|error| EventError::NotAnEvent(error.to_string()))?;
    match kind {
        SubjectKind::Payment => parse_payment(raw.data.object),
        SubjectKind::Refund => Ok(Subject::Refund(Box::new(parse_refund(raw.data.object)?))),
        SubjectKind::ChargeRefunded => parse_charge_refunded(raw.data.object),
        SubjectKind::Dispute => Ok(Subject::Dispute(Box::new(parse_dispute(raw.data.object)?))),
        SubjectKind::Untracked => Ok(Subject::Untracked),
    }
}

/// Which object an event type carries, for the types chargeguard acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SubjectKind {
    Payment,
    Refund,
    ChargeRefunded,
    Dispute,
    Untracked,
}

/// The dispute events read (`charge.dispute.*`); `chargeguard_disputes_total` is labelled by
/// these, each exported from the start.
pub const DISPUTE_EVENT_TYPES: [&str; 3] = ["charge.dispute.created", "charge.dispute.updated", "charge.dispute.closed"];

impl SubjectKind {
    fn of(event_type: &str) -> Self {
        if event_type.starts_with("payment_intent.") {
            return Self::Payment;
        }
        match event_type {
            "refund.created" | "refund.updated" | "refund.failed" | "charge.refund.updated" => {
                Self::Refund
            }
            "charge.refunded" => Self::ChargeRefunded,
            dispute if DISPUTE_EVENT_TYPES.contains(&dispute) => Self::Dispute,
            _ => Self::Untracked,
        }
    }
}

fn attempt_id_in(metadata: &BTreeMap<String, String>) -> Option<AttemptId> {
    metadata
        .get(METADATA_ATTEMPT_ID)
        .and_then(|id| uuid::Uuid::parse_str(id).ok())
        .map(AttemptId::from_uuid)
}

#[derive(Deserialize)]
struct RawRefund {
    id: String,
    object: String,
    status: String,
    amount: i64,
    currency: String,
    created: i64,
    #[serde(default)]
    payment_intent: Option<String>,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
    #[serde(default)]
    failure_reason: Option<String>,
}

fn parse_refund(object: serde_json::Value) -> Result<RefundSubject, EventError> {
    let refund: RawRefund =
        serde_json::from_value(object).map_err(|error| EventError::BadObject(error.to_string()))?;
    if refund.object != "refund" {
        return Err(EventError::BadObject(format!("object is {:?}", refund.object)));
    }
    if refund.id.is_empty() || refund.id.len() > EVENT_FIELD_LENGTH_MAX {
        return Err(EventError::BadField("data.object.id"));
    }
    Ok(RefundSubject {
        attempt_id: attempt_id_in(&refund.metadata),
        snapshot: RefundSnapshot {
            id: refund.id,
            payment_id: refund.payment_intent,
            status: refund.status,
            amount_minor: refund.amount,
            currency: refund.currency,
            created: timestamp(refund.created),
            metadata: refund.metadata,
            failure_reason: refund.failure_reason,
        },
    })
}

/// Bound on the refunds read from one `charge.refunded` payload (Stripe embeds at most 10).
pub const CHARGE_REFUNDS_LISTED_MAX: usize = 100;

#[derive(Deserialize)]
struct RawCharge {
    id: String,
    object: String,
    #[serde(default)]
    payment_intent: Option<String>,
    #[serde(default)]
    amount_refunded: i64,
    #[serde(default)]
    refunds: Option<RawRefundList>,
}

#[derive(Deserialize)]
struct RawRefundList {
    #[serde(default)]
    data: Vec<serde_json::Value>,
}

fn parse_charge_refunded(object: serde_json::Value) -> Result<Subject, EventError> {
    let charge: RawCharge =
        serde_json::from_value(object).map_err(|error| EventError::BadObject(error.to_string()))?;
    if charge.object != "charge" {
        return Err(EventError::BadObject(format!("object is {:?}", charge.object)));
    }
    let listed = charge.refunds.map(|list| list.data).unwrap_or_default();
    if listed.len() > CHARGE_REFUNDS_LISTED_MAX {
        return Err(EventError::BadField("data.object.refunds.data"));
    }
    let refunds = listed
        .into_iter()
        .map(parse_refund)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Subject::ChargeRefunded {
        charge_id: charge.id,
        payment_intent: charge.payment_intent,
        amount_refunded_minor: charge.amount_refunded,
        refunds,
    })
}

#[derive(Deserialize)]
struct RawDispute {
    id: String,
    object: String,
    #[serde(default)]
    charge: Option<String>,
    #[serde(default)]
    payment_intent: Option<String>,
    amount: i64,
    currency: String,
    #[serde(default)]
    reason: Option<String>,
    status: String,
}

fn parse_dispute(object: serde_json::Value) -> Result<DisputeFacts, EventError> {
    let dispute: RawDispute =
        serde_json::from_value(object).map_err(|error| EventError::BadObject(error.to_string()))?;
    if dispute.object != "dispute" {
        return Err(EventError::BadObject(format!("object is {:?}", dispute.object)));
    }
    Ok(DisputeFacts {
        id: dispute.id,
        charge: dispute.charge,
        payment_intent: dispute.payment_intent,
        amount_minor: dispute.amount,
        currency: dispute.currency,
        reason: dispute.reason.unwrap_or_else(|| "unknown".to_owned()),
        status: dispute.status,
    })
}

fn parse_payment(object: serde_json::Value) -> Result<Subject, EventError> {
    let intent: RawPaymentIntent = serde_json::from_value(object)
        .map_err(|error| EventError::BadObject(error.to_string()))?;
    if intent.object != "payment_intent" {
        return Err(EventError::BadObject(format!(
            "object is {:?}",
            intent.object
        )));
    }
    let attempt_id = attempt_id_in(&intent.metadata);
    let snapshot = PaymentSnapshot {
        id: intent.id,
        status: ProviderPaymentStatus::parse(&intent.status),
        amount_minor: intent.amount,
        amount_received_minor: intent.amount_received,
        currency: intent.currency,
        created: timestamp(intent.created),
        metadata: intent.metadata,
        // As the provider module reads it.
        last_error: intent.last_payment_error.map(|error| {
            Failure::from_provider_error(
                error.code.as_deref(),
                error.decline_code.as_deref(),
                error.message.as_deref(),
                "payment_failed",
            )
        }),
        next_action: intent.next_action.map(|action| NextAction {
            kind: action.kind,
            redirect_url: action.redirect_to_url.and_then(|redirect| redirect.url),
        }),
    };
    Ok(Subject::Payment {
        snapshot: Box::new(snapshot),
        attempt_id,
    })
}

fn timestamp(seconds: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(seconds, 0)
        .single()
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(event_type: &str, object: serde_json::Value) -> String {
        serde_json::json!({
            "id": "evt_1", "object": "event", "type": event_type, "created": 1_700_000_000,
            "api_version": "2099-01-01.future", "data": {"object": object}, "livemode": false,
        })
        .to_string()
    }

    fn intent(status: &str) -> serde_json::Value {
        serde_json::json!({
            "id": "pi_1", "object": "payment_intent", "status": status, "amount": 1000,
            "amount_received": 1000, "currency": "usd", "created": 1_700_000_000,
            "metadata": {"chargeguard_attempt_id": "0190a2b4-0000-7000-8000-000000000001"},
            "last_payment_error": null, "next_action": null, "some_new_field": {"x": 1},
        })
    }

    #[test]
    fn envelope_of_any_api_version() {
        let envelope =
            parse_envelope(event("payment_intent.succeeded", intent("succeeded")).as_bytes())
                .unwrap();
        assert_eq!(envelope.id, "evt_1");
        assert_eq!(envelope.event_type, "payment_intent.succeeded");
        assert_eq!(envelope.object_id.as_deref(), Some("pi_1"));
        assert_eq!(envelope.created.timestamp(), 1_700_000_000);
    }

    #[test]
    fn envelope_rejects_what_cannot_be_keyed() {
        assert!(parse_envelope(b"not json").is_err());
        assert!(
            parse_envelope(br#"{"id":"","type":"x","created":1,"data":{"object":{}}}"#).is_err()
        );
        let long = format!(
            r#"{{"id":"{}","type":"x","created":1,"data":{{"object":{{}}}}}}"#,
            "e".repeat(256)
        );
        assert_eq!(
            parse_envelope(long.as_bytes()),
            Err(EventError::BadField("id"))
        );
        let objectless =
            parse_envelope(br#"{"id":"evt_2","type":"x","created":1,"data":{"object":{}}}"#)
                .unwrap();
        assert_eq!(objectless.object_id, None);
    }

    #[test]
    fn payment_intent_becomes_a_snapshot_with_its_attempt() {
        let Subject::Payment {
            snapshot,
            attempt_id,
        } = parse_subject(
            "payment_intent.succeeded",
            &event("payment_intent.succeeded", intent("succeeded")),
        )
        .unwrap()
        else {
            panic!("a payment subject")
        };
        assert_eq!(snapshot.id, "pi_1");
        assert_eq!(snapshot.status, ProviderPaymentStatus::Succeeded);
        assert_eq!(snapshot.amount_minor, 1000);
        assert_eq!(
            attempt_id.unwrap().to_string(),
            "0190a2b4-0000-7000-8000-000000000001"
        );
    }

    #[test]
    fn decline_and_action_fields_are_read_like_the_provider_reads_them() {
        let mut failed = intent("requires_payment_method");
        failed["last_payment_error"] = serde_json::json!({"code": "card_declined", "decline_code": "insufficient_funds", "message": "no"});
        let Subject::Payment { snapshot, .. } = parse_subject(
            "payment_intent.payment_failed",
            &event("payment_intent.payment_failed", failed),
        )
        .unwrap() else {
            panic!()
        };
        assert_eq!(
            snapshot.last_error,
            Some(Failure {
                code: "card_declined".into(),
                message: "no (decline_code: insufficient_funds)".into()
            })
        );

        let mut action = intent("requires_action");
        action["next_action"] = serde_json::json!({"type": "redirect_to_url", "redirect_to_url": {"url": "https://x/3ds"}});
        let Subject::Payment { snapshot, .. } = parse_subject(
            "payment_intent.requires_action",
            &event("payment_intent.requires_action", action),
        )
        .unwrap() else {
            panic!()
        };
        assert_eq!(
            snapshot.next_action,
            Some(NextAction {
                kind: "redirect_to_url".into(),
                redirect_url: Some("https://x/3ds".into())
            })
        );
    }

    fn refund(status: &str) -> serde_json::Value {
        serde_json::json!({
            "id": "re_1", "object": "refund", "status": status, "amount": 400,
            "currency": "usd", "created": 1_700_000_100, "payment_intent": "pi_1",
            "charge": "ch_1", "failure_reason": null, "new_field": true,
            "metadata": {"chargeguard_attempt_id": "0190a2b4-0000-7000-8000-000000000002"},
        })
    }

    #[test]
    fn refund_events_carry_the_refund_and_its_attempt() {
        for event_type in ["refund.created", "refund.updated", "refund.failed", "charge.refund.updated"] {
            let mut failed = refund("failed");
            failed["failure_reason"] = "expired_or_canceled_card".into();
            let Subject::Refund(subject) = parse_subject(event_type, &event(event_type, failed)).unwrap() else {
                panic!("{event_type}: a refund subject")
            };
            assert_eq!(subject.snapshot.id, "re_1");
            assert_eq!(subject.snapshot.payment_id.as_deref(), Some("pi_1"));
            assert_eq!(subject.snapshot.amount_minor, 400);
            assert_eq!(subject.snapshot.status, "failed");
            assert_eq!(subject.snapshot.failure_reason.as_deref(), Some("expired_or_canceled_card"));
            assert_eq!(
                subject.attempt_id.unwrap().to_string(),
                "0190a2b4-0000-7000-8000-000000000002"
            );
        }
        let broken = serde_json::json!({"id": "re_1", "object": "refund"});
        assert!(matches!(
            parse_subject("refund.updated", &event("refund.updated", broken)),
            Err(EventError::BadObject(_))
        ));
        assert!(matches!(
            parse_subject("refund.updated", &event("refund.updated", intent("succeeded"))),
            Err(EventError::BadObject(_))
        ));
    }

    #[test]
    fn charge_refunded_walks_its_refunds_list_when_it_has_one() {
        let bare = serde_json::json!({"id": "ch_1", "object": "charge", "payment_intent": "pi_1", "amount_refunded": 400});
        assert_eq!(
            parse_subject("charge.refunded", &event("charge.refunded", bare.clone())).unwrap(),
            Subject::ChargeRefunded {
                charge_id: "ch_1".into(),
                payment_intent: Some("pi_1".into()),
                amount_refunded_minor: 400,
                refunds: vec![],
            }
        );
        let mut listed = bare;
        listed["refunds"] = serde_json::json!({"object": "list", "data": [refund("succeeded"), refund("pending")]});
        let Subject::ChargeRefunded { refunds, .. } =
            parse_subject("charge.refunded", &event("charge.refunded", listed)).unwrap()
        else {
            panic!("a charge")
        };
        let statuses: Vec<&str> = refunds.iter().map(|r| r.snapshot.status.as_str()).collect();
        assert_eq!(statuses, ["succeeded", "pending"]);
    }

    #[test]
    fn disputes_are_read_and_other_charge_events_are_untracked() {
        let dispute = serde_json::json!({
            "id": "dp_1", "object": "dispute", "amount": 1000, "currency": "usd",
            "charge": "ch_1", "payment_intent": "pi_1", "reason": "fraudulent", "status": "needs_response",
        });
        let Subject::Dispute(facts) =
            parse_subject("charge.dispute.created", &event("charge.dispute.created", dispute)).unwrap()
        else {
            panic!("a dispute")
        };
        assert_eq!(
            *facts,
            DisputeFacts {
                id: "dp_1".into(),
                charge: Some("ch_1".into()),
                payment_intent: Some("pi_1".into()),
                amount_minor: 1000,
                currency: "usd".into(),
                reason: "fraudulent".into(),
                status: "needs_response".into(),
            }
        );
        let charge = serde_json::json!({"id": "ch_1", "object": "charge"});
        assert_eq!(
            parse_subject("charge.succeeded", &event("charge.succeeded", charge)).unwrap(),
            Subject::Untracked
        );
    }

    #[test]
    fn an_unreadable_payment_intent_is_an_error() {
        let broken = serde_json::json!({"id": "pi_1", "object": "payment_intent"});
        assert!(matches!(
            parse_subject(
                "payment_intent.succeeded",
                &event("payment_intent.succeeded", broken)
            ),
            Err(EventError::BadObject(_))
        ));
    }
}
