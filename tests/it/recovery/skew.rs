//! Replicas whose clocks disagree (issue 14, "Clocks"): no replica's clock may keep a key window
//! open, or a lease alive, longer than the world's. Each replica that drifts is a real
//! `chargeguard` process under libfaketime; the database lives in a private cluster whose clock
//! moves with the simulator's, so the provider and the database always agree and only the
//! replicas drift — except in the tests of a clock that jumps back, where the database's clock
//! (or one replica's) is set behind instants already written on the row. Everything is counted
//! at the provider: the simulator's request log and ledger.

use std::time::Duration;

use chargeguard::domain::Attempt;
use chargeguard::grpc::proto::{AttemptStatus as ProtoStatus, ChargeOutcome};
use chargeguard::simulator::{Endpoint, FaultKind, FaultSpec, RequestLogEntry};

use super::child::{ChildProcess, ChildSpec};
use super::{
    advance, assert_settled, expect_left_pending, fail_next_create, leave_pending, minutes, stored,
};
use crate::support::faketime::ClockOffset;
use crate::support::{TestApp, charge_request, error_code, outcome_of, status_of};
use tonic::Code;

/// A replica whose clock runs 2 h fast.
const FAST: ClockOffset = ClockOffset::minutes(120);
/// The world's jump: past the provider's 24 h key retention, yet under the 23 h safe window when
/// counted from a start 2 h late, or by a clock 2 h slow.
const JUMP_MINUTES: i64 = 1_470;
const JUMP: Duration = Duration::from_secs(JUMP_MINUTES as u64 * 60);
/// After the jump: a replica that reads the world's time, and one 2 h behind it.
const CORRECT_AFTER_THE_JUMP: ClockOffset = ClockOffset::minutes(JUMP_MINUTES);
const SLOW_AFTER_THE_JUMP: ClockOffset = ClockOffset::minutes(JUMP_MINUTES - 120);

/// How long the held round's create takes at the provider (the simulator's latency fault).
const HELD_CREATE_LATENCY_MS: u64 = 3_000;
/// The holder's provider call timeout: longer than the held create, so its round completes.
const HOLDER_CALL_TIMEOUT_MS: u64 = 10_000;
/// Bound on waiting for the holder's create to reach the provider (a child on 2 shared cores).
const ADMISSION_WAIT_MAX: Duration = Duration::from_secs(60);
const ADMISSION_POLL: Duration = Duration::from_millis(20);
/// Bound on the holder's whole call.
const HELD_ROUND_MAX: Duration = Duration::from_secs(60);

/// Past the jump the provider has forgotten `attempt`'s key, so it is never sent again: no
/// create at all reaches the provider, and it is asked by metadata instead.
async fn assert_never_sent_again(app: &TestApp, attempt: &Attempt, jumped_at: i64) {
    let key = attempt.idempotency_key.as_str();
    let creates: Vec<_> =
        app.creates().await.into_iter().filter(|r| r.sim_time >= jumped_at).collect();
    assert!(creates.is_empty(), "a create was sent after the provider forgot key {key}: {creates:?}");
    let log = app.sim().requests().await.unwrap();
    let looked_up = log.iter().filter(|r| r.sim_time >= jumped_at).any(|r| {
        matches!(r.endpoint.as_deref(), Some("search_payment_intents" | "list_payment_intents"))
    });
    assert!(looked_up, "past the window the provider is asked by metadata: {log:?}");
}

/// The provider holds exactly one intent, the operation's, succeeded, and the attempt is bound
/// to it.
async fn assert_adopted(app: &TestApp, operation: &str) {
    let attempt = stored(app, operation).await;
    let ledger = app.sim().ledger().await.unwrap();
    let id = attempt.id.to_string();
    let intents: Vec<_> =
        ledger.payment_intents_with_metadata("chargeguard_attempt_id", &id).collect();
    assert_eq!(intents.len(), 1, "one intent at the provider for {operation}: {intents:?}");
    assert_eq!(ledger.payment_intents.len(), 1, "no other charge at the provider");
    assert_eq!(intents[0].status, "succeeded");
    let shown = app.attempt_of(operation).await;
    assert_eq!(ProtoStatus::try_from(shown.status).unwrap(), ProtoStatus::Succeeded);
    assert_eq!(shown.provider_payment_id, intents[0].id, "the attempt adopted the intent");
    assert_settled(app, &[operation]).await;
}

/// Nothing reached the provider, and the attempt ended as the provider confirmed: expired.
async fn assert_expired(app: &TestApp, operation: &str) {
    let ledger = app.sim().ledger().await.unwrap();
    assert!(ledger.payment_intents.is_empty(), "nothing charged: {:?}", ledger.payment_intents);
    let shown = app.attempt_of(operation).await;
    assert_eq!(ProtoStatus::try_from(shown.status).unwrap(), ProtoStatus::Failed);
    assert_eq!(shown.failure_code, "expired");
}

