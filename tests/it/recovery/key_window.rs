//! The provider forgets an idempotency key 24 hours after its first use, and a forgotten key
//! makes a new charge (SEMANTICS.md invariant 7). Past chargeguard's safe window (23 hours) an
//! old key is never sent again: the provider is asked what exists, by the attempt's metadata.

use std::collections::BTreeMap;

use chargeguard::domain::{AttemptStatus, IdempotencyKey};
use chargeguard::grpc::proto::{AttemptStatus as ProtoStatus, ChargeOutcome};
use chargeguard::simulator::{
    AuthenticationOutcome, FaultKind, RequestLogEntry, SeedPaymentIntent,
};

use super::{
    advance, assert_settled, hours, leave_pending, minutes, shown, stored,
    sweep_until_idle,
};
use crate::support::{Backend, TestApp, charge_request, on_both_backends, outcome_of, status_of};
use crate::webhooks::counter;

/// Requests the simulator received at or after `since` (sim clock).
async fn requests_since(app: &TestApp, since: i64) -> Vec<RequestLogEntry> {
    app.sim().requests().await.unwrap().into_iter().filter(|r| r.sim_time >= since).collect()
}

fn assert_no_create_with(after_jump: &[RequestLogEntry], old_keys: &[IdempotencyKey]) {
    for request in after_jump {
        let is_create = request.method == "POST" && request.path == "/v1/payment_intents";
        assert!(!is_create, "a create was sent after the window closed: {request:?}");
        let key = request.idempotency_key.as_deref();
        assert!(
            old_keys.iter().all(|old| Some(old.as_str()) != key),
            "an old key was sent again: {request:?}"
        );
    }
    let searched =
        after_jump.iter().any(|r| r.endpoint.as_deref() == Some("search_payment_intents"));
    let listed = after_jump.iter().any(|r| r.endpoint.as_deref() == Some("list_payment_intents"));
    assert!(searched && listed, "past the window the provider is searched and listed");
}

async fn after_a_25_hour_jump_the_sweep_adopts_what_was_charged_and_expires_what_never_happened(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    let charged = ["window-charged-1", "window-charged-2"];
    let never = ["window-never-1", "window-never-2"];
    let mut old_keys = Vec::new();
    old_keys.push(leave_pending(&app, charged[0], FaultKind::ApplyThenFail).await.idempotency_key);
    old_keys.push(leave_pending(&app, charged[1], FaultKind::ApplyThenDrop).await.idempotency_key);
    for operation in never {
        old_keys
            .push(leave_pending(&app, operation, FaultKind::FailBeforeApply).await.idempotency_key);
    }
    assert_eq!(app.sim().ledger().await.unwrap().payment_intents.len(), 2);

    let jumped_at = advance(&app, hours(25)).await;
    let swept = sweep_until_idle(&app).await;
    assert_eq!((swept.claimed, swept.succeeded, swept.failed), (4, 2, 2), "{swept}");

    assert_no_create_with(&requests_since(&app, jumped_at).await, &old_keys);
    for operation in never {
        let attempt = stored(&app, operation).await;
        assert_eq!(attempt.status, AttemptStatus::Failed);
        assert_eq!(
            attempt.failure.unwrap().code,
            "expired",
            "the provider confirmed nothing was charged"
        );
    }
    for operation in charged {
        assert_eq!(stored(&app, operation).await.status, AttemptStatus::Succeeded);
    }
    assert_settled(&app, &[charged[0], charged[1], never[0], never[1]]).await;
    assert_eq!(app.sim().ledger().await.unwrap().payment_intents.len(), 2, "no new charge");
}

async fn a_redelivered_charge_past_the_window_looks_up_instead_of_resending(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    let charged_key =
        leave_pending(&app, "late-charged", FaultKind::ApplyThenFail).await.idempotency_key;
    let never_key =
        leave_pending(&app, "late-never", FaultKind::FailBeforeApply).await.idempotency_key;
    let jumped_at = advance(&app, hours(25)).await;

    let charged = app.charge(charge_request("late-charged")).await.unwrap();
    assert_eq!(outcome_of(&charged), ChargeOutcome::Reconciled);
    assert_eq!(status_of(&charged), ProtoStatus::Succeeded);
    let never = app.charge(charge_request("late-never")).await.unwrap();
    assert_eq!(outcome_of(&never), ChargeOutcome::Reconciled);
    assert_eq!(status_of(&never), ProtoStatus::Failed);
    assert_eq!(never.attempt.unwrap().failure_code, "expired");
    let again = app.charge(charge_request("late-never")).await.unwrap();
    assert_eq!(outcome_of(&again), ChargeOutcome::Duplicate);

    assert_no_create_with(&requests_since(&app, jumped_at).await, &[charged_key, never_key]);
    assert_settled(&app, &["late-charged", "late-never"]).await;
    assert_eq!(app.sim().ledger().await.unwrap().payment_intents.len(), 1);
}

