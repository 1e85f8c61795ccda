//! Pending attempts written straight through the store, as the charge path writes them: for
//! tests that need rows in a given state without going through a provider call.

use chargeguard::domain::{
    Attempt, AttemptId, AttemptStatus, ChargeParams, ConsumerName, Currency, Description, LeaseOwner,
    Metadata, OperationKey, PaymentMethodId, derive_idempotency_key,
};
use chargeguard::store::{AttemptStore, CallerTime, InsertOutcome, LeaseRequest, NewAttempt, RoundResult};
use chrono::Duration;
use uuid::Uuid;

/// A pending `orders` attempt for `operation`: 1000 usd minor units with `pm_card_visa`, a
/// description and one metadata entry (so that they round-trip through the store), held by
/// `lease_owner` for `lease` and due for recovery `due_in` after it is written (both on the
/// database's clock).
pub fn pending_attempt(
    operation: &str,
    lease_owner: LeaseOwner,
    lease: Duration,
    due_in: Duration,
    time: CallerTime,
) -> NewAttempt {
    let consumer = ConsumerName::parse("orders").unwrap();
    let operation_key = OperationKey::parse(operation).unwrap();
    let metadata_entries = [("order_id".to_owned(), operation.to_owned())];
    let params = ChargeParams::new(
        1_000,
        99_999_999,
        Currency::parse("usd").unwrap(),
        PaymentMethodId::parse("pm_card_visa").unwrap(),
        None,
        Some(Description::parse("test order").unwrap()),
        Metadata::parse(metadata_entries.iter().map(|(key, value)| (key, value))).unwrap(),
    )
    .unwrap();
    NewAttempt {
        id: AttemptId::from_uuid(Uuid::now_v7()),
        idempotency_key: derive_idempotency_key(&consumer, &operation_key, 0),
        consumer,
        operation_key,
        fingerprint: params.fingerprint(),
        params,
        provider: "stripe",
        generation: 0,
        return_url: None,
        lease_owner,
        lease_duration: lease,
        recovery_grace: due_in,
        time,
    }
}

/// The caller's time on the database's clock: now, no shift.
pub fn now() -> CallerTime {
    CallerTime { now: chrono::Utc::now(), shift: Duration::zero() }
}

/// A pending attempt for `operation` held by `holder` for 30 s, due for recovery a minute after
/// it is written.
pub fn new_attempt(operation: &str, holder: LeaseOwner) -> NewAttempt {
    pending_attempt(operation, holder, Duration::seconds(30), Duration::seconds(60), now())
}

/// Inserts `new`, which must be a new operation.
pub async fn insert_new(store: &dyn AttemptStore, new: &NewAttempt) -> Attempt {
    match store.insert_pending(new).await.unwrap() {
        InsertOutcome::Inserted(attempt) => attempt,
        InsertOutcome::Existing(existing) => {
            panic!("operation {} existed as {}", new.operation_key, existing.id)
        }
        refused => panic!("operation {} refused: {refused:?}", new.operation_key),
    }
}

/// How long before the provider forgets a key the leases of these tests stop sending it.
pub const SAFE_WINDOW_HOURS: i64 = 23;

/// A fresh holder: one call or one sweep pass.
pub fn owner() -> LeaseOwner {
    LeaseOwner::from_uuid(Uuid::new_v4())
}

/// A 30 s lease for `owner`, asked at `time`.
pub fn lease_request(owner: LeaseOwner, time: CallerTime) -> LeaseRequest {
    LeaseRequest {
        owner,
        duration: Duration::seconds(30),
        key_window_safe: Duration::hours(SAFE_WINDOW_HOURS),
        time,
    }
}

/// A round that found the row in `status`: one call, looked at again in a minute.
pub fn round(status: AttemptStatus) -> RoundResult {
    RoundResult::unchanged(status, 1, Duration::seconds(60), None)
}
