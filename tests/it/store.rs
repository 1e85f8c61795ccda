//! The `AttemptStore` contract, driven directly on both stores (`store::postgres::…`,
//! `store::sqlite::…`): the guards that keep leases exclusive and states monotonic, the claim that
//! never hands one row to two sweepers, and the keyset order of lists. These are the statements
//! whose SQL differs between the backends, so each guard is checked where it could break.

use std::collections::HashSet;
use std::sync::Arc;

use chargeguard::domain::{
    Attempt, AttemptId, AttemptStatus, ChargeParams, ConsumerName, Failure, ListProgress, NextAction,
};
use chargeguard::store::{
    AttemptStore, CallerTime, InsertOutcome, ListCursor, ListFilter, NewAttempt,
};
use chrono::{DateTime, Duration, Utc};

use crate::support::attempts::{SAFE_WINDOW_HOURS, insert_new, lease_request, owner, pending_attempt, round};
use crate::support::{Backend, TestDatabase, on_both_backends};

struct Fixture {
    store: Arc<dyn AttemptStore>,
    _database: TestDatabase,
}

async fn fixture(backend: Backend) -> Fixture {
    let database = TestDatabase::create_on(backend).await;
    Fixture {
        store: database.open_store().await,
        _database: database,
    }
}

/// The lease every insert here takes.
const INSERT_LEASE_SECONDS: i64 = 10;

/// The whole system `shift` into the future: this process's clock and the database's moved
/// together (as `OffsetClock` moves them in the app).
fn at(shift: Duration) -> CallerTime {
    CallerTime { now: Utc::now() + shift, shift }
}

/// This process's clock `skew` away from the database's, which is not moved.
fn skewed(skew: Duration) -> CallerTime {
    CallerTime { now: Utc::now() + skew, shift: Duration::zero() }
}

fn new_attempt(operation: &str, due_in: Duration, time: CallerTime) -> NewAttempt {
    pending_attempt(operation, owner(), Duration::seconds(INSERT_LEASE_SECONDS), due_in, time)
}

async fn insert(store: &dyn AttemptStore, new: &NewAttempt) -> Attempt {
    insert_new(store, new).await
}

fn assert_near(actual: DateTime<Utc>, expected: DateTime<Utc>, what: &str) {
    let apart = (actual - expected).abs();
    assert!(apart < Duration::seconds(5), "{what}: {actual} is {apart} from {expected}");
}

async fn the_first_insert_wins_and_the_row_reads_back_as_written(backend: Backend) {
    let fixture = fixture(backend).await;
    let store = fixture.store.as_ref();
    let mut new = new_attempt("op-insert", Duration::seconds(60), at(Duration::zero()));
    new.return_url = Some("https://shop.example/return".into());
    let inserted = insert(store, &new).await;
    assert_eq!(inserted.id, new.id);
    assert_eq!(inserted.status, AttemptStatus::Pending);
    assert_eq!(inserted.params, new.params, "metadata, description and amount round-trip");
    assert_eq!(inserted.return_url, new.return_url, "what is sent under the key is stored");
    assert_near(inserted.created_at, Utc::now(), "written on the database's clock");
    assert_eq!(inserted.updated_at, inserted.created_at);
    let lease = inserted.lease.unwrap();
    assert_eq!(lease.owner, new.lease_owner);
    assert_eq!(
        lease.expires_at,
        inserted.updated_at + Duration::seconds(INSERT_LEASE_SECONDS),
        "the lease counts from the write, on the database's clock"
    );
    assert_eq!(inserted.next_check_at, inserted.updated_at + Duration::seconds(60));
    assert_eq!(inserted.create_sent_until, Some(lease.expires_at), "a create may be sent under the first lease");
    assert_eq!(inserted.lookup_progress, ListProgress::NotStarted);
    assert!(!inserted.create_replays_failure);

    let mut again = new_attempt("op-insert", Duration::zero(), at(Duration::seconds(1)));
    again.params = ChargeParams {
        amount_minor: 2_000,
        ..again.params
    };
    match store.insert_pending(&again).await.unwrap() {
        InsertOutcome::Existing(existing) => {
            assert_eq!(existing, inserted, "the winner, untouched")
        }
        InsertOutcome::Inserted(attempt) => panic!("a second row {} for one operation", attempt.id),
        refused => panic!("a repeated first attempt is the existing row, not {refused:?}"),
    }
    assert_eq!(
        store.find_by_id(None, new.id).await.unwrap().unwrap(),
        inserted
    );
    let other = ConsumerName::parse("billing").unwrap();
    assert!(
        store
            .find_by_id(Some(&other), new.id)
            .await
            .unwrap()
            .is_none(),
        "scoped to its consumer"
    );
}

