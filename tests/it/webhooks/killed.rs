//! A worker killed mid-batch (SEMANTICS.md's crash table, for the webhook inbox), on both stores:
//! a real `chargeguard serve` process, on the same database as the test's app (on SQLite, the
//! same file from two processes), is stopped by a crash point. On PostgreSQL also with the dead
//! worker's clock ahead of or behind the database's (libfaketime).

use std::time::Duration;

use chargeguard::grpc::proto::AttemptStatus;
use chargeguard::store::inbox::InboxOutcome;
use chargeguard::webhook::DrainOutcome;
use chargeguard::webhook::worker::SettledEvent;

use super::{CLAIM, Hooked, ServeBeside, charge_with_lost_answer, outcomes, status};
use crate::support::faketime::ClockOffset;
use crate::support::{Backend, on_both_backends};

/// Starts a real `chargeguard serve` on `hooked`'s database, its clock moved by `clock`, whose
/// webhook worker crashes after settling the first event of its first batch, and waits for the
/// crash.
async fn run_worker_that_crashes_mid_batch(hooked: &Hooked, clock: ClockOffset) {
    let mut child =
        ServeBeside::start(hooked, clock, &[("FAILPOINTS", "webhook.mid_batch=return")]);
    // A bound, not a timing assumption: the child crashes at its first drain, 50 ms after start.
    let exit = tokio::time::timeout(Duration::from_secs(60), child.process.wait())
        .await
        .expect("the worker crashed")
        .unwrap();
    assert_eq!(exit.code(), Some(chargeguard::failpoints::CRASH_EXIT_CODE));
    child.assert_clock().await;
}

/// While the dead worker's claim runs, nobody takes its rows; once the claim's length has passed
/// (the test's clock, and with it the database's reading, moved past it), the next worker
/// applies the two events it left. Returns what that worker settled.
async fn the_next_worker_takes_the_two_left_once_the_claim_expires(
    hooked: &Hooked,
) -> Vec<SettledEvent> {
    assert_eq!(
        hooked.worker.try_drain_once().await.unwrap(),
        DrainOutcome::EmptyInbox,
        "the dead worker's claim still runs"
    );
    hooked
        .app
        .clock
        .advance(chrono::Duration::from_std(CLAIM).unwrap() + chrono::Duration::seconds(1));
    let settled = hooked.drain().await;
    assert_eq!(
        outcomes(&settled, "payment_intent.succeeded"),
        [InboxOutcome::Applied, InboxOutcome::Applied],
        "taken once the claim's length passed"
    );
    settled
}

/// Three charges whose create answers were lost (`operation_prefix-0` … `-2`), so the inbox
/// holds their three events; then a real `chargeguard serve` whose clock is moved by
/// `worker_clock` claims all three and dies after settling the first. Checks that it settled
/// one and left the other two claimed, and returns the settled event's id.
async fn a_worker_dies_after_settling_one_of_three(
    hooked: &Hooked,
    operation_prefix: &str,
    worker_clock: ClockOffset,
) -> String {
    hooked.lose_create_answers(3).await;
    for index in 0..3 {
        charge_with_lost_answer(hooked, &format!("{operation_prefix}-{index}")).await;
    }
    hooked.flush().await;
    assert_eq!(hooked.inbox().await.len(), 3);

    run_worker_that_crashes_mid_batch(hooked, worker_clock).await;

    let rows: Vec<(String, Option<String>, i32)> = on_pool!(hooked, |pool| {
        sqlx::query_as(
            "SELECT event_id, outcome, CASE WHEN claim_owner IS NULL THEN 0 ELSE 1 END
             FROM webhook_inbox ORDER BY received_at, event_id",
        )
        .fetch_all(pool)
        .await
        .unwrap()
    });
    let rows: Vec<(String, Option<String>, bool)> = rows
        .into_iter()
        .map(|(id, outcome, claimed)| (id, outcome, claimed == 1))
        .collect();
    let settled_by_child: Vec<_> = rows
        .iter()
        .filter(|(_, outcome, _)| outcome.is_some())
        .collect();
    assert_eq!(
        settled_by_child.len(),
        1,
        "killed after settling one event: {rows:?}"
    );
    assert_eq!(settled_by_child[0].1.as_deref(), Some("applied"));
    assert_eq!(
        rows.iter()
            .filter(|(_, outcome, claimed)| outcome.is_none() && *claimed)
            .count(),
        2,
        "the rest still claimed by the dead worker"
    );
    settled_by_child[0].0.clone()
}

