//! SEMANTICS.md's crash table, one test per row: a real `chargeguard serve` process stops at a
//! crash point, then redelivery and/or the sweep (of the in-process app, another "replica" on the
//! same database and provider) must finish what it left, with one charge per operation.
//!
//! Each row whose dying process wrote instants runs twice: with that process's clock correct,
//! and with it 2 h fast (issue 14: no replica's clock may keep a key window open, or a lease
//! alive, longer). The database lives in a private cluster whose clock `advance` moves with the
//! app's and the simulator's, so the dead process's instants are judged against one world time
//! whichever clock wrote them.

use std::time::Duration;

use chargeguard::clock::Clock;
use chargeguard::domain::AttemptStatus;
use chargeguard::grpc::proto::{AttemptStatus as ProtoStatus, ChargeOutcome};

use super::child::{ChildProcess, ChildSpec, ChildSweep};
use super::{
    advance, assert_settled, creates_with_key, minutes, seed_due_rows, stored, sweep_until_idle,
};
use crate::support::faketime::ClockOffset;
use crate::support::{TestApp, attempt_request as attempt, charge_request, outcome_of, refund_request, status_of};

/// The dying process's clock in the skewed rows: 2 h fast.
const FAST_CHILD_CLOCK: ClockOffset = ClockOffset::minutes(120);
/// Past the provider's 24 h key retention, yet under 23 h (the safe window) to a clock 2 h fast:
/// the jump at which a window counted by the dead process's clock would still look open.
const PAST_THE_PROVIDER_RETENTION: Duration = Duration::from_secs(1_470 * 60);

