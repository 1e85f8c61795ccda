//! A provider outage during a sweep (SEMANTICS.md invariant 6): rows back off, nothing that may
//! have been charged is marked failed, and a row that never gets a usable answer is flagged for
//! a person instead of being retried forever.

use chargeguard::clock::Clock;
use chargeguard::domain::{Attempt, AttemptStatus};
use chargeguard::simulator::{Endpoint, FaultKind, FaultSpec, FaultTarget};
use tonic::Code;

use super::{
    advance, assert_settled, hours, leave_pending, metrics_text, minutes, shown, stored,
    sweep_until_idle,
};
use crate::support::{Backend, TestApp, charge_request, error_code, on_both_backends};

/// Every request to `target` fails the same way until the faults are cleared.
async fn outage(app: &TestApp, target: impl Into<FaultTarget>, kind: FaultKind) {
    app.sim().clear_faults().await.unwrap();
    app.sim().set_fault(target, FaultSpec::probability(kind, 1.0)).await.unwrap();
}

/// The row stayed unfinished, remembers why, and is not due again before its backoff.
fn assert_backing_off(app: &TestApp, attempt: &Attempt) -> chrono::Duration {
    assert_eq!(
        attempt.status,
        AttemptStatus::Pending,
        "{:?} may have been charged",
        attempt.operation_key
    );
    assert!(attempt.failure.is_none());
    assert!(attempt.last_error.is_some(), "the error is kept for operators");
    let wait = attempt.next_check_at - app.clock.now();
    assert!(wait > chrono::Duration::zero(), "the row backs off");
    wait
}

async fn an_outage_inside_the_window_backs_off_and_adopts_later(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    let operations = ["outage-never", "outage-charged"];
    leave_pending(&app, operations[0], FaultKind::FailBeforeApply).await;
    leave_pending(&app, operations[1], FaultKind::ApplyThenFail).await;
    advance(&app, minutes(2)).await;

    // Down altogether: every row stays as it was and waits.
    outage(&app, FaultTarget::All, FaultKind::FailBeforeApply).await;
    let down = app.orchestrator.try_sweep_once().await.unwrap();
    assert_eq!((down.claimed, down.unfinished, down.failed), (2, 2, 0), "{down}");
    for operation in operations {
        assert_backing_off(&app, &stored(&app, operation).await);
    }
    assert_eq!(app.orchestrator.try_sweep_once().await.unwrap().claimed, 0, "not hammered");

    // Answers lost on the way back: the provider replays the charged row's saved answer; the
    // other row's re-send is charged now, and its answer is lost.
    outage(&app, Endpoint::CreatePaymentIntent, FaultKind::ApplyThenDrop).await;
    advance(&app, minutes(10)).await;
    let lossy = app.orchestrator.try_sweep_once().await.unwrap();
    assert_eq!(
        (lossy.claimed, lossy.succeeded, lossy.unfinished, lossy.failed),
        (2, 1, 1, 0),
        "{lossy}"
    );
    assert_backing_off(&app, &stored(&app, operations[0]).await);
    assert_eq!(app.sim().ledger().await.unwrap().payment_intents.len(), 2, "both are charged now");

    app.sim().clear_faults().await.unwrap();
    advance(&app, minutes(10)).await;
    let after = sweep_until_idle(&app).await;
    assert_eq!((after.claimed, after.succeeded), (1, 1), "{after}");
    assert_settled(&app, &operations).await;
    assert_eq!(app.sim().ledger().await.unwrap().payment_intents.len(), 2);
}