/// Charges `operation` through a replica 2 h fast while the provider answers the create with
/// `fault`; the replica is gone afterwards and the row pending.
async fn insert_on_a_fast_replica(app: &TestApp, operation: &str, fault: FaultKind) -> Attempt {
    let fast = ChildProcess::serve(app, ChildSpec::replica_at(FAST)).await;
    fail_next_create(app, fault).await;
    let answer = fast.charge(charge_request(operation)).await;
    expect_left_pending(app, operation, answer).await
}

#[tokio::test]
async fn a_fast_replicas_row_is_adopted_by_lookup_after_the_provider_forgot_its_key() {
    let app = TestApp::spawn_on_fake_clock().await;
    let attempt = insert_on_a_fast_replica(&app, "fast-inserted", FaultKind::ApplyThenFail).await;
    assert_eq!(app.sim().ledger().await.unwrap().payment_intents.len(), 1, "charged, answer lost");
    let jumped_at = advance(&app, JUMP).await;

    let correct = ChildProcess::serve(&app, ChildSpec::replica_at(CORRECT_AFTER_THE_JUMP)).await;
    let redelivered = correct.charge(charge_request("fast-inserted")).await;
    assert_never_sent_again(&app, &attempt, jumped_at).await;
    let redelivered = redelivered.expect("the redelivered charge is answered");
    assert_eq!(status_of(&redelivered), ProtoStatus::Succeeded);
    assert_eq!(outcome_of(&redelivered), ChargeOutcome::Reconciled);
    assert_adopted(&app, "fast-inserted").await;
}

#[tokio::test]
async fn a_slow_replica_adopts_by_lookup_a_row_whose_key_the_provider_forgot() {
    let app = TestApp::spawn_on_fake_clock().await;
    let attempt = leave_pending(&app, "slow-decided", FaultKind::ApplyThenFail).await;
    let jumped_at = advance(&app, JUMP).await;

    let printed = ChildProcess::sweep_once(&app, ChildSpec::replica_at(SLOW_AFTER_THE_JUMP)).await;
    assert_never_sent_again(&app, &attempt, jumped_at).await;
    assert!(printed.contains("claimed=1 succeeded=1"), "{printed}");
    assert_adopted(&app, "slow-decided").await;
}

#[tokio::test]
async fn nothing_charged_under_a_fast_replica_expires_without_a_create() {
    let app = TestApp::spawn_on_fake_clock().await;
    let attempt = insert_on_a_fast_replica(&app, "fast-never", FaultKind::FailBeforeApply).await;
    let jumped_at = advance(&app, JUMP).await;

    let printed =
        ChildProcess::sweep_once(&app, ChildSpec::replica_at(CORRECT_AFTER_THE_JUMP)).await;
    assert_never_sent_again(&app, &attempt, jumped_at).await;
    assert!(printed.contains("claimed=1 succeeded=0 failed=1"), "{printed}");
    assert_expired(&app, "fast-never").await;
}

#[tokio::test]
async fn nothing_charged_decided_by_a_slow_replica_expires_without_a_create() {
    let app = TestApp::spawn_on_fake_clock().await;
    let attempt = leave_pending(&app, "slow-never", FaultKind::FailBeforeApply).await;
    let jumped_at = advance(&app, JUMP).await;

    let slow = ChildProcess::serve(&app, ChildSpec::replica_at(SLOW_AFTER_THE_JUMP)).await;
    let redelivered = slow.charge(charge_request("slow-never")).await;
    assert_never_sent_again(&app, &attempt, jumped_at).await;
    let redelivered = redelivered.expect("the redelivered charge is answered");
    assert_eq!(status_of(&redelivered), ProtoStatus::Failed);
    assert_eq!(redelivered.attempt.as_ref().unwrap().failure_code, "expired");
    assert_expired(&app, "slow-never").await;
}

/// Polls until the simulator has admitted the one create it was told to delay: the holder's
/// round is then at the provider, holding the key.
async fn wait_for_the_held_create(app: &TestApp) {
    let admitted = async {
        while !app.sim().faults().await.unwrap().is_empty() {
            tokio::time::sleep(ADMISSION_POLL).await;
        }
    };
    tokio::time::timeout(ADMISSION_WAIT_MAX, admitted)
        .await
        .expect("the holder's create reached the provider");
}

