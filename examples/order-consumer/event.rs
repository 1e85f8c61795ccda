//! The "order placed" event and the charge it asks for. Pure: no broker, no database.

use serde::{Deserialize, Serialize};

/// Longest order id accepted; the operation key derived from it stays far below chargeguard's
/// 200-character limit.
pub const ORDER_ID_LENGTH_MAX: usize = 64;

/// What the order service publishes when an order is placed. The broker may deliver it more
/// than once, and the publisher may publish it more than once: nothing here names a delivery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderPlaced {
    pub order_id: String,
    pub amount_minor: i64,
    pub currency: String,
    pub payment_method: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub customer: Option<String>,
    /// When the order was placed (Unix milliseconds): the start of the order's time to its answer.
    pub placed_at_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadEvent {
    #[error("the message is not an order-placed event: {0}")]
    NotJson(String),
    #[error("order_id must be 1-{ORDER_ID_LENGTH_MAX} characters of [A-Za-z0-9_-]")]
    OrderId,
}

impl OrderPlaced {
    /// Parses a message body. Only the order id is checked here; chargeguard checks the charge's
    /// fields and answers a bad one with INVALID_ARGUMENT, which is dead-lettered.
    pub fn parse(body: &[u8]) -> Result<Self, BadEvent> {
        let event: Self = serde_json::from_slice(body).map_err(|error| BadEvent::NotJson(error.to_string()))?;
        let valid = !event.order_id.is_empty()
            && event.order_id.len() <= ORDER_ID_LENGTH_MAX
            && event.order_id.bytes().all(|byte| byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-');
        if !valid {
            return Err(BadEvent::OrderId);
        }
        Ok(event)
    }

    /// The business operation: charging this order. Derived from the order id alone, so every
    /// delivery and every re-publication of the event names the same charge. A broker's message
    /// id would not do: a re-published event gets a new one, and a redelivery may too.
    pub fn operation_key(&self) -> String {
        operation_key(&self.order_id)
    }

    pub fn charge_request(&self) -> chargeguard_client::ChargeRequest {
        chargeguard_client::ChargeRequest {
            operation_key: self.operation_key(),
            amount_minor: self.amount_minor,
            currency: self.currency.clone(),
            payment_method: self.payment_method.clone(),
            customer: self.customer.clone(),
            description: Some(format!("order {}", self.order_id)),
            metadata: [("order_id".to_owned(), self.order_id.clone())].into(),
            attempt: None,
        }
    }
}

pub fn operation_key(order_id: &str) -> String {
    format!("order-{order_id}:charge")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(order_id: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "order_id": order_id, "amount_minor": 1999, "currency": "usd",
            "payment_method": "pm_card_visa", "placed_at_ms": 1
        }))
        .unwrap()
    }

    #[test]
    fn the_operation_key_comes_from_the_order_not_the_delivery() {
        let first = OrderPlaced::parse(&body("o-17")).unwrap();
        let again = OrderPlaced::parse(&body("o-17")).unwrap();
        assert_eq!(first.operation_key(), "order-o-17:charge");
        assert_eq!(first.charge_request(), again.charge_request());
    }

    #[test]
    fn a_bad_order_id_or_a_body_that_is_not_an_event_is_refused() {
        assert_eq!(OrderPlaced::parse(&body("")), Err(BadEvent::OrderId));
        assert_eq!(OrderPlaced::parse(&body("o 17")), Err(BadEvent::OrderId));
        assert_eq!(OrderPlaced::parse(&body(&"o".repeat(ORDER_ID_LENGTH_MAX + 1))), Err(BadEvent::OrderId));
        assert!(matches!(OrderPlaced::parse(b"{}"), Err(BadEvent::NotJson(_))));
        assert!(matches!(OrderPlaced::parse(b"\xff"), Err(BadEvent::NotJson(_))));
    }
}
