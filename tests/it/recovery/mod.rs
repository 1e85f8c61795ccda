//! Recovery (issue 4): the sweep, the provider's 24-hour key window, crash points. Every check
//! of money is made at the provider, through the simulator's ledger and request log.

pub(crate) mod child;
mod concurrency;
mod crash;
mod key_window;
mod killed_batch;
mod lookup;
mod outage;
mod refund_window;
mod replayed;
mod skew;
mod skewed_batch;

use std::time::Duration;

use chargeguard::domain::{Attempt, AttemptStatus, ConsumerName, LeaseOwner, OperationKey};
use chargeguard::store::CallerTime;
use chrono::Duration as ChronoDuration;
use chargeguard::grpc::proto::{self, GetAttemptRequest, get_attempt_request::Selector};
use chargeguard::orchestrator::SweepOutcome;
use chargeguard::simulator::{Endpoint, FaultKind, FaultSpec};
use chargeguard::grpc::proto::ChargeResponse;
use futures::StreamExt;
use tonic::Status;
use uuid::Uuid;

use crate::support::attempts::{insert_new, pending_attempt};
use crate::support::{ORDERS_TOKEN, TestApp, authed, charge_request, error_code};

/// Passes a test may need to drain what is due; more means rows are being claimed again.
const SWEEP_PASSES_MAX: usize = 50;

pub fn orders() -> ConsumerName {
    ConsumerName::parse("orders").unwrap()
}

/// The row of one of the `orders` consumer's operations, read from the store.
pub async fn stored(app: &TestApp, operation: &str) -> Attempt {
    let operation_key = OperationKey::parse(operation).unwrap();
    app.orchestrator
        .store()
        .find_by_operation(&orders(), &operation_key)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no attempt for {operation}"))
}

/// The attempt as a caller sees it through `GetAttempt`.
pub async fn shown(app: &TestApp, operation: &str) -> proto::Attempt {
    let selector = Some(Selector::OperationKey(operation.to_owned()));
    let mut client = app.client().await;
    let reply =
        client.get_attempt(authed(ORDERS_TOKEN, GetAttemptRequest { selector })).await.unwrap();
    reply.into_inner().attempt.unwrap()
}

/// Moves the service's clock and the simulator's together (whole seconds), and the database's
/// where it lives in a cluster with a fake clock.
pub async fn advance(app: &TestApp, by: Duration) -> i64 {
    if let Some(cluster) = app.database.fake_clock() {
        cluster.advance(by).await;
    }
    app.clock.advance(chrono::Duration::from_std(by).unwrap());
    app.sim().advance_clock(by).await.unwrap()
}

pub fn minutes(count: u64) -> Duration {
    Duration::from_secs(count * 60)
}

pub fn hours(count: u64) -> Duration {
    Duration::from_secs(count * 3600)
}

/// Calls `Charge` while the simulator answers the create with `fault`: the caller is told the
/// outcome is unknown and the attempt stays pending (charged at the provider or not, by `fault`).
pub async fn leave_pending(app: &TestApp, operation: &str, fault: FaultKind) -> Attempt {
    fail_next_create(app, fault).await;
    let answer = app.charge(charge_request(operation)).await;
    expect_left_pending(app, operation, answer).await
}

/// The simulator answers the next create with `fault`.
pub async fn fail_next_create(app: &TestApp, fault: FaultKind) {
    app.sim().set_fault(Endpoint::CreatePaymentIntent, FaultSpec::next(fault, 1)).await.unwrap();
}

/// Checks the answer to a `Charge` whose create failed by [`fail_next_create`] (through any
/// replica): outcome unknown, the row pending with no provider object.
pub async fn expect_left_pending(
    app: &TestApp,
    operation: &str,
    answer: Result<ChargeResponse, Status>,
) -> Attempt {
    let error = answer.unwrap_err();
    assert_eq!(error_code(&error), "outcome_unknown", "{error:?}");
    let attempt = stored(app, operation).await;
    assert_eq!(attempt.status, AttemptStatus::Pending);
    assert_eq!(attempt.provider_payment_id, None);
    attempt
}

/// Rows as a process leaves them that committed them and died before calling the provider:
/// pending, lease run out, due now. Inserted through the store, as the charge path does.
pub async fn seed_due_rows(app: &TestApp, prefix: &str, count: usize) -> Vec<Attempt> {
    let time = CallerTime::of(app.clock.as_ref());
    let store = app.orchestrator.store().clone();
    let rows = futures::stream::iter(0..count)
        .map(|index| {
            let store = store.clone();
            async move {
                let owner = LeaseOwner::from_uuid(Uuid::new_v4());
                let new = pending_attempt(&format!("{prefix}-{index}"), owner, ChronoDuration::zero(), ChronoDuration::zero(), time);
                insert_new(store.as_ref(), &new).await
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
    assert_eq!(rows.len(), count);
    rows
}

/// Runs passes until one claims nothing; returns their sum.
pub async fn sweep_until_idle(app: &TestApp) -> SweepOutcome {
    let mut total = SweepOutcome::default();
    for _ in 0..SWEEP_PASSES_MAX {
        let pass = app.orchestrator.try_sweep_once().await.unwrap();
        if pass.claimed == 0 {
            return total;
        }
        total += pass;
    }
    panic!("still claiming rows after {SWEEP_PASSES_MAX} passes: {total}");
}

pub async fn creates_with_key(app: &TestApp, key: &str) -> usize {
    app.creates().await.iter().filter(|r| r.idempotency_key.as_deref() == Some(key)).count()
}

/// SEMANTICS.md invariants 1 and 2 for `operations`: each attempt is terminal; a succeeded one
/// has exactly one payment intent at the provider (the one it adopted), a failed one none.
pub async fn assert_settled(app: &TestApp, operations: &[&str]) {
    let ledger = app.sim().ledger().await.unwrap();
    for operation in operations {
        let attempt = stored(app, operation).await;
        assert!(attempt.status.is_terminal(), "{operation} is {:?}", attempt.status);
        let id = attempt.id.to_string();
        let charges: Vec<_> =
            ledger.payment_intents_with_metadata("chargeguard_attempt_id", &id).collect();
        match attempt.status {
            AttemptStatus::Succeeded => {
                assert_eq!(charges.len(), 1, "{operation}: one charge at the provider");
                assert_eq!(attempt.provider_payment_id.as_deref(), Some(charges[0].id.as_str()));
                assert_eq!(charges[0].status, "succeeded");
            }
            _ => assert!(
                charges.iter().all(|c| c.status != "succeeded"),
                "{operation}: failed yet charged"
            ),
        }
    }
}
