//! Reads the few fields chargeguard needs from a Stripe event's raw JSON. Deliberately not
//! async-stripe's event types: those are pinned to one API version, and an event of another
//! version must still be stored and applied.

use std::collections::BTreeMap;

use chrono::{DateTime, TimeZone, Utc};
use serde::Deserialize;

use crate::domain::{AttemptId, Failure, NextAction, PaymentSnapshot, ProviderPaymentStatus};
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
    /// Anything else (refunds, charges, …): no attempt record exists for these yet.
    Untracked,
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
    if !event_type.starts_with("payment_intent.") {
        return Ok(Subject::Untracked);
    }
    let raw: RawEnvelope =
        serde_json::from_str(payload).map_err(|error| EventError::NotAnEvent(error.to_string()))?;
    let intent: RawPaymentIntent = serde_json::from_value(raw.data.object)
        .map_err(|error| EventError::BadObject(error.to_string()))?;
    if intent.object != "payment_intent" {
        return Err(EventError::BadObject(format!(
            "object is {:?}",
            intent.object
        )));
    }
    let attempt_id = intent
        .metadata
        .get(METADATA_ATTEMPT_ID)
        .and_then(|id| uuid::Uuid::parse_str(id).ok())
        .map(AttemptId::from_uuid);
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

    #[test]
    fn refunds_and_charges_are_untracked() {
        let charge = serde_json::json!({"id": "ch_1", "object": "charge"});
        assert_eq!(
            parse_subject("charge.refunded", &event("charge.refunded", charge)).unwrap(),
            Subject::Untracked
        );
        let refund = serde_json::json!({"id": "re_1", "object": "refund"});
        assert_eq!(
            parse_subject("refund.updated", &event("refund.updated", refund)).unwrap(),
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
