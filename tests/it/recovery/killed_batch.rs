//! Group commit (issue 21) and a process that dies with batches in flight: a `serve` child is
//! killed with SIGKILL while its insert batch waits in the database (the statement then runs on
//! and commits with nobody to hear it) and more callers queue behind it in its memory. Redelivery
//! and the sweep, in another process, finish every operation with one charge each, counted at
//! the simulator.

use std::time::Duration;

use chargeguard::grpc::proto::{AttemptStatus as ProtoStatus, ChargeOutcome};
use sqlx::PgPool;

use super::child::{ChildProcess, ChildSpec};
use super::{assert_settled, sweep_until_idle};
use crate::group_commit::{lock_writes, wait_for_a_blocked_batch};
use crate::support::{TestApp, charge_request, outcome_of, status_of};

const CALLERS: usize = 16;
/// Time for the child's other callers to queue behind its blocked batch.
const QUEUE_SETTLE: Duration = Duration::from_secs(2);
/// The child's leases: short, so that the test waits them out on the real clock.
const CHILD_LEASE_MS: u64 = 10_000;

#[tokio::test]
async fn a_service_killed_with_a_batch_in_flight_loses_and_duplicates_nothing() {
    let app = TestApp::spawn_with(|config| config.database.group_commit.enabled = true).await;
    let spec = ChildSpec {
        group_commit: true,
        lease_ms: CHILD_LEASE_MS,
        call_timeout_ms: 1_000,
        statement_timeout_ms: 5_000,
        ..ChildSpec::default()
    };
    let mut child = ChildProcess::serve(&app, spec).await;
    let pool = PgPool::connect(&app.database.url).await.unwrap();
    let operations: Vec<String> = (0..CALLERS).map(|index| format!("killed-{index}")).collect();

    // Writes wait behind this lock: the child's first batch is in the database, the rest queue
    // in the child's memory; then the child dies.
    let lock = lock_writes(&pool).await;
    let calls = futures::future::join_all(operations.iter().map(|operation| child.charge(charge_request(operation))));
    let kill = async {
        wait_for_a_blocked_batch(&pool).await;
        tokio::time::sleep(QUEUE_SETTLE).await;
        child.kill_now();
    };
    let (lost, ()) = tokio::join!(calls, kill);
    assert!(lost.iter().all(Result::is_err), "no caller hears from a process that died: {lost:?}");
    child.reap().await;
    // The dead child's batch statement still waits in its session; released, it runs on and
    // commits with nobody to hear it.
    lock.commit().await.unwrap();
    child.wait_for_sessions_to_end().await;
    let committed = app.attempt_rows().await;
    assert!(
        (1..=CALLERS as i64).contains(&committed),
        "the batch in the database committed after its process died: {committed} rows"
    );

    // Past the dead child's leases (and its recovery grace), on the real clock.
    tokio::time::sleep(Duration::from_millis(CHILD_LEASE_MS + 1_000)).await;
    for operation in &operations {
        let answer = app.charge(charge_request(operation)).await.unwrap();
        assert_eq!(status_of(&answer), ProtoStatus::Succeeded, "{operation}");
        assert!(
            matches!(outcome_of(&answer), ChargeOutcome::Applied | ChargeOutcome::Reconciled),
            "{operation}: {:?}",
            outcome_of(&answer)
        );
    }
    sweep_until_idle(&app).await;
    let names: Vec<&str> = operations.iter().map(String::as_str).collect();
    assert_settled(&app, &names).await;
    assert_eq!(app.sim().ledger().await.unwrap().payment_intents.len(), CALLERS, "one charge per operation");
    assert_eq!(app.attempt_rows().await, CALLERS as i64, "one row per operation ({committed} committed by the dead child)");
}
