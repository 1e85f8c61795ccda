//! Checks of the embedded SQLite default that the shared behaviour tests do not make: writers
//! contending for SQLite's one write lock through a small pool, the record surviving a restart
//! of the service on the same file, a clean stop leaving only that file, and the first run's
//! built-in simulator delivering its webhooks to the server's own endpoint.

use std::collections::HashSet;
use std::time::{Duration, Instant};

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
        // Every waiter hears the first round's outcome however slow the machine.
        config.charge.concurrent_wait_ms = 30_000;
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

/// The first run (no `provider.api_key`: the built-in simulator) with the sweep off: a 3-D Secure
/// payment authenticated at the built-in simulator (its redirect URL, as the customer opens it)
/// becomes `succeeded`, completed by the simulator's webhook through the server's own endpoint
/// under a secret generated at start — none is configured here. (It takes about a second: the
/// inbox worker's tick. The bound is for a slow, loaded machine, not a speed claim.)
#[tokio::test]
async fn in_the_first_run_a_3ds_payment_authenticated_at_the_built_in_simulator_completes_by_webhook() {
    let app = TestApp::spawn_backend_with(Backend::Sqlite, |config| {
        config.provider.api_key = None;
        config.provider.base_url = None;
        config.webhooks.secrets.clear();
        assert!(!config.sweep.enabled, "no sweep: only a webhook can complete the payment");
    })
    .await;
    let mut request = charge_request("order-first-run-3ds");
    request.payment_method = "pm_card_threeDSecure2Required".into();
    let response = app.charge(request).await.unwrap();
    assert_eq!(status_of(&response), AttemptStatus::RequiresAction);
    let redirect_url = response.attempt.unwrap().next_action.unwrap().redirect_url;
    assert!(
        !redirect_url.starts_with(&app.simulator.base_url()),
        "charged at the built-in simulator, not the test's: {redirect_url}"
    );

    // The customer presses "Complete" on the built-in simulator's 3-D Secure page (a POST; the
    // page itself changes nothing), which sends them on to the return URL.
    let no_redirects = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let authenticated = no_redirects.post(&redirect_url).form(&[("outcome", "succeed")]).send().await.unwrap();
    assert!(authenticated.status().is_success() || authenticated.status().is_redirection(), "{}", authenticated.status());
    let deadline = Instant::now() + Duration::from_secs(30);
    let attempt = loop {
        let attempt = app.attempt_of("order-first-run-3ds").await;
        if AttemptStatus::try_from(attempt.status).unwrap() == AttemptStatus::Succeeded {
            break attempt;
        }
        assert!(Instant::now() < deadline, "still {:?} 30 s after authentication", attempt.status);
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(attempt.provider_calls, 1, "the webhook, not a provider call, completed it");
    assert!(attempt.next_action.is_none(), "nothing left for the customer to do");
}
