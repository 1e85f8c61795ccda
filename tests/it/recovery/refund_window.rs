//! The key window for refunds (SEMANTICS.md invariant 7): a refund key the provider may have
//! forgotten is never sent again. Stripe has no refund search, so past the window the charge's
//! refunds are listed and the one whose metadata names the refund attempt is adopted; a complete
//! list without it ends the refund `failed` / `expired`. Counted at the simulator's request log.

use chargeguard::domain::{AttemptStatus, IdempotencyKey};
use chargeguard::simulator::{Endpoint, FaultKind, FaultSpec, RequestLogEntry};

use super::{advance, hours, stored, sweep_until_idle};
use crate::support::{Backend, TestApp, charge_request, error_code, on_both_backends, refund_request};

async fn requests_since(app: &TestApp, since: i64) -> Vec<RequestLogEntry> {
    app.sim().requests().await.unwrap().into_iter().filter(|r| r.sim_time >= since).collect()
}

/// Refunds `operation` of `charge_operation` while the simulator answers the refund create
/// with `fault`: the caller hears the outcome is unknown, the refund row stays pending.
async fn leave_refund_pending(app: &TestApp, operation: &str, charge_operation: &str, fault: FaultKind) -> IdempotencyKey {
    app.sim().set_fault(Endpoint::CreateRefund, FaultSpec::next(fault, 1)).await.unwrap();
    let error = app.refund(refund_request(operation, charge_operation, Some(400))).await.unwrap_err();
    assert_eq!(error_code(&error), "outcome_unknown", "{error:?}");
    let attempt = stored(app, operation).await;
    assert_eq!((attempt.status, attempt.provider_payment_id.as_deref()), (AttemptStatus::Pending, None));
    attempt.idempotency_key
}

fn assert_no_refund_create_with(after_jump: &[RequestLogEntry], old_keys: &[IdempotencyKey]) {
    for request in after_jump {
        assert!(!(request.method == "POST" && request.path == "/v1/refunds"), "a refund create after the window: {request:?}");
        let key = request.idempotency_key.as_deref();
        assert!(old_keys.iter().all(|old| Some(old.as_str()) != key), "an old key was sent again: {request:?}");
    }
    assert!(after_jump.iter().any(|r| r.endpoint.as_deref() == Some("list_refunds")), "the charge's refunds are listed");
}

async fn after_a_25_hour_jump_a_lost_refund_is_adopted_from_the_list_and_a_missing_one_expires(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    app.charge(charge_request("window-refund:charge")).await.unwrap();
    // The provider refunded, the answer was lost; and one it never received.
    let lost = leave_refund_pending(&app, "window-refund:lost", "window-refund:charge", FaultKind::ApplyThenFail).await;
    let never = leave_refund_pending(&app, "window-refund:never", "window-refund:charge", FaultKind::FailBeforeApply).await;
    assert_eq!(app.sim().ledger().await.unwrap().refunds.len(), 1);

    let jumped_at = advance(&app, hours(25)).await;
    let swept = sweep_until_idle(&app).await;
    assert_eq!((swept.claimed, swept.succeeded, swept.failed), (2, 1, 1), "{swept}");
    assert_no_refund_create_with(&requests_since(&app, jumped_at).await, &[lost, never]);

    let ledger = app.sim().ledger().await.unwrap();
    assert_eq!(ledger.refunds.len(), 1, "never re-sent: still one refund at the provider");
    let adopted = stored(&app, "window-refund:lost").await;
    assert_eq!(adopted.status, AttemptStatus::Succeeded);
    assert_eq!(adopted.provider_payment_id.as_deref(), Some(ledger.refunds[0].id.as_str()));
    let expired = stored(&app, "window-refund:never").await;
    assert_eq!(expired.status, AttemptStatus::Failed);
    assert_eq!(expired.failure.unwrap().code, "expired");
    // The expired refund holds nothing against the charge: 600 is left to refund.
    let rest = app.refund(refund_request("window-refund:rest", "window-refund:charge", None)).await.unwrap();
    assert_eq!(rest.attempt.unwrap().amount_minor, 600);
}

async fn a_redelivered_refund_past_the_window_lists_instead_of_resending(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    app.charge(charge_request("window-refund-2:charge")).await.unwrap();
    let key = leave_refund_pending(&app, "window-refund-2:r", "window-refund-2:charge", FaultKind::ApplyThenDrop).await;
    let jumped_at = advance(&app, hours(25)).await;
    let redelivered = app.refund(refund_request("window-refund-2:r", "window-refund-2:charge", Some(400))).await.unwrap();
    assert_eq!(chargeguard::grpc::proto::ChargeOutcome::try_from(redelivered.outcome).unwrap(), chargeguard::grpc::proto::ChargeOutcome::Reconciled);
    assert_no_refund_create_with(&requests_since(&app, jumped_at).await, &[key]);
    assert_eq!(app.sim().ledger().await.unwrap().refunds.len(), 1);
    assert_eq!(stored(&app, "window-refund-2:r").await.status, AttemptStatus::Succeeded);
}

