//! SEMANTICS.md's crash table, one test per row: a real `chargeguard serve` process stops at a
//! crash point, then redelivery and/or the sweep (of the in-process app, another "replica" on the
//! same database and provider) must finish what it left, with one charge per operation.

use chargeguard::clock::Clock;
use chargeguard::domain::AttemptStatus;
use chargeguard::grpc::proto::{AttemptStatus as ProtoStatus, ChargeOutcome};

use super::child::{ChildProcess, ChildSweep};
use super::{
    advance, assert_settled, creates_with_key, hours, minutes, seed_due_rows, stored,
    sweep_until_idle,
};
use crate::support::{TestApp, charge_request, outcome_of, status_of};

/// Runs `Charge` for `operation` in a child that stops at `failpoint` on the way.
async fn crash_during_charge(app: &TestApp, failpoint: &str, operation: &str) {
    let child = ChildProcess::serve(app, failpoint, ChildSweep::Off).await;
    let lost = child.charge(charge_request(operation)).await;
    assert!(lost.is_err(), "the caller never hears from a process that died: {lost:?}");
    child.expect_crash().await;
}

#[tokio::test]
async fn crash_before_the_pending_commit_leaves_nothing_and_the_retry_charges_once() {
    let app = TestApp::spawn().await;
    crash_during_charge(&app, "charge.before_pending_commit", "crash-1").await;
    assert_eq!(app.attempt_rows().await, 0, "nothing was recorded");
    assert!(app.sim().requests().await.unwrap().is_empty(), "nothing was sent");
    assert_eq!(app.orchestrator.try_sweep_once().await.unwrap().claimed, 0, "nothing to recover");

    let retry = app.charge(charge_request("crash-1")).await.unwrap();
    assert_eq!(outcome_of(&retry), ChargeOutcome::Applied, "the retry inserts it and proceeds");
    assert_settled(&app, &["crash-1"]).await;
    assert_eq!(app.sim().ledger().await.unwrap().payment_intents.len(), 1);
}

#[tokio::test]
async fn crash_after_the_pending_commit_is_finished_by_redelivery_or_by_the_sweep() {
    let app = TestApp::spawn().await;
    for operation in ["crash-2-redelivered", "crash-2-swept"] {
        crash_during_charge(&app, "charge.after_pending_commit", operation).await;
        let attempt = stored(&app, operation).await;
        assert_eq!(attempt.status, AttemptStatus::Pending);
        assert!(attempt.lease.is_some(), "the dead process still holds its lease");
    }
    assert!(app.creates().await.is_empty(), "the provider was never called");
    // Past the dead process's lease and the recovery grace period.
    advance(&app, minutes(2)).await;

    let redelivered = app.charge(charge_request("crash-2-redelivered")).await.unwrap();
    assert_eq!(outcome_of(&redelivered), ChargeOutcome::Reconciled);
    assert_eq!(status_of(&redelivered), ProtoStatus::Succeeded);
    let swept = app.orchestrator.try_sweep_once().await.unwrap();
    assert_eq!((swept.claimed, swept.succeeded), (1, 1), "{swept}");

    assert_settled(&app, &["crash-2-redelivered", "crash-2-swept"]).await;
    assert_eq!(app.sim().ledger().await.unwrap().payment_intents.len(), 2);
    for operation in ["crash-2-redelivered", "crash-2-swept"] {
        let key = stored(&app, operation).await.idempotency_key;
        assert_eq!(
            creates_with_key(&app, key.as_str()).await,
            1,
            "inside the window: the same key, once"
        );
    }
}

#[tokio::test]
async fn crash_after_the_provider_charged_is_adopted_by_redelivery_or_by_the_sweep() {
    let app = TestApp::spawn().await;
    let operations = ["crash-3-redelivered", "crash-3-swept"];
    for operation in operations {
        crash_during_charge(&app, "round.after_provider_call", operation).await;
        let attempt = stored(&app, operation).await;
        assert_eq!(attempt.status, AttemptStatus::Pending, "the result was never recorded");
        assert_eq!(attempt.provider_payment_id, None);
    }
    assert_eq!(
        app.sim().ledger().await.unwrap().payment_intents.len(),
        2,
        "the provider charged each"
    );
    advance(&app, minutes(2)).await;

    // Inside the window the same key is re-sent and the provider replays its first answer.
    let redelivered = app.charge(charge_request("crash-3-redelivered")).await.unwrap();
    assert_eq!(outcome_of(&redelivered), ChargeOutcome::Reconciled);
    assert_eq!(status_of(&redelivered), ProtoStatus::Succeeded);
    let swept = app.orchestrator.try_sweep_once().await.unwrap();
    assert_eq!((swept.claimed, swept.succeeded), (1, 1), "{swept}");
    let replays = app.sim().requests().await.unwrap().into_iter().filter(|r| r.replayed).count();
    assert_eq!(replays, 2, "both re-sends were answered from the provider's key store");
    assert_settled(&app, &operations).await;
    assert_eq!(app.sim().ledger().await.unwrap().payment_intents.len(), 2);
}