async fn the_key_window_starts_at_the_earliest_clock(backend: Backend) {
    let fixture = fixture(backend).await;
    let store = fixture.store.as_ref();
    // A replica whose clock runs two hours fast: the database's reading is the earlier one.
    let fast = insert(store, &new_attempt("op-fast", Duration::zero(), skewed(Duration::hours(2)))).await;
    assert_near(fast.key_window_started_at, Utc::now(), "a fast replica's clock never starts the window");
    // One whose clock runs two hours slow: its own reading is the earlier one.
    let slow_time = skewed(-Duration::hours(2));
    let slow = insert(store, &new_attempt("op-slow", Duration::zero(), slow_time)).await;
    assert_eq!(
        slow.key_window_started_at.timestamp_micros(),
        slow_time.now.timestamp_micros(),
        "the earliest reading starts the window"
    );
    assert_near(slow.created_at, Utc::now(), "created on the database's clock");
}

async fn a_lease_is_taken_only_when_free_or_expired_and_only_its_holder_finishes(backend: Backend) {
    let fixture = fixture(backend).await;
    let store = fixture.store.as_ref();
    let new = new_attempt("op-lease", Duration::seconds(60), at(Duration::zero()));
    let first_holder = new.lease_owner;
    insert(store, &new).await;

    let second = owner();
    let early = at(Duration::seconds(INSERT_LEASE_SECONDS - 3));
    assert!(
        store.acquire_lease(new.id, lease_request(second, early)).await.unwrap().is_none(),
        "held until it expires"
    );
    let fast_replica = skewed(Duration::hours(2));
    assert!(
        store.acquire_lease(new.id, lease_request(second, fast_replica)).await.unwrap().is_none(),
        "a replica whose clock runs ahead cannot take a live lease: the database's clock decides"
    );

    let after_expiry = at(Duration::seconds(INSERT_LEASE_SECONDS + 1));
    let taken = store
        .acquire_lease(new.id, lease_request(second, after_expiry))
        .await
        .unwrap()
        .expect("an expired lease is free");
    assert_eq!(taken.attempt.lease.unwrap().owner, second);
    assert_near(taken.database_now, Utc::now() + after_expiry.shift, "the statement's database reading");
    assert_eq!(taken.attempt.lease.unwrap().expires_at, taken.database_now + Duration::seconds(30));
    assert_eq!(
        taken.attempt.create_sent_until,
        Some(taken.database_now + Duration::seconds(30)),
        "a lease taken inside the window may send a create"
    );

    let result = round(AttemptStatus::Succeeded);
    assert!(
        store.finish_round(new.id, first_holder, &result, after_expiry).await.unwrap().is_none(),
        "the holder whose lease expired writes nothing"
    );
    let unchanged = store.find_by_id(None, new.id).await.unwrap().unwrap();
    assert_eq!(unchanged.status, AttemptStatus::Pending);

    let finished = store.finish_round(new.id, second, &result, after_expiry).await.unwrap().unwrap();
    assert_eq!(finished.status, AttemptStatus::Succeeded);
    assert_eq!(finished.lease, None, "finishing releases the lease");
    let later = at(Duration::seconds(INSERT_LEASE_SECONDS + 2));
    assert!(
        store.acquire_lease(new.id, lease_request(owner(), later)).await.unwrap().is_none(),
        "a terminal row is never leased"
    );
}

