//! Several sweepers at once (replicas, or a cron `sweep --once` beside `serve`): the leases keep
//! each row to one of them; a round that outlives its lease; and the sweep's two entry points
//! other than `try_sweep_once`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chargeguard::config::Config;
use chargeguard::domain::{AttemptStatus, OperationKey, derive_idempotency_key};
use chargeguard::simulator::FaultKind;
use tonic::Code;
use chargeguard::orchestrator::{Orchestrator, SweepOutcome};
use chargeguard::startup::Application;
use tokio_util::sync::CancellationToken;

use super::child::{ChildProcess, ChildSpec};
use super::{assert_settled, creates_with_key, fail_next_create, seed_due_rows, stored};
use crate::support::{
    Backend, SIM_API_KEY, TestApp, charge_request, error_code, on_both_backends, test_config,
};

const STUCK_ROWS: usize = 1_000;

fn sweep_settings(config: &mut Config) {
    config.sweep.batch_max = 100;
    config.sweep.concurrency_max = 8;
}

/// Passes until one claims nothing; returns every pass's outcome.
async fn sweep_to_the_end(sweeper: &Orchestrator) -> Vec<SweepOutcome> {
    let mut passes = Vec::new();
    for _ in 0..STUCK_ROWS {
        let pass = sweeper.try_sweep_once().await.unwrap();
        if pass.claimed == 0 {
            return passes;
        }
        passes.push(pass);
    }
    panic!("a sweeper kept claiming rows");
}

async fn two_sweepers_over_a_thousand_stuck_rows_reconcile_each_row_exactly_once(backend: Backend) {
    let app = TestApp::spawn_backend_with(backend, sweep_settings).await;
    let seeded = seed_due_rows(&app, "stuck", STUCK_ROWS).await;
    // A second replica: its own pool and provider client, the same database, simulator and clock.
    let mut config = test_config(&app.database.url, &app.simulator.base_url());
    sweep_settings(&mut config);
    let replica = Application::build(config, app.clock.clone()).await.unwrap();

    let started = Instant::now();
    let (first, second) =
        tokio::join!(sweep_to_the_end(&app.orchestrator), sweep_to_the_end(replica.orchestrator()));
    let elapsed = started.elapsed();
    let claimed =
        |passes: &[SweepOutcome]| passes.iter().map(|p| p.claimed as usize).sum::<usize>();
    let (first_claimed, second_claimed) = (claimed(&first), claimed(&second));
    println!(
        "{STUCK_ROWS} rows: sweepers claimed {first_claimed} + {second_claimed} in {elapsed:?}"
    );
    assert_eq!(first_claimed + second_claimed, STUCK_ROWS, "each row claimed once");
    assert!(first_claimed > 0 && second_claimed > 0, "both sweepers worked at the same time");
    assert!(first.iter().chain(&second).all(|p| p.claimed <= 100), "passes stay within batch_max");

    let mut creates_per_key: HashMap<String, usize> = HashMap::new();
    for create in app.creates().await {
        *creates_per_key.entry(create.idempotency_key.unwrap()).or_default() += 1;
    }
    assert_eq!(creates_per_key.len(), STUCK_ROWS);
    for row in &seeded {
        assert_eq!(
            creates_per_key.get(row.idempotency_key.as_str()),
            Some(&1),
            "{}",
            row.operation_key
        );
    }
    let operations: Vec<String> =
        seeded.iter().map(|row| row.operation_key.as_str().to_owned()).collect();
    let operations: Vec<&str> = operations.iter().map(String::as_str).collect();
    assert_settled(&app, &operations).await;
    assert_eq!(app.sim().ledger().await.unwrap().payment_intents.len(), STUCK_ROWS);
}

async fn a_cancelled_pass_stops_before_its_next_row(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    let seeded = seed_due_rows(&app, "cancelled", 3).await;
    let cancel = CancellationToken::new();
    cancel.cancel();
    let pass = app.orchestrator.sweep_once(&cancel).await.unwrap();
    assert_eq!(pass, SweepOutcome::default());
    for row in &seeded {
        assert_eq!(stored(&app, row.operation_key.as_str()).await.status, AttemptStatus::Pending);
    }
    assert!(app.creates().await.is_empty());
}

