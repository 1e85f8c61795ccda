//! The provider saves a 500 under a key and replays it for every later request with that key
//! (Stripe API v1 does, with `Idempotent-Replayed: true`), and a provider setting changes under
//! a pending row: what is sent under a key never changes, and a key whose saved answer is a
//! failure is never sent again. Everything is counted at the provider, in the simulator's
//! request log and ledger.

use chargeguard::domain::{Attempt, AttemptStatus};
use chargeguard::grpc::proto::{AttemptStatus as ProtoStatus, ChargeOutcome};
use chargeguard::simulator::{FaultKind, RequestLogEntry};
use tonic::Code;

use super::{
    advance, assert_settled, expect_left_pending, fail_next_create, hours, minutes,
    stored, sweep_until_idle,
};
use crate::support::{Backend, TestApp, charge_request, error_code, on_both_backends, outcome_of, status_of};
use crate::webhooks::counter;

/// Redeliveries and sweep passes made inside the key window after the replay was seen.
const ROUNDS_INSIDE_THE_WINDOW: usize = 4;

/// The create requests sent with `key`, in order.
async fn creates_with(app: &TestApp, key: &str) -> Vec<RequestLogEntry> {
    app.creates().await.into_iter().filter(|r| r.idempotency_key.as_deref() == Some(key)).collect()
}

/// The first create with `key` the simulator answered from its store: from here on, the key
/// must never be sent again.
async fn replay_seen(app: &TestApp, key: &str) -> RequestLogEntry {
    let creates = creates_with(app, key).await;
    let replayed = creates.iter().find(|r| r.replayed).cloned();
    replayed.unwrap_or_else(|| panic!("no replayed create with {key}: {creates:?}"))
}

async fn creates_after(app: &TestApp, key: &str, seen: &RequestLogEntry) -> Vec<RequestLogEntry> {
    creates_with(app, key).await.into_iter().filter(|r| r.seq > seen.seq).collect()
}

/// Charges `operation` while the simulator answers its first create with the saved-500 fault
/// `fault`. That first answer is a 500 like any other (nothing is replayed yet), so the
/// caller hears "unknown" and the row stays pending, its key not yet known to replay.
async fn first_create_saves_a_500(app: &TestApp, operation: &str, fault: FaultKind) -> Attempt {
    fail_next_create(app, fault).await;
    let answer = app.charge(charge_request(operation)).await;
    let attempt = expect_left_pending(app, operation, answer).await;
    assert!(!attempt.create_replays_failure, "nothing was replayed yet");
    attempt
}

async fn a_replayed_500_with_the_object_created_is_adopted_and_the_key_never_sent_again(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    let redelivered = first_create_saves_a_500(&app, "replayed-charged-1", FaultKind::ApplyThenFailSaved).await;
    let swept = first_create_saves_a_500(&app, "replayed-charged-2", FaultKind::ApplyThenFailSaved).await;
    assert_eq!(app.sim().ledger().await.unwrap().payment_intents.len(), 2, "both were charged");
    let replays_counted_before = counter(&app, "chargeguard_replayed_failures_total").await;

    // A redelivery re-sends the key, hears the saved 500 replayed, and looks the intent up in
    // the same round: the consumer hears the adopted success at once.
    let answer = app.charge(charge_request("replayed-charged-1")).await.unwrap();
    assert_eq!((outcome_of(&answer), status_of(&answer)), (ChargeOutcome::Reconciled, ProtoStatus::Succeeded));

    // The sweep does the same for a row nobody redelivers, within a minute.
    advance(&app, minutes(1)).await;
    let pass = app.orchestrator.try_sweep_once().await.unwrap();
    assert_eq!((pass.claimed, pass.succeeded, pass.flagged), (1, 1, 0), "{pass}");

    for attempt in [&redelivered, &swept] {
        let key = attempt.idempotency_key.as_str();
        let seen = replay_seen(&app, key).await;
        assert_eq!(seen.status, Some(500), "the saved failure was replayed: {seen:?}");
        let done = stored(&app, attempt.operation_key.as_str()).await;
        assert_eq!(done.status, AttemptStatus::Succeeded);
        assert!(done.create_replays_failure, "the key is marked as replaying its failure");
        assert_eq!(done.review_reason, None);
    }
    // Nothing re-sends either key afterwards: not a duplicate, not a later sweep.
    let again = app.charge(charge_request("replayed-charged-1")).await.unwrap();
    assert_eq!(outcome_of(&again), ChargeOutcome::Duplicate);
    advance(&app, hours(2)).await;
    assert_eq!(sweep_until_idle(&app).await.claimed, 0);
    for attempt in [&redelivered, &swept] {
        let key = attempt.idempotency_key.as_str();
        let seen = replay_seen(&app, key).await;
        assert_eq!(creates_after(&app, key, &seen).await, Vec::new(), "{key} was sent after its replay");
        assert_eq!(creates_with(&app, key).await.len(), 2, "the first create and the one replayed");
    }
    assert_settled(&app, &["replayed-charged-1", "replayed-charged-2"]).await;
    assert_eq!(app.sim().ledger().await.unwrap().payment_intents.len(), 2, "one intent each");
    // The recorder is one per test binary: other tests may add to the count, never take away.
    let replays_counted = counter(&app, "chargeguard_replayed_failures_total").await;
    assert!(replays_counted >= replays_counted_before + 2.0, "{replays_counted_before} → {replays_counted}");
}

