//! Values for unit tests across the crate: one pending attempt and one provider object, so that
//! a test changes only the fields it is about.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{
    Attempt, AttemptId, AttemptKind, AttemptStatus, ChargeParams, ConsumerName, Currency,
    Fingerprint, IdempotencyKey, Metadata, OperationKey, PaymentMethodId, PaymentSnapshot,
    ProviderPaymentStatus,
};

/// A pending charge of 1000 usd minor units for `order-1` of `orders`, every instant `at`.
pub fn pending_attempt(at: DateTime<Utc>) -> Attempt {
    Attempt {
        id: AttemptId::from_uuid(Uuid::nil()),
        consumer: ConsumerName::parse("orders").unwrap(),
        operation_key: OperationKey::parse("order-1").unwrap(),
        kind: AttemptKind::Charge,
        params: ChargeParams {
            amount_minor: 1_000,
            currency: Currency::parse("usd").unwrap(),
            payment_method: PaymentMethodId::parse("pm_card_visa").unwrap(),
            customer: None,
            description: None,
            metadata: Metadata::from_stored(BTreeMap::new()),
        },
        fingerprint: Fingerprint::from_stored("f".into()),
        status: AttemptStatus::Pending,
        provider: "stripe".into(),
        provider_payment_id: None,
        provider_status: None,
        idempotency_key: IdempotencyKey::from_stored("k".into()),
        generation: 0,
        failure: None,
        next_action: None,
        review_reason: None,
        review_history: None,
        parent_attempt_id: None,
        refund_reason: None,
        confirms_payment_id: None,
        failed_after_success_at: None,
        provider_calls: 0,
        key_window_started_at: at,
        create_sent_until: Some(at),
        create_replays_failure: false,
        lookup_progress: super::ListProgress::NotStarted,
        return_url: None,
        action_started_at: None,
        lease: None,
        check_count: 0,
        next_check_at: at,
        last_error: None,
        created_at: at,
        updated_at: at,
    }
}

/// A provider object for 1000 usd minor units.
pub fn snapshot(id: &str, status: ProviderPaymentStatus, created: DateTime<Utc>) -> PaymentSnapshot {
    PaymentSnapshot {
        id: id.into(),
        status,
        amount_minor: 1_000,
        amount_received_minor: 0,
        currency: "usd".into(),
        created,
        metadata: BTreeMap::new(),
        last_error: None,
        next_action: None,
    }
}
