//! The past-window lookup in a busy account (issue 14): 20,000 other intents created in the same
//! second as the attempt's, search unavailable, list pages slow enough that one round of
//! `provider.lookup_pages_max` pages outlasts the lease. Two sweepers run at once. Counted at the
//! simulator: the attempt adopts its own intent, its key is never sent again, no list page is
//! fetched twice (so no two rounds ran the row at once, and each round resumed from the cursor
//! the last one saved), and the listing took as many pages as the range holds, over several
//! rounds.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use chargeguard::config::Config;
use chargeguard::domain::{AttemptStatus, ListProgress};
use chargeguard::orchestrator::{Orchestrator, SweepOutcome};
use chargeguard::simulator::{Endpoint, FaultKind, FaultSpec, RequestLogEntry, SeedPaymentIntent};
use chargeguard::startup::Application;
use futures::StreamExt;

use super::{advance, hours, leave_pending, stored};
use crate::support::{Backend, TestApp, on_both_backends, test_config};

const OPERATION: &str = "busy-lookup";
/// Other intents in the attempt's created second.
const OTHER_INTENTS: usize = 20_000;
/// The provider's page size, as the lookup asks for it.
const PAGE_SIZE: usize = 100;
/// Every other intent's page, then the page that holds only the attempt's own.
const PAGES_NEEDED: usize = OTHER_INTENTS / PAGE_SIZE + 1;
/// List calls beyond the pages needed that would still be "about" them.
const LIST_CALLS_SLACK: usize = 2;
/// `provider.lookup_pages_max` here: one round reads at most this many pages.
const PAGES_PER_ROUND: u32 = 50;
/// The simulator holds every list call this long before answering.
const LIST_LATENCY_MS: u64 = 200;
/// The test configuration's lease (`support::test_config`).
const LEASE_MS: u64 = 8_000;
// A full round (50 pages × 200 ms = 10 s) outlasts the lease (8 s): only renewing it between
// pages keeps the second sweeper off the row.
const _: () = assert!(PAGES_PER_ROUND as u64 * LIST_LATENCY_MS > LEASE_MS);
/// Seed calls in flight at once.
const SEED_CONCURRENCY: usize = 16;
/// Rounds the lookup needs: ceil(201 / 50) = 5.
const ROUNDS_NEEDED: usize = PAGES_NEEDED.div_ceil(PAGES_PER_ROUND as usize);
/// Rounds both sweepers run together at most before the test gives up (a lookup that starts
/// over never ends).
const ROUNDS_MAX: usize = ROUNDS_NEEDED + 3;
/// Idle passes one sweeper makes at most, each followed by `IDLE_PAUSE`: ~100 s of polling,
/// well past the ~40 s of list latency the lookup needs.
const IDLE_PASSES_MAX: usize = 1_000;
const IDLE_PAUSE: Duration = Duration::from_millis(100);

fn busy_lookup_settings(config: &mut Config) {
    assert_eq!(config.charge.lease_ms, LEASE_MS);
    config.provider.lookup_pages_max = PAGES_PER_ROUND;
    // One row per pass: a pass is one round, and after each round both sweepers race for the
    // row again.
    config.sweep.batch_max = 1;
}

/// Sweeps until the attempt is decided, or until both sweepers together have run `ROUNDS_MAX`
/// rounds (the checks after it then say what went wrong); returns the passes that claimed it.
/// `rounds` counts the rounds of both sweepers.
async fn sweep_until_decided(sweeper: &Orchestrator, app: &TestApp, rounds: &AtomicUsize) -> Vec<SweepOutcome> {
    let mut passes = Vec::new();
    let mut idle = 0;
    while !stored(app, OPERATION).await.status.is_terminal() && rounds.load(Ordering::SeqCst) < ROUNDS_MAX {
        let pass = sweeper.try_sweep_once().await.unwrap();
        if pass.claimed == 0 {
            idle += 1;
            assert!(idle <= IDLE_PASSES_MAX, "{OPERATION} still undecided after {IDLE_PASSES_MAX} idle passes");
        } else {
            passes.push(pass);
            rounds.fetch_add(1, Ordering::SeqCst);
        }
        // After its own round too: the row is due again at once, and either sweeper may take it.
        tokio::time::sleep(IDLE_PAUSE).await;
    }
    passes
}

fn is_endpoint(request: &RequestLogEntry, endpoint: &str) -> bool {
    request.endpoint.as_deref() == Some(endpoint)
}