#[tokio::test]
async fn a_fast_replica_never_takes_over_a_live_round() {
    // The database's clock stays real here: only the second replica drifts.
    let app = TestApp::spawn().await;
    let holder_spec = ChildSpec { call_timeout_ms: HOLDER_CALL_TIMEOUT_MS, ..ChildSpec::default() };
    let holder = ChildProcess::serve(&app, holder_spec).await;
    let fast = ChildProcess::serve(&app, ChildSpec::replica_at(FAST)).await;
    let delayed = FaultSpec::next(FaultKind::Latency(HELD_CREATE_LATENCY_MS), 1);
    app.sim().set_fault(Endpoint::CreatePaymentIntent, delayed).await.unwrap();

    let held = tokio::spawn(async move {
        let answer = holder.charge(charge_request("held-round")).await;
        (holder, answer)
    });
    wait_for_the_held_create(&app).await;
    let duplicate = fast.charge(charge_request("held-round")).await;
    let (_holder, held_answer) =
        tokio::time::timeout(HELD_ROUND_MAX, held).await.expect("the held round ends").unwrap();

    let key = stored(&app, "held-round").await.idempotency_key;
    let creates: Vec<_> = app
        .creates()
        .await
        .into_iter()
        .filter(|r| r.idempotency_key.as_deref() == Some(key.as_str()))
        .collect();
    assert!(
        creates.iter().all(|r| r.status != Some(409)),
        "a create reached the provider while the holder's round ran: {creates:?}"
    );
    assert_eq!(creates.len(), 1, "only the lease holder sent the create: {creates:?}");
    match &duplicate {
        Ok(answer) => assert_eq!(status_of(answer), ProtoStatus::Succeeded, "{answer:?}"),
        Err(status) => assert_eq!(error_code(status), "in_progress", "{status:?}"),
    }
    let held_answer = held_answer.expect("the holder's round completes");
    assert_eq!(outcome_of(&held_answer), ChargeOutcome::Applied);
    assert_adopted(&app, "held-round").await;
}

/// How long the world runs on after the first round before a clock jumps back: the row's last
/// write (a second round) is stamped this late.
const BEFORE_THE_JUMP_BACK_MINUTES: u64 = 20;
/// How far a clock jumps back: it then reads well before the key's start and the row's last
/// write, far beyond the skew tolerance.
const JUMP_BACK_MINUTES: i64 = 120;
/// A jump back that leaves the clock after the key's start yet behind the row's last write by
/// more than the 5-minute tolerance.
const SHORT_JUMP_BACK_MINUTES: i64 = 12;
/// A replica whose clock reads 2.5 h behind the world's.
const BEHIND: ClockOffset = ClockOffset::minutes(-150);

/// The highest sequence number the simulator has logged: requests after it came later.
async fn log_mark(app: &TestApp) -> u64 {
    app.sim().requests().await.unwrap().iter().map(|r| r.seq).max().unwrap_or(0)
}

fn is_create(request: &RequestLogEntry) -> bool {
    request.endpoint.as_deref() == Some(Endpoint::CreatePaymentIntent.as_str())
}

/// Since `mark` the provider was never sent a create, only asked by metadata: a clock read
/// earlier than an instant already on the row, so the key's age is unknown.
async fn assert_only_looked_up_since(app: &TestApp, mark: u64) {
    let log = app.sim().requests().await.unwrap();
    let since: Vec<_> = log.into_iter().filter(|r| r.seq > mark).collect();
    let creates: Vec<_> = since.iter().filter(|r| is_create(r)).collect();
    assert!(creates.is_empty(), "a create was sent while the key's age was unknown: {creates:?}");
    let looked_up = since.iter().any(|r| {
        matches!(r.endpoint.as_deref(), Some("search_payment_intents" | "list_payment_intents"))
    });
    assert!(looked_up, "the provider is asked by metadata instead: {since:?}");
}

/// The world (process, database, simulator) runs on 20 minutes, then a redelivered `Charge`
/// whose create fails before the provider applies it writes the row again: its `updated_at` is
/// that late, and the row is still pending.
async fn write_the_row_later(app: &TestApp, operation: &str) {
    advance(app, minutes(BEFORE_THE_JUMP_BACK_MINUTES)).await;
    let attempt = leave_pending(app, operation, FaultKind::FailBeforeApply).await;
    let later = chrono::Duration::minutes(BEFORE_THE_JUMP_BACK_MINUTES as i64 - 1);
    assert!(
        attempt.updated_at >= attempt.key_window_started_at + later,
        "the second round stamped the row late: {attempt:?}"
    );
}

