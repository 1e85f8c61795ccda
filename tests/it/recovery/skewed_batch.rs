//! Group commit (issue 21) under a replica's clock that runs ahead: a `serve` child whose clock
//! is 2 h fast (libfaketime) writes its callers' first attempts in batches
//! (`insert_pending_first_attempts`), and every row's key window starts at the database's
//! clock, not the child's: the sweep decides by that window whether the provider may still
//! know the key, so a window counted from the child's future would let a key the provider
//! forgot look alive.

use std::time::Duration;

use chargeguard::grpc::proto::{AttemptStatus as ProtoStatus, ChargeOutcome};
use sqlx::PgPool;

use super::child::{ChildProcess, ChildSpec};
use crate::group_commit::{lock_writes, wait_for_a_blocked_batch};
use crate::support::faketime::ClockOffset;
use crate::support::{TestApp, charge_request, outcome_of, status_of};

const CALLERS: usize = 16;
/// Time for the child's other callers to queue behind its blocked batch.
const QUEUE_SETTLE: Duration = Duration::from_secs(2);

#[tokio::test]
async fn a_batch_written_by_a_replica_with_a_fast_clock_starts_every_key_window_at_the_database_clock() {
    let app = TestApp::spawn_with(|config| config.database.group_commit.enabled = true).await;
    let spec = ChildSpec { group_commit: true, clock: ClockOffset::minutes(120), ..ChildSpec::default() };
    let child = ChildProcess::serve(&app, spec).await;
    let pool = PgPool::connect(&app.database.url).await.unwrap();
    let operations: Vec<String> = (0..CALLERS).map(|index| format!("fast-{index}")).collect();

    // The child's first row waits behind the lock; the others queue into its next batches.
    let lock = lock_writes(&pool).await;
    let calls = futures::future::join_all(operations.iter().map(|operation| child.charge(charge_request(operation))));
    let release = {
        let pool = pool.clone();
        async move {
            wait_for_a_blocked_batch(&pool).await;
            tokio::time::sleep(QUEUE_SETTLE).await;
            lock.commit().await.unwrap();
        }
    };
    let (answers, ()) = tokio::join!(calls, release);
    for (operation, answer) in operations.iter().zip(answers) {
        let answer = answer.unwrap_or_else(|error| panic!("{operation}: {error:?}"));
        assert_eq!(status_of(&answer), ProtoStatus::Succeeded, "{operation}");
        assert_eq!(outcome_of(&answer), ChargeOutcome::Applied, "{operation}");
    }

    // The rows of one statement share their transaction's start: the callers went in batches.
    let statements: i64 = sqlx::query_scalar("SELECT count(DISTINCT created_at) FROM payment_attempts")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(statements <= 4, "{CALLERS} inserts in {statements} statements");
    let ahead: Vec<(String, i64)> = sqlx::query_as(
        "SELECT operation_key, (extract(epoch FROM key_window_started_at - created_at) * 1000)::bigint
         FROM payment_attempts WHERE key_window_started_at > created_at ORDER BY operation_key",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(ahead.is_empty(), "key windows started after the row was written (ms ahead): {ahead:?}");
    assert_eq!(app.sim().ledger().await.unwrap().payment_intents.len(), CALLERS, "one charge per operation");
}
