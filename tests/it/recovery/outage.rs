//! A provider outage during a sweep (SEMANTICS.md invariants 6 and 11): rows back off, nothing
//! that may have been charged is marked failed, and however long the outage lasts the row is
//! completed by the machine once the provider answers again; only what the machine cannot decide
//! is left to a person, who re-runs it with `attempt recheck`.

use chargeguard::clock::Clock;
use chargeguard::domain::{Attempt, AttemptStatus};
use chargeguard::simulator::{Endpoint, FaultKind, FaultSpec, FaultTarget};
use tonic::Code;

use super::{
    advance, assert_settled, hours, leave_pending, minutes, stored,
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

    // Search answers but the list (which does not lag) fails: what search finds is adopted,
    // but "not found by search" is no proof.
    outage(&app, Endpoint::ListPaymentIntents, FaultKind::FailBeforeApply).await;
    let first = app.orchestrator.try_sweep_once().await.unwrap();
    assert_eq!((first.claimed, first.succeeded, first.unfinished, first.failed), (2, 1, 1, 0), "{first}");
    let first_wait = assert_backing_off(&app, &stored(&app, operations[0]).await);
    assert_eq!(stored(&app, operations[1]).await.status, AttemptStatus::Succeeded, "found by search");
    assert_eq!(app.orchestrator.try_sweep_once().await.unwrap().claimed, 0, "not hammered");

    // Then search fails too; the next wait is longer.
    outage(&app, Endpoint::SearchPaymentIntents, FaultKind::FailBeforeApply).await;
    advance(&app, minutes(10)).await;
    let second = app.orchestrator.try_sweep_once().await.unwrap();
    assert_eq!((second.claimed, second.unfinished, second.failed), (1, 1, 0), "{second}");
    let second_wait = assert_backing_off(&app, &stored(&app, operations[0]).await);
    assert!(second_wait > first_wait, "exponential backoff: {first_wait} then {second_wait}");
    assert_eq!(app.creates().await.len(), creates_before, "no create past the window");

    // Search down, list answering: the list finds nothing, but search has not answered, so the
    // attempt is not expired yet.
    outage(&app, Endpoint::SearchPaymentIntents, FaultKind::FailBeforeApply).await;
    advance(&app, hours(2)).await;
    let list_only = app.orchestrator.try_sweep_once().await.unwrap();
    assert_eq!((list_only.claimed, list_only.unfinished, list_only.failed), (1, 1, 0), "{list_only}");

    app.sim().clear_faults().await.unwrap();
    advance(&app, hours(2)).await;
    let after = sweep_until_idle(&app).await;
    assert_eq!((after.succeeded, after.failed), (0, 1), "{after}");
    assert_eq!(stored(&app, operations[0]).await.failure.unwrap().code, "expired");
    assert_settled(&app, &operations).await;
    assert_eq!(app.sim().ledger().await.unwrap().payment_intents.len(), 1);
}

/// Consumer redeliveries and sweep rounds made while the outage lasts.
const OUTAGE_ROUNDS: usize = 100;

async fn a_long_outage_never_parks_a_row_and_it_completes_by_itself(backend: Backend) {
    // A short backoff cap, so that the sweep half of the rounds fits well inside the window.
    let app = TestApp::spawn_backend_with(backend, |config| config.charge.recheck_backoff_max_ms = 60_000).await;
    leave_pending(&app, "long-outage", FaultKind::FailBeforeApply).await;
    outage(&app, FaultTarget::All, FaultKind::FailBeforeApply).await;
    for round in 0..OUTAGE_ROUNDS {
        if round % 2 == 0 {
            let redelivered = app.charge(charge_request("long-outage")).await.unwrap_err();
            assert_eq!(
                (redelivered.code(), error_code(&redelivered).as_str()),
                (Code::Unavailable, "outcome_unknown"),
                "round {round}: a retry is always safe, never a refusal"
            );
        } else {
            advance(&app, minutes(2)).await;
            let pass = app.orchestrator.try_sweep_once().await.unwrap();
            assert_eq!((pass.claimed, pass.unfinished, pass.flagged), (1, 1, 0), "round {round}: {pass}");
        }
    }
    let during = stored(&app, "long-outage").await;
    assert_backing_off(&app, &during);
    assert!(during.check_count as usize > OUTAGE_ROUNDS, "{} rounds", during.check_count);
    assert_eq!(during.review_reason, None, "transient trouble never needs a person");

    app.sim().clear_faults().await.unwrap();
    advance(&app, minutes(2)).await;
    let recovered = app.orchestrator.try_sweep_once().await.unwrap();
    assert_eq!((recovered.claimed, recovered.succeeded, recovered.flagged), (1, 1, 0), "{recovered}");
    let done = stored(&app, "long-outage").await;
    assert_eq!(done.status, AttemptStatus::Succeeded);
    assert_eq!(done.review_reason, None);
    assert_eq!(app.sim().ledger().await.unwrap().payment_intents.len(), 1, "one intent");
    assert_settled(&app, &["long-outage"]).await;
    let metrics = crate::support::metrics_text(app.http_addr).await;
    for metric in [
        "chargeguard_sweep_rows_claimed_total",
        "chargeguard_unfinished_oldest_age_seconds",
        "chargeguard_sweep_pass_seconds",
    ] {
        assert!(metrics.contains(metric), "{metric} in {metrics}");
    }
}