async fn an_outage_past_the_window_never_expires_what_it_cannot_see(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    let operations = ["gone-never", "gone-charged"];
    leave_pending(&app, operations[0], FaultKind::FailBeforeApply).await;
    leave_pending(&app, operations[1], FaultKind::ApplyThenFail).await;
    advance(&app, hours(25)).await;
    let creates_before = app.creates().await.len();

    // Search answers but the list (which does not lag) fails: "not found by search" is no proof.
    outage(&app, Endpoint::ListPaymentIntents, FaultKind::FailBeforeApply).await;
    let first = app.orchestrator.try_sweep_once().await.unwrap();
    assert_eq!((first.claimed, first.unfinished, first.failed), (2, 2, 0), "{first}");
    let first_wait = assert_backing_off(&app, &stored(&app, operations[0]).await);
    assert_backing_off(&app, &stored(&app, operations[1]).await);
    assert_eq!(app.orchestrator.try_sweep_once().await.unwrap().claimed, 0, "not hammered");

    // Then search fails too; the next wait is longer.
    outage(&app, Endpoint::SearchPaymentIntents, FaultKind::FailBeforeApply).await;
    advance(&app, minutes(10)).await;
    let second = app.orchestrator.try_sweep_once().await.unwrap();
    assert_eq!((second.claimed, second.unfinished, second.failed), (2, 2, 0), "{second}");
    let second_wait = assert_backing_off(&app, &stored(&app, operations[0]).await);
    assert!(second_wait > first_wait, "exponential backoff: {first_wait} then {second_wait}");
    assert_eq!(app.creates().await.len(), creates_before, "no create past the window");

    app.sim().clear_faults().await.unwrap();
    advance(&app, minutes(10)).await;
    let after = sweep_until_idle(&app).await;
    assert_eq!((after.succeeded, after.failed), (1, 1), "{after}");
    assert_eq!(stored(&app, operations[0]).await.failure.unwrap().code, "expired");
    assert_settled(&app, &operations).await;
    assert_eq!(app.sim().ledger().await.unwrap().payment_intents.len(), 1);
}

async fn a_row_out_of_checks_is_flagged_for_review_and_never_sent_again(backend: Backend) {
    let app = TestApp::spawn_backend_with(backend, |config| config.sweep.check_count_max = 3).await;
    leave_pending(&app, "stuck-1", FaultKind::FailBeforeApply).await;
    outage(&app, FaultTarget::All, FaultKind::FailBeforeApply).await;
    // The charge made check 1; the sweep makes checks 2 and 3.
    for _ in 0..2 {
        advance(&app, minutes(10)).await;
        let pass = app.orchestrator.try_sweep_once().await.unwrap();
        assert_eq!((pass.claimed, pass.unfinished, pass.flagged), (1, 1, 0), "{pass}");
    }
    let requests_before = app.sim().requests().await.unwrap().len();
    advance(&app, minutes(10)).await;
    let flagging = app.orchestrator.try_sweep_once().await.unwrap();
    assert_eq!((flagging.claimed, flagging.unfinished, flagging.flagged), (1, 1, 1), "{flagging}");

    let flagged = stored(&app, "stuck-1").await;
    assert_eq!(flagged.status, AttemptStatus::Pending, "an outage never fails what may be charged");
    let reason = flagged.review_reason.clone().unwrap();
    assert!(reason.starts_with("unresolved after 3 provider checks"), "{reason}");
    let shown = shown(&app, "stuck-1").await;
    assert!(shown.needs_review);
    assert_eq!(shown.review_reason, reason);
    let redelivered = app.charge(charge_request("stuck-1")).await.unwrap_err();
    assert_eq!(
        (redelivered.code(), error_code(&redelivered).as_str()),
        (Code::FailedPrecondition, "needs_review")
    );
    let metrics = metrics_text(&app).await;
    for metric in [
        "chargeguard_sweep_checks_exhausted_total",
        "chargeguard_sweep_rows_claimed_total",
        "chargeguard_sweep_rows_total{result=\"flagged\"}",
        "chargeguard_unfinished_oldest_age_seconds",
        "chargeguard_sweep_pass_seconds",
    ] {
        assert!(metrics.contains(metric), "{metric} in {metrics}");
    }

    // Parked until the reminder; then looked at (and logged) again, still without a call.
    advance(&app, hours(2)).await;
    assert_eq!(app.orchestrator.try_sweep_once().await.unwrap().claimed, 0);
    app.sim().clear_faults().await.unwrap();
    advance(&app, hours(24)).await;
    let reminder = app.orchestrator.try_sweep_once().await.unwrap();
    assert_eq!((reminder.claimed, reminder.flagged), (1, 1), "{reminder}");
    assert_eq!(app.sim().requests().await.unwrap().len(), requests_before, "never sent again");
    let parked = stored(&app, "stuck-1").await;
    assert_eq!(parked.status, AttemptStatus::Pending);
    assert_eq!(parked.review_reason.as_deref(), Some(reason.as_str()));
}

// Single-process recovery: the same tests on both stores.
on_both_backends!(
    an_outage_inside_the_window_backs_off_and_adopts_later,
    an_outage_past_the_window_never_expires_what_it_cannot_see,
    a_row_out_of_checks_is_flagged_for_review_and_never_sent_again,
);