async fn a_lease_past_the_window_never_widens_the_send_range(backend: Backend) {
    let fixture = fixture(backend).await;
    let store = fixture.store.as_ref();
    let new = new_attempt("op-window", Duration::zero(), at(Duration::zero()));
    let inserted = insert(store, &new).await;
    let past_window = at(Duration::hours(SAFE_WINDOW_HOURS) + Duration::minutes(1));
    let holder = owner();
    let taken = store.acquire_lease(new.id, lease_request(holder, past_window)).await.unwrap().unwrap();
    assert_eq!(
        taken.attempt.create_sent_until, inserted.create_sent_until,
        "no create is sent past the window, so its lease does not count"
    );
    // Renewing keeps the lease and saves a lookup's place.
    let progress = ListProgress::After("pi_42".into());
    assert!(store.renew_lease(new.id, holder, Duration::seconds(30), &progress, past_window).await.unwrap());
    let renewed = store.find_by_id(None, new.id).await.unwrap().unwrap();
    assert_eq!(renewed.lookup_progress, progress);
    assert!(renewed.lease.unwrap().expires_at >= taken.attempt.lease.unwrap().expires_at);
    assert!(
        !store.renew_lease(new.id, owner(), Duration::seconds(30), &progress, past_window).await.unwrap(),
        "only the holder renews"
    );
    let mut result = round(AttemptStatus::Pending);
    result.create_replays_failure = true;
    result.lookup_progress = Some(ListProgress::Complete);
    let written = store.finish_round(new.id, holder, &result, past_window).await.unwrap().unwrap();
    assert!(written.create_replays_failure);
    assert_eq!(written.lookup_progress, ListProgress::Complete);
    assert_eq!(written.next_check_at, written.updated_at + Duration::seconds(60));
    let holder = owner();
    let later = at(Duration::hours(SAFE_WINDOW_HOURS) + Duration::minutes(3));
    store.acquire_lease(new.id, lease_request(holder, later)).await.unwrap().unwrap();
    let written = store.finish_round(new.id, holder, &round(AttemptStatus::Pending), later).await.unwrap().unwrap();
    assert!(written.create_replays_failure, "a replayed failure is never forgotten");
    assert_eq!(written.lookup_progress, ListProgress::Complete, "None leaves the progress alone");
}

async fn review_reasons_add_up_and_a_recheck_keeps_them(backend: Backend) {
    let fixture = fixture(backend).await;
    let store = fixture.store.as_ref();
    let new = new_attempt("op-review", Duration::hours(1), at(Duration::zero()));
    insert(store, &new).await;
    assert!(store.clear_review(new.id, at(Duration::zero())).await.unwrap().is_none(), "not flagged");
    let mut first = round(AttemptStatus::Pending);
    first.review_reason = Some("first reason".into());
    store.finish_round(new.id, new.lease_owner, &first, at(Duration::zero())).await.unwrap().unwrap();
    let holder = owner();
    store.acquire_lease(new.id, lease_request(holder, at(Duration::zero()))).await.unwrap().unwrap();
    let mut second = round(AttemptStatus::Pending);
    second.review_reason = Some("second reason".into());
    let flagged = store.finish_round(new.id, holder, &second, at(Duration::zero())).await.unwrap().unwrap();
    assert_eq!(flagged.review_reason.as_deref(), Some("first reason; second reason"), "kept, not overwritten");
    let cleared = store.clear_review(new.id, at(Duration::zero())).await.unwrap().unwrap();
    assert_eq!(cleared.review_reason, None);
    assert_eq!(cleared.review_history.as_deref(), Some("first reason; second reason"));
    assert_eq!(cleared.next_check_at, cleared.updated_at, "due at once");
}