/// Flags `pending` as a round does when the provider reports a key conflict: through the
/// store, under a lease, with the reason a round writes.
async fn flag_for_review(app: &TestApp, pending: &Attempt) {
    let store = app.orchestrator.store().clone();
    let owner = chargeguard::domain::LeaseOwner::from_uuid(uuid::Uuid::new_v4());
    let lease = chargeguard::store::LeaseRequest {
        owner,
        duration: chrono::Duration::seconds(8),
        key_window_safe: chrono::Duration::hours(23),
        time: chargeguard::store::CallerTime::of(app.clock.as_ref()),
    };
    store.acquire_lease(pending.id, lease).await.unwrap().expect("the row is free");
    let flag = chargeguard::store::RoundResult {
        review_reason: Some("the provider reports an idempotency key conflict: test".into()),
        ..chargeguard::store::RoundResult::unchanged(
            AttemptStatus::Pending,
            1,
            chrono::Duration::zero(),
            Some("idempotency key conflict".into()),
        )
    };
    store.finish_round(pending.id, owner, &flag, lease.time).await.unwrap().unwrap();
}

async fn a_flagged_row_waits_for_an_operator_and_a_recheck_completes_it(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    let pending = leave_pending(&app, "flagged-1", FaultKind::FailBeforeApply).await;
    advance(&app, minutes(1)).await;
    flag_for_review(&app, &pending).await;

    let requests_before = app.sim().requests().await.unwrap().len();
    let pass = app.orchestrator.try_sweep_once().await.unwrap();
    assert_eq!((pass.claimed, pass.flagged), (1, 1), "{pass}");
    let redelivered = app.charge(charge_request("flagged-1")).await.unwrap_err();
    assert_eq!(
        (redelivered.code(), error_code(&redelivered).as_str()),
        (Code::FailedPrecondition, "needs_review")
    );
    assert_eq!(app.sim().requests().await.unwrap().len(), requests_before, "never sent while flagged");

    let rechecked = app.orchestrator.recheck(pending.id).await.unwrap();
    assert_eq!(rechecked.attempt.status, AttemptStatus::Succeeded);
    let done = stored(&app, "flagged-1").await;
    assert_eq!(done.review_reason, None);
    assert!(done.review_history.unwrap().contains("idempotency key conflict"), "the reason is kept");
    assert_eq!(app.sim().ledger().await.unwrap().payment_intents.len(), 1);
    let again = app.orchestrator.recheck(pending.id).await.unwrap_err();
    assert!(again.to_string().contains("not flagged"), "{again}");
}

/// Runs `chargeguard attempt recheck ID` as an operator does: the built binary, configured like
/// the service (by environment) to use the app's database and simulator.
async fn recheck_command(app: &TestApp, id: &str) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let mut command = crate::ops::process::command(dir.path());
    command
        .args(["attempt", "recheck", id])
        .env("CHARGEGUARD_PROVIDER__API_KEY", crate::support::SIM_API_KEY)
        .env("CHARGEGUARD_PROVIDER__BASE_URL", app.simulator.base_url());
    match app.database.sqlite_path() {
        Some(path) => command.env("CHARGEGUARD_DATABASE__SQLITE_PATH", path),
        None => command.env("CHARGEGUARD_DATABASE__URL", &app.database.url),
    };
    command.output().await.unwrap()
}

async fn an_operator_rechecks_a_flagged_row_with_the_chargeguard_command(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    let pending = leave_pending(&app, "flagged-cli", FaultKind::FailBeforeApply).await;
    flag_for_review(&app, &pending).await;
    let id = pending.id.to_string();

    let rechecked = recheck_command(&app, &id).await;
    let (stdout, stderr) =
        (String::from_utf8_lossy(&rechecked.stdout), String::from_utf8_lossy(&rechecked.stderr));
    assert_eq!(rechecked.status.code(), Some(0), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(stdout.trim(), format!("attempt {id} is succeeded"));
    let done = stored(&app, "flagged-cli").await;
    assert_eq!(done.status, AttemptStatus::Succeeded);
    assert_eq!(done.review_reason, None);
    assert!(done.review_history.unwrap().contains("idempotency key conflict"), "the reason is kept");
    assert_settled(&app, &["flagged-cli"]).await;
    assert_eq!(app.sim().ledger().await.unwrap().payment_intents.len(), 1);

    // Not flagged (any more): refused, nothing sent.
    let requests_before = app.sim().requests().await.unwrap().len();
    let refused = recheck_command(&app, &id).await;
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(refused.stdout.is_empty());
    assert!(
        stderr.contains(&format!("recheck failed: attempt {id} is not flagged for review")),
        "{stderr}"
    );
    assert_eq!(app.sim().requests().await.unwrap().len(), requests_before, "nothing sent");
}

// The same tests on both stores (the recheck command shares the SQLite file with the app).
on_both_backends!(
    an_outage_inside_the_window_backs_off_and_adopts_later,
    an_outage_past_the_window_never_expires_what_it_cannot_see,
    a_long_outage_never_parks_a_row_and_it_completes_by_itself,
    a_flagged_row_waits_for_an_operator_and_a_recheck_completes_it,
    an_operator_rechecks_a_flagged_row_with_the_chargeguard_command,
);