async fn a_double_charge_found_past_the_window_is_adopted_and_flagged(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    let attempt = leave_pending(&app, "double-1", FaultKind::ApplyThenFail).await;
    // A second object for the same attempt, as a key the provider forgot would have made.
    let second = app
        .sim()
        .seed_payment_intent(SeedPaymentIntent {
            amount: 1_000,
            currency: "usd".into(),
            status: "succeeded".into(),
            metadata: BTreeMap::from([(
                "chargeguard_attempt_id".to_owned(),
                attempt.id.to_string(),
            )]),
            created: None,
        })
        .await
        .unwrap();
    advance(&app, hours(25)).await;
    let double_charges_before = counter(&app, "chargeguard_double_charges_found_total").await;
    let flagged_before = counter(&app, "chargeguard_attempts_flagged_total{reason=\"double_charge\"}").await;

    let swept = sweep_until_idle(&app).await;
    assert_eq!((swept.claimed, swept.succeeded, swept.flagged), (1, 1, 1), "{swept}");
    let shown = shown(&app, "double-1").await;
    assert_eq!(
        ProtoStatus::try_from(shown.status).unwrap(),
        ProtoStatus::Succeeded,
        "the money moved"
    );
    assert!(shown.needs_review, "reports show the flag");
    assert!(shown.review_reason.starts_with("double charge"), "{}", shown.review_reason);
    assert!(shown.review_reason.contains(&second.id), "{}", shown.review_reason);
    assert!(shown.review_reason.contains(&shown.provider_payment_id), "{}", shown.review_reason);
    // The recorder is one per test binary: other tests may add to the count, never take away.
    let double_charges = counter(&app, "chargeguard_double_charges_found_total").await;
    assert!(double_charges >= double_charges_before + 1.0, "{double_charges_before} → {double_charges}");
    let flagged = counter(&app, "chargeguard_attempts_flagged_total{reason=\"double_charge\"}").await;
    assert!(flagged >= flagged_before + 1.0, "flagged as a double charge: {flagged_before} → {flagged}");
}

async fn requires_action_rows_are_read_and_adopted_then_cancelled_past_their_age(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    for operation in ["action-completed", "action-abandoned"] {
        let mut request = charge_request(operation);
        request.payment_method = "pm_card_authenticationRequired".into();
        assert_eq!(status_of(&app.charge(request).await.unwrap()), ProtoStatus::RequiresAction);
    }
    advance(&app, minutes(2)).await;
    let waiting = app.orchestrator.try_sweep_once().await.unwrap();
    assert_eq!((waiting.claimed, waiting.unfinished), (2, 2), "{waiting}");

    let completed = stored(&app, "action-completed").await.provider_payment_id.unwrap();
    app.sim().authenticate(&completed, AuthenticationOutcome::Succeed).await.unwrap();
    advance(&app, minutes(10)).await;
    let adopted = app.orchestrator.try_sweep_once().await.unwrap();
    assert_eq!((adopted.succeeded, adopted.unfinished), (1, 1), "{adopted}");

    // Past charge.requires_action_age_max (24 h) the intent is cancelled at the provider.
    advance(&app, hours(25)).await;
    let cancelled = sweep_until_idle(&app).await;
    assert_eq!((cancelled.claimed, cancelled.failed), (1, 1), "{cancelled}");
    let abandoned = stored(&app, "action-abandoned").await;
    assert_eq!(abandoned.failure.unwrap().code, "canceled");
    let ledger = app.sim().ledger().await.unwrap();
    let intent = ledger
        .payment_intents
        .iter()
        .find(|i| Some(&i.id) == abandoned.provider_payment_id.as_ref())
        .unwrap();
    assert_eq!(intent.status, "canceled");
    assert_settled(&app, &["action-completed", "action-abandoned"]).await;
}

// Single-process recovery: the same tests on both stores.
on_both_backends!(
    after_a_25_hour_jump_the_sweep_adopts_what_was_charged_and_expires_what_never_happened,
    a_redelivered_charge_past_the_window_looks_up_instead_of_resending,
    a_double_charge_found_past_the_window_is_adopted_and_flagged,
    requires_action_rows_are_read_and_adopted_then_cancelled_past_their_age,
);