/// Instantiates each listed `async fn name(child_clock: ClockOffset)` as
/// `crash::child_clock_correct::name` and `crash::child_clock_fast::name`; a test attribute
/// written before a name replaces the default `#[tokio::test]`.
macro_rules! with_child_clocks {
    ($($(#[$attribute:meta])? $name:ident),+ $(,)?) => {
        mod child_clock_correct {
            $( with_child_clocks!(@test NONE, [$($attribute)?], $name); )+
        }
        mod child_clock_fast {
            $( with_child_clocks!(@test FAST, [$($attribute)?], $name); )+
        }
    };
    (@test $clock:ident, [], $name:ident) => {
        with_child_clocks!(@test $clock, [tokio::test], $name);
    };
    (@test NONE, [$attribute:meta], $name:ident) => {
        #[$attribute]
        async fn $name() {
            super::$name($crate::support::faketime::ClockOffset::NONE).await
        }
    };
    (@test FAST, [$attribute:meta], $name:ident) => {
        #[$attribute]
        async fn $name() {
            super::$name(super::FAST_CHILD_CLOCK).await
        }
    };
}

/// Runs `Charge` for `operation` in a child that stops at `failpoint` on the way.
async fn crash_during_charge(app: &TestApp, failpoint: &str, operation: &str, clock: ClockOffset) {
    let spec = ChildSpec { clock, ..ChildSpec::crashing_at(failpoint) };
    let child = ChildProcess::serve(app, spec).await;
    let lost = child.charge(charge_request(operation)).await;
    assert!(lost.is_err(), "the caller never hears from a process that died: {lost:?}");
    child.expect_crash().await;
}

// Nothing is written before this crash point, so no clock of the dead process can matter.
#[tokio::test]
async fn crash_before_the_pending_commit_leaves_nothing_and_the_retry_charges_once() {
    let app = TestApp::spawn_on_fake_clock().await;
    crash_during_charge(&app, "charge.before_pending_commit", "crash-1", ClockOffset::NONE).await;
    assert_eq!(app.attempt_rows().await, 0, "nothing was recorded");
    assert!(app.sim().requests().await.unwrap().is_empty(), "nothing was sent");
    assert_eq!(app.orchestrator.try_sweep_once().await.unwrap().claimed, 0, "nothing to recover");

    let retry = app.charge(charge_request("crash-1")).await.unwrap();
    assert_eq!(outcome_of(&retry), ChargeOutcome::Applied, "the retry inserts it and proceeds");
    assert_settled(&app, &["crash-1"]).await;
    assert_eq!(app.sim().ledger().await.unwrap().payment_intents.len(), 1);
}

async fn crash_after_the_pending_commit_is_finished_by_redelivery_or_by_the_sweep(
    child_clock: ClockOffset,
) {
    let app = TestApp::spawn_on_fake_clock().await;
    for operation in ["crash-2-redelivered", "crash-2-swept"] {
        crash_during_charge(&app, "charge.after_pending_commit", operation, child_clock).await;
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

async fn crash_after_the_provider_charged_is_adopted_by_redelivery_or_by_the_sweep(
    child_clock: ClockOffset,
) {
    let app = TestApp::spawn_on_fake_clock().await;
    let operations = ["crash-3-redelivered", "crash-3-swept"];
    for operation in operations {
        crash_during_charge(&app, "round.after_provider_call", operation, child_clock).await;
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

async fn crash_after_the_provider_charged_past_the_window_is_found_by_metadata(
    child_clock: ClockOffset,
) {
    let app = TestApp::spawn_on_fake_clock().await;
    crash_during_charge(&app, "round.after_provider_call", "crash-3-late", child_clock).await;
    let key = stored(&app, "crash-3-late").await.idempotency_key;
    let jumped_at = advance(&app, PAST_THE_PROVIDER_RETENTION).await;

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

async fn crash_after_the_result_is_recorded_answers_the_duplicate_from_the_record(
    child_clock: ClockOffset,
) {
    let app = TestApp::spawn_on_fake_clock().await;
    crash_during_charge(&app, "charge.after_record", "crash-4", child_clock).await;
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

async fn a_sweeper_that_dies_mid_batch_leaves_its_rows_to_others_after_their_leases(
    child_clock: ClockOffset,
) {
    let app = TestApp::spawn_on_fake_clock().await;
    let seeded = seed_due_rows(&app, "crash-5", 10).await;
    // The scheduled sweep inside `serve` picks the rows up and the process dies after the
    // first row it finishes, with others in flight.
    let spec = ChildSpec {
        sweep: ChildSweep::EverySecond { batch_max: 10, concurrency_max: 4 },
        clock: child_clock,
        ..ChildSpec::crashing_at("sweep.mid_batch")
    };
    ChildProcess::serve_unattended(&app, spec).expect_crash().await;

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

// Refunds: the same rows, for a refund of a succeeded charge (issue 15). Each ends with exactly
// one provider refund per refund operation, counted in the simulator's ledger.

/// Refunds 400 of `charge_operation` as `operation` in a child that stops at `failpoint`.
async fn crash_during_refund(
    app: &TestApp,
    failpoint: &str,
    operation: &str,
    charge_operation: &str,
    clock: ClockOffset,
) {
    let spec = ChildSpec { clock, ..ChildSpec::crashing_at(failpoint) };
    let child = ChildProcess::serve(app, spec).await;
    let lost = child.refund(refund_request(operation, charge_operation, Some(400))).await;
    assert!(lost.is_err(), "the caller never hears from a process that died: {lost:?}");
    child.expect_crash().await;
}

fn refund_outcome(response: &chargeguard::grpc::proto::RefundResponse) -> ChargeOutcome {
    ChargeOutcome::try_from(response.outcome).unwrap()
}

/// Each refund operation is succeeded with exactly one provider refund, the one it adopted.
async fn assert_refunds_settled(app: &TestApp, operations: &[&str]) {
    let ledger = app.sim().ledger().await.unwrap();
    for operation in operations {
        let attempt = stored(app, operation).await;
        assert_eq!(attempt.status, AttemptStatus::Succeeded, "{operation}");
        let id = attempt.id.to_string();
        let refunds: Vec<_> = ledger
            .refunds
            .iter()
            .filter(|refund| refund.metadata.get("chargeguard_attempt_id") == Some(&id))
            .collect();
        assert_eq!(refunds.len(), 1, "{operation}: one refund at the provider");
        assert_eq!(attempt.provider_payment_id.as_deref(), Some(refunds[0].id.as_str()));
    }
}

#[tokio::test]
async fn refund_crash_before_the_pending_commit_leaves_nothing_and_the_retry_refunds_once() {
    let app = TestApp::spawn_on_fake_clock().await;
    app.charge(charge_request("refund-crash-1:charge")).await.unwrap();
    // Nothing is written before this crash point, so no clock of the dead process can matter.
    crash_during_refund(&app, "refund.before_pending_commit", "refund-crash-1", "refund-crash-1:charge", ClockOffset::NONE)
        .await;
    assert_eq!(app.attempt_rows().await, 1, "only the charge was recorded");
    assert!(app.refund_creates().await.is_empty(), "nothing was sent");
    assert_eq!(app.orchestrator.try_sweep_once().await.unwrap().claimed, 0, "nothing to recover");

    let retry = app.refund(refund_request("refund-crash-1", "refund-crash-1:charge", Some(400))).await.unwrap();
    assert_eq!(refund_outcome(&retry), ChargeOutcome::Applied);
    assert_refunds_settled(&app, &["refund-crash-1"]).await;
    assert_eq!(app.sim().ledger().await.unwrap().refunds.len(), 1);
}

async fn refund_crash_after_the_pending_commit_is_finished_by_redelivery_or_by_the_sweep(child_clock: ClockOffset) {
    let app = TestApp::spawn_on_fake_clock().await;
    app.charge(charge_request("refund-crash-2:charge")).await.unwrap();
    let operations = ["refund-crash-2-redelivered", "refund-crash-2-swept"];
    for operation in operations {
        crash_during_refund(&app, "refund.after_pending_commit", operation, "refund-crash-2:charge", child_clock).await;
        let attempt = stored(&app, operation).await;
        assert_eq!(attempt.status, AttemptStatus::Pending);
        assert!(attempt.lease.is_some(), "the dead process still holds its lease");
    }
    assert!(app.refund_creates().await.is_empty(), "the provider was never called");
    // The pending refunds hold their amounts: 800 of 1000 are taken.
    let error = app.refund(refund_request("refund-crash-2-third", "refund-crash-2:charge", Some(201))).await.unwrap_err();
    assert_eq!(crate::support::error_code(&error), "refund_exceeds_charge");
    advance(&app, minutes(2)).await;

    let redelivered = app.refund(refund_request(operations[0], "refund-crash-2:charge", Some(400))).await.unwrap();
    assert_eq!(refund_outcome(&redelivered), ChargeOutcome::Reconciled);
    let swept = app.orchestrator.try_sweep_once().await.unwrap();
    assert_eq!((swept.claimed, swept.succeeded), (1, 1), "{swept}");
    assert_refunds_settled(&app, &operations).await;
    assert_eq!(app.sim().ledger().await.unwrap().refunds.len(), 2);
    assert_eq!(app.refund_creates().await.len(), 2, "inside the window: each key once");
}

async fn refund_crash_after_the_provider_refunded_is_adopted_by_redelivery_or_by_the_sweep(child_clock: ClockOffset) {
    let app = TestApp::spawn_on_fake_clock().await;
    app.charge(charge_request("refund-crash-3:charge")).await.unwrap();
    let operations = ["refund-crash-3-redelivered", "refund-crash-3-swept"];
    for operation in operations {
        crash_during_refund(&app, "round.after_provider_call", operation, "refund-crash-3:charge", child_clock).await;
        let attempt = stored(&app, operation).await;
        assert_eq!((attempt.status, attempt.provider_payment_id), (AttemptStatus::Pending, None), "never recorded");
    }
    assert_eq!(app.sim().ledger().await.unwrap().refunds.len(), 2, "the provider refunded each");
    advance(&app, minutes(2)).await;

    let redelivered = app.refund(refund_request(operations[0], "refund-crash-3:charge", Some(400))).await.unwrap();
    assert_eq!(refund_outcome(&redelivered), ChargeOutcome::Reconciled);
    let swept = app.orchestrator.try_sweep_once().await.unwrap();
    assert_eq!((swept.claimed, swept.succeeded), (1, 1), "{swept}");
    let replays = app.refund_creates().await.into_iter().filter(|r| r.replayed).count();
    assert_eq!(replays, 2, "both re-sends were answered from the provider's key store");
    assert_refunds_settled(&app, &operations).await;
    assert_eq!(app.sim().ledger().await.unwrap().refunds.len(), 2);
}

async fn refund_crash_after_the_result_is_recorded_answers_the_duplicate_from_the_record(child_clock: ClockOffset) {
    let app = TestApp::spawn_on_fake_clock().await;
    app.charge(charge_request("refund-crash-4:charge")).await.unwrap();
    crash_during_refund(&app, "refund.after_record", "refund-crash-4", "refund-crash-4:charge", child_clock).await;
    let recorded = stored(&app, "refund-crash-4").await;
    assert_eq!(recorded.status, AttemptStatus::Succeeded);

    let duplicate = app.refund(refund_request("refund-crash-4", "refund-crash-4:charge", Some(400))).await.unwrap();
    assert_eq!(refund_outcome(&duplicate), ChargeOutcome::Duplicate);
    assert_eq!(Some(duplicate.attempt.unwrap().provider_payment_id), recorded.provider_payment_id);
    advance(&app, minutes(2)).await;
    assert_eq!(app.orchestrator.try_sweep_once().await.unwrap().claimed, 0, "a terminal row is not swept");
    assert_eq!(app.refund_creates().await.len(), 1, "nothing was sent again");
    assert_refunds_settled(&app, &["refund-crash-4"]).await;
}

with_child_clocks!(
    crash_after_the_pending_commit_is_finished_by_redelivery_or_by_the_sweep,
    crash_after_the_provider_charged_is_adopted_by_redelivery_or_by_the_sweep,
    crash_after_the_provider_charged_past_the_window_is_found_by_metadata,
    crash_after_the_result_is_recorded_answers_the_duplicate_from_the_record,
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_sweeper_that_dies_mid_batch_leaves_its_rows_to_others_after_their_leases,
);

// Issue 16: attempt n + 1 of an operation. The rows below cross the boundary between two
// attempts; whatever dies where, the provider ends with at most one succeeded object for the
// operation.

async fn succeeded_objects(app: &TestApp) -> usize {
    let ledger = app.sim().ledger().await.unwrap();
    ledger.payment_intents.iter().filter(|intent| intent.status == "succeeded").count()
}

async fn confirms_with_key(app: &TestApp, key: &str) -> usize {
    let log = app.sim().requests().await.unwrap();
    log.iter().filter(|r| r.path.ends_with("/confirm") && r.idempotency_key.as_deref() == Some(key)).count()
}

async fn crash_between_attempt_1s_decline_and_attempt_2s_pending_row_then_attempt_2_charges_once(
    child_clock: ClockOffset,
) {
    let app = TestApp::spawn_on_fake_clock().await;
    // The process that recorded attempt 1's decline dies before its caller hears.
    let spec = ChildSpec { clock: child_clock, ..ChildSpec::crashing_at("charge.after_record") };
    let child = ChildProcess::serve(&app, spec).await;
    assert!(child.charge(attempt("crash-again-1", 1, "pm_card_chargeDeclined")).await.is_err());
    child.expect_crash().await;
    // Another operation: the process handling attempt 2 dies before it writes anything.
    let declined = app.charge(attempt("crash-again-2", 1, "pm_card_chargeDeclined")).await.unwrap();
    assert_eq!(status_of(&declined), ProtoStatus::Failed);
    let child = ChildProcess::serve(&app, ChildSpec::crashing_at("charge.before_pending_commit")).await;
    assert!(child.charge(attempt("crash-again-2", 2, "pm_card_visa")).await.is_err());
    child.expect_crash().await;
    assert_eq!(app.attempt_rows().await, 2, "attempt 2 was never written");

    for operation in ["crash-again-1", "crash-again-2"] {
        let first = stored(&app, operation).await;
        assert_eq!((first.generation, first.status), (0, AttemptStatus::Failed));
        // The caller, told nothing, sends attempt 1 again, then attempt 2.
        let again = app.charge(attempt(operation, 1, "pm_card_chargeDeclined")).await.unwrap();
        assert_eq!(outcome_of(&again), ChargeOutcome::Duplicate);
        let second = app.charge(attempt(operation, 2, "pm_card_visa")).await.unwrap();
        assert_eq!(outcome_of(&second), ChargeOutcome::Applied);
        assert_eq!(status_of(&second), ProtoStatus::Succeeded);
        let key = second.attempt.unwrap().idempotency_key;
        assert_eq!(confirms_with_key(&app, &key).await, 1);
    }
    assert_eq!(app.sim().ledger().await.unwrap().payment_intents.len(), 2, "one intent per operation");
    assert_eq!(succeeded_objects(&app).await, 2, "one succeeded object per operation");
}

#[tokio::test]
async fn crash_after_canceling_attempt_1s_intent_before_recording_it_then_attempt_2_creates_once() {
    let app = TestApp::spawn_on_fake_clock().await;
    let first = app.charge(attempt("crash-again-3", 1, "pm_card_chargeDeclined")).await.unwrap();
    let first = first.attempt.unwrap();
    let mut changed = attempt("crash-again-3", 2, "pm_card_visa");
    changed.amount_minor = 2_000;
    let child = ChildProcess::serve(&app, ChildSpec::crashing_at("attempts.after_previous_cancel")).await;
    assert!(child.charge(changed.clone()).await.is_err());
    child.expect_crash().await;
    let ledger = app.sim().ledger().await.unwrap();
    assert_eq!(ledger.payment_intents[0].status, "canceled", "the cancel landed");
    let recorded = stored(&app, "crash-again-3").await;
    assert_eq!(recorded.generation, 0, "attempt 2 was never written");
    assert_eq!(recorded.provider_status.as_deref(), Some("requires_payment_method"), "nor the cancel recorded");

    // The retry cancels again (refused: already canceled; the intent is read), records it, and
    // creates attempt 2's own intent.
    let second = app.charge(changed).await.unwrap();
    assert_eq!(status_of(&second), ProtoStatus::Succeeded);
    let second = second.attempt.unwrap();
    assert_ne!(second.provider_payment_id, first.provider_payment_id);
    let ledger = app.sim().ledger().await.unwrap();
    assert_eq!(ledger.payment_intents.len(), 2);
    assert_eq!(succeeded_objects(&app).await, 1);
    let creates = app.creates().await;
    assert_eq!(creates.len(), 2, "attempt 1's and attempt 2's, once each");
}

async fn crash_after_attempt_2s_pending_row_is_finished_by_redelivery_or_by_the_sweep(child_clock: ClockOffset) {
    let app = TestApp::spawn_on_fake_clock().await;
    let operations = ["crash-again-4-redelivered", "crash-again-4-swept"];
    for operation in operations {
        app.charge(attempt(operation, 1, "pm_card_chargeDeclined")).await.unwrap();
        let spec = ChildSpec { clock: child_clock, ..ChildSpec::crashing_at("charge.after_pending_commit") };
        let child = ChildProcess::serve(&app, spec).await;
        assert!(child.charge(attempt(operation, 2, "pm_card_visa")).await.is_err());
        child.expect_crash().await;
        let second = stored(&app, operation).await;
        assert_eq!((second.generation, second.status), (1, AttemptStatus::Pending));
        assert!(second.confirms_payment_id.is_some(), "attempt 2 confirms attempt 1's intent");
    }
    advance(&app, minutes(2)).await;
    let redelivered = app.charge(attempt(operations[0], 2, "pm_card_visa")).await.unwrap();
    assert_eq!(outcome_of(&redelivered), ChargeOutcome::Reconciled);
    assert_eq!(status_of(&redelivered), ProtoStatus::Succeeded);
    let swept = app.orchestrator.try_sweep_once().await.unwrap();
    assert_eq!((swept.claimed, swept.succeeded), (1, 1), "{swept}");
    for operation in operations {
        let second = stored(&app, operation).await;
        assert_eq!(second.status, AttemptStatus::Succeeded);
        assert_eq!(confirms_with_key(&app, second.idempotency_key.as_str()).await, 1, "the same key, once");
    }
    assert_eq!(succeeded_objects(&app).await, 2, "one succeeded object per operation");
    assert_eq!(app.creates().await.len(), 2, "no intent beside the declined ones");
}

async fn crash_after_attempt_2s_confirm_charged_past_the_window_reads_the_intent_and_adopts_it(
    child_clock: ClockOffset,
) {
    let app = TestApp::spawn_on_fake_clock().await;
    app.charge(attempt("crash-again-5", 1, "pm_card_chargeDeclined")).await.unwrap();
    let spec = ChildSpec { clock: child_clock, ..ChildSpec::crashing_at("round.after_provider_call") };
    let child = ChildProcess::serve(&app, spec).await;
    assert!(child.charge(attempt("crash-again-5", 2, "pm_card_visa")).await.is_err());
    child.expect_crash().await;
    let second = stored(&app, "crash-again-5").await;
    assert_eq!((second.generation, second.status), (1, AttemptStatus::Pending));
    assert_eq!(succeeded_objects(&app).await, 1, "the confirm charged");
    let jumped_at = advance(&app, PAST_THE_PROVIDER_RETENTION).await;

    let swept = sweep_until_idle(&app).await;
    assert_eq!((swept.claimed, swept.succeeded), (1, 1), "{swept}");
    let after_jump: Vec<_> =
        app.sim().requests().await.unwrap().into_iter().filter(|r| r.sim_time >= jumped_at).collect();
    assert!(after_jump.iter().all(|r| r.method == "GET"), "nothing sent, only read: {after_jump:#?}");
    assert!(
        after_jump.iter().any(|r| r.endpoint.as_deref() == Some("retrieve_payment_intent")),
        "the intent is read by its known id: {after_jump:#?}"
    );
    let adopted = stored(&app, "crash-again-5").await;
    assert_eq!(adopted.status, AttemptStatus::Succeeded);
    assert_eq!(adopted.provider_payment_id, adopted.confirms_payment_id);
    assert_eq!(succeeded_objects(&app).await, 1);
}

// The rows that write before the process dies, under a correct and a fast clock of the dead
// process (libfaketime), as the charge rows above.
mod refunds_and_attempts {
    use super::*;

    with_child_clocks!(
        refund_crash_after_the_pending_commit_is_finished_by_redelivery_or_by_the_sweep,
        refund_crash_after_the_provider_refunded_is_adopted_by_redelivery_or_by_the_sweep,
        refund_crash_after_the_result_is_recorded_answers_the_duplicate_from_the_record,
        crash_between_attempt_1s_decline_and_attempt_2s_pending_row_then_attempt_2_charges_once,
        crash_after_attempt_2s_pending_row_is_finished_by_redelivery_or_by_the_sweep,
        crash_after_attempt_2s_confirm_charged_past_the_window_reads_the_intent_and_adopts_it,
    );
}