/// A real `chargeguard serve` process drains the inbox and is killed by a crash point after the
/// first event of its batch; the next worker finds the rest claimed until the claim expires,
/// then finishes the batch. Every event is settled exactly once.
async fn a_worker_killed_mid_batch_loses_nothing_and_the_next_one_finishes_the_batch(
    backend: Backend,
) {
    let hooked = Hooked::spawn_on(backend).await;
    let settled_by_child =
        a_worker_dies_after_settling_one_of_three(&hooked, "order-crash", ClockOffset::NONE).await;

    let settled = the_next_worker_takes_the_two_left_once_the_claim_expires(&hooked).await;
    assert!(
        settled.iter().all(|s| s.event_id != settled_by_child),
        "the settled event is not settled again"
    );

    for index in 0..3 {
        assert_eq!(
            status(&hooked.app.attempt_of(&format!("order-crash-{index}")).await),
            AttemptStatus::Succeeded
        );
    }
    let claims: Vec<(i32,)> = on_pool!(hooked, |pool| {
        sqlx::query_as("SELECT claim_count FROM webhook_inbox WHERE event_id <> $1")
            .bind(&settled_by_child)
            .fetch_all(pool)
            .await
            .unwrap()
    });
    assert_eq!(
        claims,
        [(2,), (2,)],
        "claimed by the dead worker, then by the next"
    );
    assert_eq!(
        hooked
            .app
            .sim()
            .ledger()
            .await
            .unwrap()
            .payment_intents
            .len(),
        3
    );
}

on_both_backends!(a_worker_killed_mid_batch_loses_nothing_and_the_next_one_finishes_the_batch);

/// A worker whose clock is `worker_clock` off the database's claims a batch of three events and
/// dies after settling the first. Its claim on the other two lasts the claim's length by the
/// database's clock, however wrong its own: nobody takes them before (a worker behind would
/// have stamped a claim already expired, and another worker would have taken rows it was still
/// settling), and the next worker takes them right after (a worker ahead would have kept them
/// out of reach for as long again as its clock was off). Each is applied once.
async fn a_dead_workers_claim_lasts_its_length_by_the_database_clock_whatever_its_own(
    worker_clock: ClockOffset,
) {
    let hooked = Hooked::spawn().await;
    a_worker_dies_after_settling_one_of_three(&hooked, "order-skewed-worker", worker_clock).await;

    the_next_worker_takes_the_two_left_once_the_claim_expires(&hooked).await;
    for index in 0..3 {
        let attempt = hooked
            .app
            .attempt_of(&format!("order-skewed-worker-{index}"))
            .await;
        assert_eq!(status(&attempt), AttemptStatus::Succeeded);
    }
}

/// Two hours ahead: as `recovery::skew`'s fast replica.
#[tokio::test]
async fn a_dead_worker_whose_clock_ran_ahead_holds_its_claim_no_longer_than_the_claim() {
    a_dead_workers_claim_lasts_its_length_by_the_database_clock_whatever_its_own(
        ClockOffset::minutes(120),
    )
    .await;
}

/// Two hours behind.
#[tokio::test]
async fn a_worker_whose_clock_runs_behind_keeps_its_claim_for_the_claims_length() {
    a_dead_workers_claim_lasts_its_length_by_the_database_clock_whatever_its_own(
        ClockOffset::minutes(-120),
    )
    .await;
}