async fn finish_round_moves_status_only_forward(backend: Backend) {
    let fixture = fixture(backend).await;
    let store = fixture.store.as_ref();
    let new = new_attempt("op-forward", Duration::seconds(60), at(Duration::zero()));
    insert(store, &new).await;
    let now = at(Duration::seconds(1));

    let mut needs_action = round(AttemptStatus::RequiresAction);
    needs_action.provider_payment_id = Some("pi_1".into());
    needs_action.provider_status = Some("requires_action".into());
    needs_action.next_action = Some(NextAction {
        kind: "redirect_to_url".into(),
        redirect_url: Some("https://x".into()),
    });
    let written = store
        .finish_round(new.id, new.lease_owner, &needs_action, now)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(written.status, AttemptStatus::RequiresAction);
    assert_eq!(written.next_action, needs_action.next_action);
    assert_eq!(written.action_started_at, Some(written.updated_at), "the customer's time starts now");

    // A late, stale answer says "pending" with a failure: the status does not move back, and
    // the fields guarded by the move keep their values; the provider's status is still news.
    let holder = owner();
    store.acquire_lease(new.id, lease_request(holder, now)).await.unwrap().unwrap();
    let mut stale = round(AttemptStatus::Pending);
    stale.provider_payment_id = Some("pi_other".into());
    stale.provider_status = Some("processing".into());
    stale.failure = Some(Failure {
        code: "card_declined".into(),
        message: "no".into(),
    });
    let kept = store
        .finish_round(new.id, holder, &stale, at(Duration::seconds(2)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(kept.status, AttemptStatus::RequiresAction);
    assert_eq!(kept.failure, None);
    assert_eq!(kept.next_action, needs_action.next_action);
    assert_eq!(kept.action_started_at, written.action_started_at, "still the first request for action");
    assert_eq!(
        kept.provider_payment_id.as_deref(),
        Some("pi_1"),
        "the first known object stays"
    );
    assert_eq!(kept.provider_status.as_deref(), Some("processing"));
    assert_eq!(kept.check_count, 2);
    assert_eq!(kept.provider_calls, 2);

    let holder = owner();
    store.acquire_lease(new.id, lease_request(holder, now)).await.unwrap().unwrap();
    let mut declined = round(AttemptStatus::Failed);
    declined.failure = Some(Failure {
        code: "card_declined".into(),
        message: "declined".into(),
    });
    declined.provider_status = Some("requires_payment_method".into());
    let failed = store
        .finish_round(new.id, holder, &declined, now)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(failed.status, AttemptStatus::Failed);
    assert_eq!(failed.failure, declined.failure);
    assert_eq!(
        failed.next_action, None,
        "the move to a terminal state clears the action"
    );
    assert_eq!(
        failed.provider_status.as_deref(),
        Some("requires_payment_method")
    );
}

async fn concurrent_claimers_never_get_the_same_row(backend: Backend) {
    let fixture = fixture(backend).await;
    let store = fixture.store.as_ref();
    let mut due = HashSet::new();
    for index in 0..24 {
        // Inserted in order, each due 5 s after its write, so the claim order is known.
        let new = new_attempt(&format!("op-due-{index}"), Duration::seconds(5), at(Duration::zero()));
        due.insert(insert(store, &new).await.id);
    }
    let later = new_attempt("op-not-due", Duration::hours(1), at(Duration::zero()));
    let not_due = insert(store, &later).await.id;
    let finished = new_attempt("op-finished", Duration::zero(), at(Duration::zero()));
    insert(store, &finished).await;
    store
        .finish_round(finished.id, finished.lease_owner, &round(AttemptStatus::Succeeded), at(Duration::zero()))
        .await
        .unwrap()
        .unwrap();

    // Every insert's lease runs out 10 s after its write; claim after that.
    let now = at(Duration::seconds(INSERT_LEASE_SECONDS + 5));
    let first = store.claim_due(lease_request(owner(), now), 1).await.unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!(
        first[0].attempt.operation_key.as_str(),
        "op-due-0",
        "the longest due first"
    );

    let claimers = (0..4).map(|_| store.claim_due(lease_request(owner(), now), 5));
    let batches = futures::future::join_all(claimers).await;
    let mut claimed: Vec<AttemptId> = first.iter().map(|leased| leased.attempt.id).collect();
    for batch in batches {
        let batch = batch.unwrap();
        assert!(batch.len() <= 5, "a batch is bounded");
        claimed.extend(batch.iter().map(|leased| leased.attempt.id));
    }
    let rest = store.claim_due(lease_request(owner(), now), 100).await.unwrap();
    claimed.extend(rest.iter().map(|leased| leased.attempt.id));
    let distinct: HashSet<AttemptId> = claimed.iter().copied().collect();
    assert_eq!(distinct.len(), claimed.len(), "no row was claimed twice");
    assert_eq!(distinct, due, "every due row, and only due rows, claimed");
    assert!(!distinct.contains(&not_due));
    assert!(
        store.claim_due(lease_request(owner(), now), 100).await.unwrap().is_empty(),
        "claimed rows stay leased"
    );
    assert!(
        store.claim_due(lease_request(owner(), skewed(Duration::hours(3))), 100).await.unwrap().is_empty(),
        "a replica whose clock runs ahead sees neither leases expired nor rows due early"
    );
}

async fn lists_are_newest_first_with_ties_broken_by_id(backend: Backend) {
    let fixture = fixture(backend).await;
    let store = fixture.store.as_ref();
    let mut inserted = Vec::new();
    for index in 0..7 {
        // Inserted concurrently in pairs, so that some may share a created_at; the id decides.
        let new = new_attempt(&format!("op-list-{index}"), Duration::zero(), at(Duration::zero()));
        inserted.push(insert(store, &new).await);
    }
    let mut expected = inserted.clone();
    expected.sort_by_key(|attempt| std::cmp::Reverse((attempt.created_at, attempt.id)));
    let consumer = ConsumerName::parse("orders").unwrap();

    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = store
            .list(&consumer, &ListFilter::default(), after, 3)
            .await
            .unwrap();
        assert!(page.len() <= 3);
        let Some(last) = page.last() else { break };
        after = Some(ListCursor {
            created_at: last.created_at,
            id: last.id,
        });
        seen.extend(page.iter().map(|attempt| attempt.id));
    }
    let expected_ids: Vec<AttemptId> = expected.iter().map(|attempt| attempt.id).collect();
    assert_eq!(seen, expected_ids);

    let mut by_creation = inserted.clone();
    by_creation.sort_by_key(|attempt| (attempt.created_at, attempt.id));
    let (from, to) = (by_creation[1].created_at, by_creation[5].created_at);
    let window = ListFilter {
        status: Some(AttemptStatus::Pending),
        created_from: Some(from),
        created_to: Some(to),
        ..ListFilter::default()
    };
    let in_window = store.list(&consumer, &window, None, 100).await.unwrap();
    let in_window: Vec<AttemptId> = in_window.iter().map(|attempt| attempt.id).collect();
    let expected_window: Vec<AttemptId> = expected
        .iter()
        .filter(|attempt| attempt.created_at >= from && attempt.created_at < to)
        .map(|attempt| attempt.id)
        .collect();
    assert!(!expected_window.is_empty());
    assert_eq!(in_window, expected_window, "created_from inclusive, created_to exclusive");
    let failed = ListFilter {
        status: Some(AttemptStatus::Failed),
        ..ListFilter::default()
    };
    assert!(
        store
            .list(&consumer, &failed, None, 100)
            .await
            .unwrap()
            .is_empty()
    );
}

async fn the_oldest_unfinished_attempt_is_found_among_unfinished_ones_only(backend: Backend) {
    let fixture = fixture(backend).await;
    let store = fixture.store.as_ref();
    assert_eq!(store.oldest_unfinished_created_at().await.unwrap(), None);
    let oldest = new_attempt("op-oldest", Duration::zero(), at(Duration::zero()));
    let oldest_row = insert(store, &oldest).await;
    let newer = insert(store, &new_attempt("op-newer", Duration::zero(), at(Duration::seconds(30)))).await;
    assert_eq!(
        store.oldest_unfinished_created_at().await.unwrap(),
        Some(oldest_row.created_at)
    );
    store
        .finish_round(oldest.id, oldest.lease_owner, &round(AttemptStatus::Failed), at(Duration::zero()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        store.oldest_unfinished_created_at().await.unwrap(),
        Some(newer.created_at),
        "finished rows do not count"
    );
}

on_both_backends!(
    the_first_insert_wins_and_the_row_reads_back_as_written,
    the_key_window_starts_at_the_earliest_clock,
    a_lease_is_taken_only_when_free_or_expired_and_only_its_holder_finishes,
    a_lease_past_the_window_never_widens_the_send_range,
    review_reasons_add_up_and_a_recheck_keeps_them,
    finish_round_moves_status_only_forward,
    concurrent_claimers_never_get_the_same_row,
    lists_are_newest_first_with_ties_broken_by_id,
    the_oldest_unfinished_attempt_is_found_among_unfinished_ones_only,
);
