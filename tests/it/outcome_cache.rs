//! Duplicates of decided operations answered from memory (`charge.outcome_cache_ttl_ms`): the
//! outcome is the stored one (SEMANTICS.md invariant 3), a changed request is still refused, and
//! what another writer changes on the row reaches the answer once the entry is older than the
//! ttl. "Another writer" is a statement on the database, as an operator or another replica would
//! make; the entry's age is all that decides whether the database is read.

use std::time::Duration;

use chargeguard::grpc::proto::{AttemptStatus, ChargeOutcome};
use tonic::Code;

use crate::support::{BILLING_TOKEN, Backend, TestApp, charge_request, error_code, on_both_backends, outcome_of, status_of};

const FLAG: &str = "UPDATE payment_attempts SET review_reason = 'checked by an operator' WHERE operation_key = 'order-1:charge'";

async fn spawn_with_ttl(backend: Backend, ttl_ms: u64) -> TestApp {
    TestApp::spawn_backend_with(backend, |config| config.charge.outcome_cache_ttl_ms = ttl_ms).await
}

async fn within_the_ttl_a_duplicate_is_answered_from_memory(backend: Backend) {
    let app = spawn_with_ttl(backend, 60_000).await;
    let first = app.charge(charge_request("order-1:charge")).await.unwrap();
    assert_eq!(outcome_of(&first), ChargeOutcome::Applied);
    assert_eq!(app.database.execute(FLAG).await, 1);

    let again = app.charge(charge_request("order-1:charge")).await.unwrap();
    assert_eq!(outcome_of(&again), ChargeOutcome::Duplicate);
    assert_eq!(again.attempt, first.attempt, "the decided attempt as this process last read it");
    assert!(!again.attempt.as_ref().unwrap().needs_review, "the database was not read");

    let stored = app.attempt_of("order-1:charge").await;
    assert!(stored.needs_review, "GetAttempt reads the database");
    assert_eq!(stored.status, AttemptStatus::Succeeded as i32);
    assert_eq!(app.creates().await.len(), 1);
    assert_eq!(app.attempt_rows().await, 1);
}

async fn past_the_ttl_a_duplicate_reads_the_database_again(backend: Backend) {
    let app = spawn_with_ttl(backend, 200).await;
    app.charge(charge_request("order-1:charge")).await.unwrap();
    assert_eq!(app.database.execute(FLAG).await, 1);
    tokio::time::sleep(Duration::from_millis(400)).await;

    let again = app.charge(charge_request("order-1:charge")).await.unwrap();
    assert_eq!(outcome_of(&again), ChargeOutcome::Duplicate);
    let attempt = again.attempt.unwrap();
    assert!(attempt.needs_review, "read from the database");
    assert_eq!(attempt.review_reason, "checked by an operator");
    assert_eq!(app.creates().await.len(), 1);
}

async fn with_the_cache_off_every_duplicate_reads_the_database(backend: Backend) {
    let app = spawn_with_ttl(backend, 0).await;
    app.charge(charge_request("order-1:charge")).await.unwrap();
    assert_eq!(app.database.execute(FLAG).await, 1);

    let again = app.charge(charge_request("order-1:charge")).await.unwrap();
    assert_eq!(outcome_of(&again), ChargeOutcome::Duplicate);
    assert!(again.attempt.unwrap().needs_review);
}

async fn a_remembered_outcome_still_refuses_different_parameters(backend: Backend) {
    let app = spawn_with_ttl(backend, 60_000).await;
    let first = app.charge(charge_request("order-1:charge")).await.unwrap();
    let mut changed = charge_request("order-1:charge");
    changed.amount_minor = 2_000;
    let error = app.charge(changed).await.unwrap_err();
    assert_eq!(error.code(), Code::FailedPrecondition);
    assert_eq!(error_code(&error), "operation_mismatch");
    assert!(error.message().contains("amount_minor"), "{}", error.message());
    assert_eq!(Some(app.attempt_of("order-1:charge").await), first.attempt);
    assert_eq!(app.creates().await.len(), 1);
}

async fn a_decline_is_remembered_as_a_decline(backend: Backend) {
    let app = spawn_with_ttl(backend, 60_000).await;
    let mut request = charge_request("order-1:charge");
    request.payment_method = "pm_card_chargeDeclinedInsufficientFunds".into();
    let first = app.charge(request.clone()).await.unwrap();
    assert_eq!(status_of(&first), AttemptStatus::Failed);
    assert_eq!(app.database.execute(FLAG).await, 1);

    let again = app.charge(request).await.unwrap();
    assert_eq!(outcome_of(&again), ChargeOutcome::Duplicate);
    assert_eq!(again.attempt, first.attempt, "answered from memory");
    assert_eq!(app.creates().await.len(), 1, "the decision is not re-run");
}

async fn another_consumer_with_the_same_key_gets_its_own_attempt(backend: Backend) {
    let app = spawn_with_ttl(backend, 60_000).await;
    let orders = app.charge(charge_request("order-1:charge")).await.unwrap();
    let billing = app.charge_as(BILLING_TOKEN, charge_request("order-1:charge")).await.unwrap();
    assert_eq!(outcome_of(&billing), ChargeOutcome::Applied);
    assert_ne!(billing.attempt.as_ref().unwrap().attempt_id, orders.attempt.as_ref().unwrap().attempt_id);
    assert_eq!(app.creates().await.len(), 2);
}

async fn an_undecided_attempt_is_reconciled_not_remembered(backend: Backend) {
    use chargeguard::simulator::{Endpoint, FaultKind, FaultSpec};
    let app = spawn_with_ttl(backend, 60_000).await;
    app.sim().set_fault(Endpoint::CreatePaymentIntent, FaultSpec::next(FaultKind::FailBeforeApply, 1)).await.unwrap();
    let unknown = app.charge(charge_request("order-1:charge")).await.unwrap_err();
    assert_eq!(error_code(&unknown), "outcome_unknown", "{}", unknown.message());

    let retried = app.charge(charge_request("order-1:charge")).await.unwrap();
    assert_eq!(outcome_of(&retried), ChargeOutcome::Reconciled, "the pending row was read, not remembered");
    assert_eq!(status_of(&retried), AttemptStatus::Succeeded);
    assert_eq!(app.creates().await.len(), 2, "the pending attempt was sent again with its key");
    assert_eq!(app.sim().ledger().await.unwrap().payment_intents.len(), 1);
}

on_both_backends!(
    within_the_ttl_a_duplicate_is_answered_from_memory,
    past_the_ttl_a_duplicate_reads_the_database_again,
    with_the_cache_off_every_duplicate_reads_the_database,
    a_remembered_outcome_still_refuses_different_parameters,
    a_decline_is_remembered_as_a_decline,
    another_consumer_with_the_same_key_gets_its_own_attempt,
    an_undecided_attempt_is_reconciled_not_remembered,
);