/// Moves the private cluster's clock by `minutes` (negative: back), the process's and the
/// simulator's staying where they are.
async fn move_the_database_clock(app: &TestApp, minutes: i64) {
    let cluster = app.database.fake_clock().expect("a database on a fake clock");
    let seconds = cluster.offset().seconds() + minutes * 60;
    cluster.set_offset(ClockOffset::of_seconds(seconds)).await;
}

#[tokio::test]
async fn a_database_clock_that_jumped_back_never_resends_and_adopts_by_lookup() {
    let app = TestApp::spawn_on_fake_clock().await;
    leave_pending(&app, "db-back-charged", FaultKind::ApplyThenFail).await;
    write_the_row_later(&app, "db-back-charged").await;
    let mark = log_mark(&app).await;
    move_the_database_clock(&app, -JUMP_BACK_MINUTES).await;

    let redelivered = app.charge(charge_request("db-back-charged")).await;
    assert_only_looked_up_since(&app, mark).await;
    let redelivered = redelivered.expect("the redelivered charge is answered");
    assert_eq!(status_of(&redelivered), ProtoStatus::Succeeded);
    assert_eq!(outcome_of(&redelivered), ChargeOutcome::Reconciled);
    assert_adopted(&app, "db-back-charged").await;
}

#[tokio::test]
async fn a_database_clock_behind_only_the_rows_last_write_never_resends() {
    let app = TestApp::spawn_on_fake_clock().await;
    leave_pending(&app, "db-back-short", FaultKind::ApplyThenFail).await;
    write_the_row_later(&app, "db-back-short").await;
    let mark = log_mark(&app).await;
    // The database now reads 8 minutes after the key's start, 12 before the row's last write.
    move_the_database_clock(&app, -SHORT_JUMP_BACK_MINUTES).await;

    let redelivered = app.charge(charge_request("db-back-short")).await;
    assert_only_looked_up_since(&app, mark).await;
    let redelivered = redelivered.expect("the redelivered charge is answered");
    assert_eq!(status_of(&redelivered), ProtoStatus::Succeeded);
    assert_adopted(&app, "db-back-short").await;
}

#[tokio::test]
async fn nothing_charged_under_a_database_clock_that_jumped_back_waits_then_charges_once() {
    let app = TestApp::spawn_on_fake_clock().await;
    let attempt = leave_pending(&app, "db-back-never", FaultKind::FailBeforeApply).await;
    write_the_row_later(&app, "db-back-never").await;
    let mark = log_mark(&app).await;
    move_the_database_clock(&app, -JUMP_BACK_MINUTES).await;

    // Nothing found while the key's age is unknown proves nothing: the row stays pending.
    let redelivered = app.charge(charge_request("db-back-never")).await;
    assert_only_looked_up_since(&app, mark).await;
    let error = redelivered.as_ref().expect_err("no answer while the key's age is unknown");
    assert_eq!(error.code(), Code::Unavailable, "{error:?}");
    expect_left_pending(&app, "db-back-never", redelivered).await;
    assert!(app.sim().ledger().await.unwrap().payment_intents.is_empty(), "nothing charged");

    // The clock put right: the key is young again on every clock, and is sent once more.
    let mark = log_mark(&app).await;
    move_the_database_clock(&app, JUMP_BACK_MINUTES).await;
    let redelivered = app.charge(charge_request("db-back-never")).await;
    let redelivered = redelivered.expect("the redelivered charge is answered");
    assert_eq!(status_of(&redelivered), ProtoStatus::Succeeded);
    let log = app.sim().requests().await.unwrap();
    let creates: Vec<_> = log
        .iter()
        .filter(|r| r.seq > mark && is_create(r))
        .collect();
    assert_eq!(creates.len(), 1, "one re-send once the clock is right: {creates:?}");
    assert_eq!(creates[0].idempotency_key.as_deref(), Some(attempt.idempotency_key.as_str()));
    assert_adopted(&app, "db-back-never").await;
}

#[tokio::test]
async fn a_replica_whose_clock_reads_before_the_keys_start_adopts_by_lookup() {
    // The database's clock stays real here: only the redelivering replica is behind.
    let app = TestApp::spawn().await;
    leave_pending(&app, "replica-behind", FaultKind::ApplyThenFail).await;
    let mark = log_mark(&app).await;

    let behind = ChildProcess::serve(&app, ChildSpec::replica_at(BEHIND)).await;
    let redelivered = behind.charge(charge_request("replica-behind")).await;
    assert_only_looked_up_since(&app, mark).await;
    let redelivered = redelivered.expect("the redelivered charge is answered");
    assert_eq!(status_of(&redelivered), ProtoStatus::Succeeded);
    assert_eq!(outcome_of(&redelivered), ChargeOutcome::Reconciled);
    assert_adopted(&app, "replica-behind").await;
}