async fn a_lookup_through_20000_same_second_intents_resumes_across_rounds_and_never_overlaps(
    backend: Backend,
) {
    let app = TestApp::spawn_backend_with(backend, busy_lookup_settings).await;
    let attempt = leave_pending(&app, OPERATION, FaultKind::ApplyThenFail).await;
    let ledger = app.sim().ledger().await.unwrap();
    let own = ledger
        .payment_intents_with_metadata("chargeguard_attempt_id", &attempt.id.to_string())
        .next()
        .expect("the lost create made an intent")
        .clone();

    // Stripe lists newest first. The simulator orders by (created, creation sequence)
    // descending, so intents seeded now with the attempt's own `created` second all come before
    // it: it is the 20,001st object of the range, alone on page 201.
    let started = Instant::now();
    let sim = app.sim();
    let seeded = futures::stream::iter(0..OTHER_INTENTS)
        .map(|_| {
            sim.seed_payment_intent(SeedPaymentIntent {
                amount: 500,
                currency: "usd".into(),
                status: "succeeded".into(),
                metadata: BTreeMap::new(),
                created: Some(own.created),
            })
        })
        .buffer_unordered(SEED_CONCURRENCY)
        .collect::<Vec<_>>()
        .await;
    assert!(seeded.iter().all(|seed| seed.as_ref().is_ok_and(|intent| intent.created == own.created)));
    println!("seeded {OTHER_INTENTS} intents in {:?}", started.elapsed());
    let ledger = app.sim().ledger().await.unwrap();
    let same_second: Vec<_> = ledger.payment_intents.iter().filter(|i| i.created == own.created).collect();
    assert_eq!(same_second.len(), OTHER_INTENTS + 1);
    assert_eq!(same_second[0].id, own.id, "the attempt's intent is the oldest of its second");

    let jumped_at = advance(&app, hours(25)).await;
    app.sim()
        .set_fault(Endpoint::SearchPaymentIntents, FaultSpec::probability(FaultKind::FailBeforeApply, 1.0))
        .await
        .unwrap();
    app.sim()
        .set_fault(
            Endpoint::ListPaymentIntents,
            FaultSpec::probability(FaultKind::Latency(LIST_LATENCY_MS), 1.0),
        )
        .await
        .unwrap();

    // A second replica: its own pool and provider client, the same database, simulator and clock.
    let mut config = test_config(&app.database.url, &app.simulator.base_url());
    app.database.configure(&mut config);
    busy_lookup_settings(&mut config);
    let replica = Application::build(config, app.clock.clone()).await.unwrap();
    let started = Instant::now();
    let rounds = AtomicUsize::new(0);
    let (first, second) = tokio::join!(
        sweep_until_decided(&app.orchestrator, &app, &rounds),
        sweep_until_decided(replica.orchestrator(), &app, &rounds)
    );
    let rounds = rounds.into_inner();
    println!("swept {rounds} rounds ({} + {}) in {:?}", first.len(), second.len(), started.elapsed());
    assert!(first.iter().chain(&second).all(|pass| pass.claimed == 1));

    let log = app.sim().requests().await.unwrap();
    let key = attempt.idempotency_key.as_str();
    let creates_with_key: Vec<_> =
        log.iter().filter(|r| is_endpoint(r, "create_payment_intent") && r.idempotency_key.as_deref() == Some(key)).collect();
    assert_eq!(creates_with_key.len(), 1, "only the lost create carried the key: {creates_with_key:?}");
    assert!(creates_with_key[0].sim_time < jumped_at);

    let after_jump: Vec<&RequestLogEntry> = log.iter().filter(|r| r.sim_time >= jumped_at).collect();
    assert!(after_jump.iter().all(|r| is_endpoint(r, "search_payment_intents") || is_endpoint(r, "list_payment_intents")),
        "past the window only search and list are asked");
    // Each round searches once, then lists: in the log, a round's list calls run from its
    // search to the next one. A second round running beside it would put more than a round's
    // bound of list calls between two searches.
    let mut rounds_seen: Vec<usize> = Vec::new();
    for request in &after_jump {
        if is_endpoint(request, "search_payment_intents") {
            rounds_seen.push(0);
        } else {
            *rounds_seen.last_mut().expect("every round searches first") += 1;
        }
    }
    assert!(
        rounds_seen.iter().all(|&pages| pages <= PAGES_PER_ROUND as usize),
        "list calls per round: {rounds_seen:?}"
    );
    assert!(rounds_seen.len() > 1, "the lookup resumed across rounds: {rounds_seen:?}");
    assert_eq!(rounds_seen.len(), rounds, "one search per round claimed");

    // Pages the provider answered (a call the client gave up on has no status) must each have
    // been fetched once: a page fetched twice means two rounds listed at once, or a round
    // started over instead of resuming from the saved cursor.
    let answered: Vec<&RequestLogEntry> = after_jump
        .iter()
        .copied()
        .filter(|r| is_endpoint(r, "list_payment_intents") && r.status == Some(200))
        .collect();
    let cursors: Vec<Option<String>> = answered.iter().map(|r| r.query_param("starting_after")).collect();
    let distinct: HashSet<&Option<String>> = cursors.iter().collect();
    assert_eq!(distinct.len(), cursors.len(), "{} list pages were fetched twice", cursors.len() - distinct.len());
    assert_eq!(cursors.iter().filter(|c| c.is_none()).count(), 1, "the listing started once");
    let lists = after_jump.iter().filter(|r| is_endpoint(r, "list_payment_intents")).count();
    assert!(
        (PAGES_NEEDED..=PAGES_NEEDED + LIST_CALLS_SLACK).contains(&lists),
        "{lists} list calls for {PAGES_NEEDED} pages"
    );

    let row = stored(&app, OPERATION).await;
    assert_eq!(row.status, AttemptStatus::Succeeded);
    assert_eq!(row.provider_payment_id.as_deref(), Some(own.id.as_str()), "adopted its own intent");
    assert_eq!(row.lookup_progress, ListProgress::NotStarted, "the cursor is reset after adoption");
}

on_both_backends!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_lookup_through_20000_same_second_intents_resumes_across_rounds_and_never_overlaps,
);
