//! Checks of the embedded SQLite default that the shared behaviour tests do not make: writers
//! contending for SQLite's one write lock through a small pool, the record surviving a restart
//! of the service on the same file, and a clean stop leaving only that file.

use std::collections::HashSet;

use chargeguard::grpc::proto::{AttemptStatus, ChargeOutcome};
use chargeguard::simulator::{Endpoint, FaultKind, FaultSpec};

use crate::support::{Backend, TestApp, charge_request, outcome_of, status_of};

/// Concurrent calls per operation, and distinct operations, in the contention test.
const IDENTICAL_CALLS: usize = 30;
const DISTINCT_OPERATIONS: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_identical_and_distinct_charges_through_a_two_connection_pool() {
    // Two connections for fifty calls: every insert, lease and finish queues for a connection
    // and then for the write lock, which is where a SQLite store would fail with "database is
    // locked" or let a second caller through.
    let app = TestApp::spawn_backend_with(Backend::Sqlite, |config| {
        config.database.connections_max = 2;
        config.sweep.concurrency_max = 1;
    })
    .await;
    app.sim()
        .set_fault(
            Endpoint::CreatePaymentIntent,
            FaultSpec::next(FaultKind::Latency(300), 1),
        )
        .await
        .unwrap();
    let identical = (0..IDENTICAL_CALLS).map(|_| app.charge(charge_request("order-same:charge")));
    let distinct = (0..DISTINCT_OPERATIONS)
        .map(|index| app.charge(charge_request(&format!("order-{index}:charge"))));
    let (identical, distinct) = tokio::join!(
        futures::future::join_all(identical),
        futures::future::join_all(distinct)
    );

    let identical: Vec<_> = identical
        .into_iter()
        .map(|r| r.expect("every caller gets the outcome"))
        .collect();
    let ids: HashSet<_> = identical
        .iter()
        .map(|r| r.attempt.as_ref().unwrap().attempt_id.clone())
        .collect();
    assert_eq!(ids.len(), 1, "one attempt for the operation");
    assert_eq!(
        identical
            .iter()
            .filter(|r| outcome_of(r) == ChargeOutcome::Applied)
            .count(),
        1
    );
    assert!(
        identical
            .iter()
            .all(|r| status_of(r) == AttemptStatus::Succeeded)
    );
    for response in distinct {
        let response = response.expect("every distinct operation is charged");
        assert_eq!(outcome_of(&response), ChargeOutcome::Applied);
        assert_eq!(status_of(&response), AttemptStatus::Succeeded);
    }

    let ledger = app.sim().ledger().await.unwrap();
    assert_eq!(
        ledger.payment_intents.len(),
        DISTINCT_OPERATIONS + 1,
        "one provider object per operation"
    );
    let keys: HashSet<_> = ledger
        .payment_intents
        .iter()
        .map(|intent| intent.idempotency_key.clone())
        .collect();
    assert_eq!(keys.len(), DISTINCT_OPERATIONS + 1);
    assert_eq!(app.attempt_rows().await, (DISTINCT_OPERATIONS + 1) as i64);
}

#[tokio::test]
async fn the_record_survives_a_restart_on_the_same_file() {
    let app = TestApp::spawn_backend(Backend::Sqlite).await;
    let path = app.database.sqlite_path().expect("a SQLite database");
    let first = app
        .charge(charge_request("order-restart:charge"))
        .await
        .unwrap();
    assert_eq!(outcome_of(&first), ChargeOutcome::Applied);
    // A pending attempt too: its outcome is unknown when the service stops.
    app.sim()
        .set_fault(
            Endpoint::CreatePaymentIntent,
            FaultSpec::next(FaultKind::FailBeforeApply, 1),
        )
        .await
        .unwrap();
    app.charge(charge_request("order-unknown:charge"))
        .await
        .unwrap_err();

    let app = app.restart().await;
    assert!(path.is_file());
    assert_eq!(app.attempt_rows().await, 2);
    assert_eq!(
        Some(app.attempt_of("order-restart:charge").await),
        first.attempt,
        "read back as it was answered"
    );

    let again = app
        .charge(charge_request("order-restart:charge"))
        .await
        .unwrap();
    assert_eq!(
        outcome_of(&again),
        ChargeOutcome::Duplicate,
        "the new process answers from the file"
    );
    assert_eq!(again.attempt, first.attempt);
    let resumed = app
        .charge(charge_request("order-unknown:charge"))
        .await
        .unwrap();
    assert_eq!(
        outcome_of(&resumed),
        ChargeOutcome::Reconciled,
        "the pending intent was kept"
    );
    assert_eq!(status_of(&resumed), AttemptStatus::Succeeded);
    let creates = app.creates().await.len();
    assert_eq!(
        creates, 3,
        "one create each, plus the retry of the one whose answer was lost"
    );
    assert_eq!(app.sim().ledger().await.unwrap().payment_intents.len(), 2);
}

#[tokio::test]
async fn a_clean_stop_leaves_no_write_ahead_log_behind() {
    let app = TestApp::spawn_backend(Backend::Sqlite).await;
    let path = app.database.sqlite_path().expect("a SQLite database");
    let wal = path.with_file_name(format!("{}-wal", path.file_name().unwrap().to_string_lossy()));
    app.charge(charge_request("order-wal:charge")).await.unwrap();
    assert!(wal.exists(), "the store writes ahead while it serves");

    let database = app.stop_keeping_database().await;
    assert!(!wal.exists(), "the log was checkpointed into {} and removed", path.display());
    assert_eq!(database.attempt_rows().await, 1, "the charge is in the database file");
}