async fn sweep_once_from_the_command_line_prints_its_outcome(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    let seeded = seed_due_rows(&app, "cron", 3).await;
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_chargeguard"))
        .args(["sweep", "--once"])
        .env("CHARGEGUARD_DATABASE__URL", &app.database.url)
        .env("CHARGEGUARD_PROVIDER__API_KEY", SIM_API_KEY)
        .env("CHARGEGUARD_PROVIDER__BASE_URL", app.simulator.base_url())
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(
        stdout.trim(),
        "sweep: claimed=3 succeeded=3 failed=0 unfinished=0 flagged=0 errors=0"
    );
    let operations: Vec<&str> = seeded.iter().map(|row| row.operation_key.as_str()).collect();
    assert_settled(&app, &operations).await;
}

// Two replicas on one SQLite file work too (its one write lock orders their claims), though the
// embedded store is meant for one process: README, Storage.
on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    two_sweepers_over_a_thousand_stuck_rows_reconcile_each_row_exactly_once,
    a_cancelled_pass_stops_before_its_next_row,
    sweep_once_from_the_command_line_prints_its_outcome,
);

/// The stalled replica's lease: short, so that the in-process app takes the row over quickly.
const STALLED_LEASE_MS: u64 = 2_000;
/// How long the replica stalls after the provider answered: the lease lapses, another caller
/// takes the row and finishes its own round (a few milliseconds after the lease) well before.
const STALL_MS: u64 = 8_000;
const POLL: Duration = Duration::from_millis(20);

/// A round that stalls past its lease after its create succeeded: another caller takes the row
/// and leaves it pending (its re-send fails). The stalled round's write is refused, and its
/// caller is told what the row says — still undecided, so "in progress", never `APPLIED` for
/// a charge the row does not record. A later redelivery adopts the one intent.
#[tokio::test]
async fn a_round_whose_lease_lapsed_answers_the_row_as_it_stands() {
    let app = TestApp::spawn().await;
    let spec = ChildSpec::stalling_at("round.after_provider_call", STALL_MS, STALLED_LEASE_MS);
    let replica = ChildProcess::serve(&app, spec).await;
    let operation = "lapsed-1";
    let key = derive_idempotency_key(&super::orders(), &OperationKey::parse(operation).unwrap(), 0);

    let takeover = async {
        // The replica's create has been answered: it is now stalled, holding a lease that ends.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while creates_with_key(&app, key.as_str()).await == 0 {
            assert!(tokio::time::Instant::now() < deadline, "the replica never sent its create");
            tokio::time::sleep(POLL).await;
        }
        // The redelivery waits for the lease to lapse (on the database's clock), takes the row,
        // and its re-send fails before it is applied: the row stays pending.
        fail_next_create(&app, FaultKind::FailBeforeApply).await;
        let taken = app.charge(charge_request(operation)).await.unwrap_err();
        assert_eq!(error_code(&taken), "outcome_unknown", "{taken:?}");
        let row = stored(&app, operation).await;
        assert_eq!(row.status, AttemptStatus::Pending);
        assert!(row.lease.is_none(), "taken over and released: {:?}", row.lease);
    };
    let (stalled, ()) = tokio::join!(replica.charge(charge_request(operation)), takeover);

    let stalled = stalled.unwrap_err();
    assert_eq!(
        (stalled.code(), error_code(&stalled).as_str()),
        (Code::Unavailable, "in_progress"),
        "the row is undecided: {stalled:?}"
    );
    let row = stored(&app, operation).await;
    assert_eq!(row.status, AttemptStatus::Pending, "the stalled round's success was not written");
    assert_eq!(creates_with_key(&app, key.as_str()).await, 2);

    let redelivered = app.charge(charge_request(operation)).await.unwrap();
    assert_eq!(crate::support::status_of(&redelivered), chargeguard::grpc::proto::AttemptStatus::Succeeded);
    assert_settled(&app, &[operation]).await;
    assert_eq!(app.sim().ledger().await.unwrap().payment_intents.len(), 1, "one intent");
}