async fn the_sweep_finishes_a_refund_whose_create_failed_inside_the_window(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    app.charge(charge_request("sweep-refund:charge")).await.unwrap();
    let key = leave_refund_pending(&app, "sweep-refund:r", "sweep-refund:charge", FaultKind::FailBeforeApply).await;
    advance(&app, super::minutes(2)).await;
    let swept = sweep_until_idle(&app).await;
    assert_eq!((swept.claimed, swept.succeeded), (1, 1), "{swept}");
    let sends = app.refund_creates().await.into_iter().filter(|r| r.idempotency_key.as_deref() == Some(key.as_str())).count();
    assert_eq!(sends, 2, "the failed send and the sweep's re-send, with the same key");
    assert_eq!(app.sim().ledger().await.unwrap().refunds.len(), 1);
    assert_eq!(stored(&app, "sweep-refund:r").await.status, AttemptStatus::Succeeded);
}

async fn a_refund_key_whose_500_is_replayed_is_listed_not_resent_and_the_refund_adopted(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    app.charge(charge_request("replayed-refund:charge")).await.unwrap();
    // The provider refunded, then saved its 500 for the key: the key can never answer again.
    leave_refund_pending(&app, "replayed-refund:r", "replayed-refund:charge", FaultKind::ApplyThenFailSaved).await;
    let retried = app.refund(refund_request("replayed-refund:r", "replayed-refund:charge", Some(400))).await.unwrap();
    assert_eq!(chargeguard::grpc::proto::ChargeOutcome::try_from(retried.outcome).unwrap(), chargeguard::grpc::proto::ChargeOutcome::Reconciled);
    let attempt = stored(&app, "replayed-refund:r").await;
    assert_eq!(attempt.status, AttemptStatus::Succeeded);
    assert!(attempt.create_replays_failure, "the key is never sent again");
    let ledger = app.sim().ledger().await.unwrap();
    assert_eq!(ledger.refunds.len(), 1);
    assert_eq!(attempt.provider_payment_id.as_deref(), Some(ledger.refunds[0].id.as_str()));
    let log = app.sim().requests().await.unwrap();
    assert_eq!(log.iter().filter(|r| r.method == "POST" && r.path == "/v1/refunds").count(), 2, "the first send and one replayed re-send");
    assert!(log.iter().any(|r| r.endpoint.as_deref() == Some("list_refunds")));
}

async fn a_pending_refund_is_retrieved_by_the_sweep_until_it_settles(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    app.charge(charge_request("pending-refund:charge")).await.unwrap();
    app.sim().set_refund_mode(chargeguard::simulator::RefundMode::Pending).await.unwrap();
    let pending = app.refund(refund_request("pending-refund:r", "pending-refund:charge", Some(400))).await.unwrap();
    let refund_id = pending.attempt.unwrap().provider_payment_id;
    assert!(refund_id.starts_with("re_"), "the object is known: {refund_id}");
    assert_eq!(stored(&app, "pending-refund:r").await.status, AttemptStatus::Pending);

    advance(&app, super::minutes(2)).await;
    let first = sweep_until_idle(&app).await;
    assert_eq!((first.claimed, first.succeeded), (1, 0), "still pending at the provider: {first}");
    app.sim().settle_refund(&refund_id).await.unwrap();
    advance(&app, hours(1)).await;
    let settled = sweep_until_idle(&app).await;
    assert_eq!((settled.claimed, settled.succeeded), (1, 1), "{settled}");
    assert_eq!(stored(&app, "pending-refund:r").await.status, AttemptStatus::Succeeded);
    assert_eq!(app.refund_creates().await.len(), 1, "a known refund is retrieved, never created again");
}

on_both_backends!(
    a_pending_refund_is_retrieved_by_the_sweep_until_it_settles,
    a_refund_key_whose_500_is_replayed_is_listed_not_resent_and_the_refund_adopted,
    after_a_25_hour_jump_a_lost_refund_is_adopted_from_the_list_and_a_missing_one_expires,
    a_redelivered_refund_past_the_window_lists_instead_of_resending,
    the_sweep_finishes_a_refund_whose_create_failed_inside_the_window,
);