#[tokio::test]
async fn crash_after_the_provider_charged_past_the_window_is_found_by_metadata() {
    let app = TestApp::spawn().await;
    crash_during_charge(&app, "round.after_provider_call", "crash-3-late").await;
    let key = stored(&app, "crash-3-late").await.idempotency_key;
    let jumped_at = advance(&app, hours(25)).await;

    let swept = sweep_until_idle(&app).await;
    assert_eq!((swept.claimed, swept.succeeded), (1, 1), "{swept}");
    let after_jump: Vec<_> = app
        .sim()
        .requests()
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.sim_time >= jumped_at)
        .collect();
    assert!(
        after_jump.iter().all(|r| r.idempotency_key.as_deref() != Some(key.as_str())),
        "the old key is never sent again"
    );
    assert!(after_jump.iter().any(|r| r.endpoint.as_deref() == Some("search_payment_intents")));
    assert_settled(&app, &["crash-3-late"]).await;
    assert_eq!(app.sim().ledger().await.unwrap().payment_intents.len(), 1);
}

#[tokio::test]
async fn crash_after_the_result_is_recorded_answers_the_duplicate_from_the_record() {
    let app = TestApp::spawn().await;
    crash_during_charge(&app, "charge.after_record", "crash-4").await;
    let recorded = stored(&app, "crash-4").await;
    assert_eq!(recorded.status, AttemptStatus::Succeeded);

    let duplicate = app.charge(charge_request("crash-4")).await.unwrap();
    assert_eq!(outcome_of(&duplicate), ChargeOutcome::Duplicate);
    assert_eq!(status_of(&duplicate), ProtoStatus::Succeeded);
    assert_eq!(
        duplicate.attempt.unwrap().provider_payment_id,
        recorded.provider_payment_id.unwrap()
    );
    advance(&app, minutes(2)).await;
    assert_eq!(
        app.orchestrator.try_sweep_once().await.unwrap().claimed,
        0,
        "a terminal row is not swept"
    );
    assert_eq!(app.creates().await.len(), 1, "nothing was called again");
    assert_settled(&app, &["crash-4"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweeper_that_dies_mid_batch_leaves_its_rows_to_others_after_their_leases() {
    let app = TestApp::spawn().await;
    let seeded = seed_due_rows(&app, "crash-5", 10).await;
    // The scheduled sweep inside `serve` picks the rows up and the process dies after the
    // first row it finishes, with others in flight.
    ChildProcess::serve_unattended(
        &app,
        "sweep.mid_batch",
        ChildSweep::EverySecond { batch_max: 10, concurrency_max: 4 },
    )
    .expect_crash()
    .await;

    let mut held = Vec::new();
    let mut finished = 0;
    for row in &seeded {
        let row = stored(&app, row.operation_key.as_str()).await;
        if row.status.is_terminal() {
            finished += 1;
        } else if row.is_leased_at(app.clock.now()) {
            held.push(row);
        }
    }
    assert!(finished >= 1, "the dead sweeper finished one row before it died");
    assert!(held.len() <= 3, "it held at most its concurrency's other rows: {}", held.len());

    // Another sweeper right away takes every row but the ones the dead one still holds.
    let now_pass = app.orchestrator.try_sweep_once().await.unwrap();
    assert_eq!(now_pass.claimed as usize, seeded.len() - finished - held.len(), "{now_pass}");
    for row in &held {
        let still = stored(&app, row.operation_key.as_str()).await;
        assert_eq!(
            still.status,
            AttemptStatus::Pending,
            "no row is reconciled by two workers at once"
        );
        assert_eq!(still.lease, row.lease);
    }
    // Once their leases end, they are anybody's.
    advance(&app, minutes(2)).await;
    let later = sweep_until_idle(&app).await;
    assert_eq!(later.claimed as usize, held.len(), "{later}");

    let operations: Vec<String> =
        seeded.iter().map(|row| row.operation_key.as_str().to_owned()).collect();
    let operations: Vec<&str> = operations.iter().map(String::as_str).collect();
    assert_settled(&app, &operations).await;
    assert_eq!(app.sim().ledger().await.unwrap().payment_intents.len(), seeded.len());
}