async fn a_replayed_500_without_the_object_is_never_resent_and_expires_after_the_window(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    let operation = "replayed-never";
    let attempt = first_create_saves_a_500(&app, operation, FaultKind::FailSaved).await;
    let key = attempt.idempotency_key.as_str();

    // The redelivery that first hears the replay, then redeliveries and sweep passes for hours:
    // each looks for the intent, none sends the key, and the consumer is told why.
    for round in 0..=ROUNDS_INSIDE_THE_WINDOW {
        let redelivered = app.charge(charge_request(operation)).await.unwrap_err();
        assert_eq!(
            (redelivered.code(), error_code(&redelivered).as_str()),
            (Code::Unavailable, "provider_failure_replayed"),
            "round {round}: {redelivered:?}"
        );
        advance(&app, hours(2)).await;
        let pass = app.orchestrator.try_sweep_once().await.unwrap();
        assert_eq!((pass.claimed, pass.unfinished, pass.failed, pass.flagged), (1, 1, 0, 0), "round {round}: {pass}");
    }
    let seen = replay_seen(&app, key).await;
    assert_eq!(creates_after(&app, key, &seen).await, Vec::new(), "the key was sent after its replay");
    let waiting = stored(&app, operation).await;
    assert_eq!(waiting.status, AttemptStatus::Pending, "inside the window nothing proves it was not charged");
    assert!(waiting.create_replays_failure);
    assert_eq!(waiting.review_reason, None, "the machine can decide this one: no person needed");

    // Past the window the lookup is conclusive: nothing was charged.
    let jumped_at = advance(&app, hours(25)).await;
    let swept = sweep_until_idle(&app).await;
    assert_eq!((swept.claimed, swept.failed, swept.flagged), (1, 1, 0), "{swept}");
    let ended = stored(&app, operation).await;
    assert_eq!(ended.status, AttemptStatus::Failed);
    assert_eq!(ended.failure.unwrap().code, "expired");
    let late_creates: Vec<_> = app.creates().await.into_iter().filter(|r| r.sim_time >= jumped_at).collect();
    assert_eq!(late_creates, Vec::new(), "no create after the window closed");
    assert_eq!(creates_with(&app, key).await.len(), 2, "the first create and the one replayed");
    assert_settled(&app, &[operation]).await;
    assert_eq!(app.sim().ledger().await.unwrap().payment_intents.len(), 0, "nothing was ever charged");
}

const RETURN_URL_BEFORE: &str = "https://shop.example/return/before";
const RETURN_URL_AFTER: &str = "https://shop.example/return/after";

/// A deployment that changes `provider.return_url` while rows are pending: the re-send of each
/// row carries the `return_url` it was first sent with, under the same key. Sent with the new
/// one, the create whose first request was saved would be refused (`idempotency_error`, the
/// row flagged for good), and the one never saved would make an intent with other parameters
/// than the key's first request.
async fn a_return_url_changed_under_a_pending_row_is_resent_as_first_sent(backend: Backend) {
    let before = |config: &mut chargeguard::config::Config| {
        config.provider.return_url = Some(RETURN_URL_BEFORE.to_owned());
    };
    let app = TestApp::spawn_backend_with(backend, before).await;
    let redelivered = super::leave_pending(&app, "return-url-never", FaultKind::FailBeforeApply).await;
    let swept = super::leave_pending(&app, "return-url-charged", FaultKind::ApplyThenFail).await;
    for attempt in [&redelivered, &swept] {
        assert_eq!(attempt.return_url.as_deref(), Some(RETURN_URL_BEFORE), "stored with the row");
    }

    let app = app
        .restart_with(|config| config.provider.return_url = Some(RETURN_URL_AFTER.to_owned()))
        .await;
    let answer = app.charge(charge_request("return-url-never")).await.unwrap();
    assert_eq!((outcome_of(&answer), status_of(&answer)), (ChargeOutcome::Reconciled, ProtoStatus::Succeeded));
    advance(&app, minutes(1)).await;
    let pass = app.orchestrator.try_sweep_once().await.unwrap();
    assert_eq!((pass.claimed, pass.succeeded, pass.flagged), (1, 1, 0), "{pass}");
    // A new charge uses the new setting.
    app.charge(charge_request("return-url-new")).await.unwrap();

    let operations = ["return-url-never", "return-url-charged", "return-url-new"];
    assert_settled(&app, &operations).await;
    let ledger = app.sim().ledger().await.unwrap();
    assert_eq!(ledger.payment_intents.len(), 3, "one intent each");
    for (operation, expected) in operations.into_iter().zip([RETURN_URL_BEFORE, RETURN_URL_BEFORE, RETURN_URL_AFTER]) {
        let attempt = stored(&app, operation).await;
        assert_eq!(attempt.review_reason, None, "{operation}");
        let id = attempt.provider_payment_id.unwrap();
        let intent = ledger.payment_intents.iter().find(|intent| intent.id == id).unwrap();
        assert_eq!(intent.return_url.as_deref(), Some(expected), "{operation}");
    }
    let refused: Vec<_> = app.creates().await.into_iter().filter(|r| r.status == Some(400)).collect();
    assert_eq!(refused, Vec::new(), "no create was refused as an idempotency error");
}

on_both_backends!(
    a_replayed_500_with_the_object_created_is_adopted_and_the_key_never_sent_again,
    a_replayed_500_without_the_object_is_never_resent_and_expires_after_the_window,
    a_return_url_changed_under_a_pending_row_is_resent_as_first_sent,
);
