//! The `AttemptStore` contract, driven directly on both stores (`store::postgres::…`,
//! `store::sqlite::…`): the guards that keep leases exclusive and states monotonic, the claim that
//! never hands one row to two sweepers, and the keyset order of lists. These are the statements
//! whose SQL differs between the backends, so each guard is checked where it could break.

use std::collections::HashSet;
use std::sync::Arc;

use chargeguard::domain::{
    Attempt, AttemptId, AttemptStatus, ChargeParams, ConsumerName, Failure, Lease, LeaseOwner,
    NextAction,
};
use chargeguard::store::{
    AttemptStore, InsertOutcome, ListCursor, ListFilter, NewAttempt, RoundResult,
};
use chrono::{DateTime, Duration, DurationRound, Utc};
use uuid::Uuid;

use crate::support::attempts::{insert_new, pending_attempt};
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

/// A fixed instant with nanoseconds, so that truncation to the stores' microseconds shows.
fn t0() -> DateTime<Utc> {
    DateTime::from_timestamp(1_790_000_000, 123_456_789).unwrap()
}

fn micros(instant: DateTime<Utc>) -> DateTime<Utc> {
    instant.duration_trunc(Duration::microseconds(1)).unwrap()
}

fn lease(expires_at: DateTime<Utc>) -> Lease {
    Lease {
        owner: LeaseOwner::from_uuid(Uuid::new_v4()),
        expires_at,
    }
}

fn new_attempt(operation: &str, now: DateTime<Utc>, next_check_at: DateTime<Utc>) -> NewAttempt {
    pending_attempt(
        operation,
        lease(now + Duration::seconds(10)),
        now,
        next_check_at,
    )
}

async fn insert(store: &dyn AttemptStore, new: &NewAttempt) -> Attempt {
    insert_new(store, new).await
}

fn round(status: AttemptStatus, next_check_at: DateTime<Utc>) -> RoundResult {
    RoundResult {
        status,
        provider_payment_id: None,
        provider_status: None,
        failure: None,
        next_action: None,
        review_reason: None,
        calls_made: 1,
        next_check_at,
        last_error: None,
    }
}

async fn the_first_insert_wins_and_the_row_reads_back_as_written(backend: Backend) {
    let fixture = fixture(backend).await;
    let store = fixture.store.as_ref();
    let new = new_attempt("op-insert", t0(), t0() + Duration::seconds(60));
    let inserted = insert(store, &new).await;
    assert_eq!(inserted.id, new.id);
    assert_eq!(inserted.status, AttemptStatus::Pending);
    assert_eq!(
        inserted.params, new.params,
        "metadata, description and amount round-trip"
    );
    assert_eq!(
        inserted.created_at,
        micros(t0()),
        "instants are kept to the microsecond"
    );
    assert_eq!(inserted.key_window_started_at, micros(t0()));
    assert_eq!(inserted.lease.unwrap().owner, new.lease.owner);
    assert_eq!(
        inserted.lease.unwrap().expires_at,
        micros(new.lease.expires_at)
    );

    let mut again = new_attempt("op-insert", t0() + Duration::seconds(1), t0());
    again.params = ChargeParams {
        amount_minor: 2_000,
        ..again.params
    };
    match store.insert_pending(&again).await.unwrap() {
        InsertOutcome::Existing(existing) => {
            assert_eq!(existing, inserted, "the winner, untouched")
        }
        InsertOutcome::Inserted(attempt) => panic!("a second row {} for one operation", attempt.id),
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

async fn a_lease_is_taken_only_when_free_or_expired_and_only_its_holder_finishes(backend: Backend) {
    let fixture = fixture(backend).await;
    let store = fixture.store.as_ref();
    let new = new_attempt("op-lease", t0(), t0() + Duration::seconds(60));
    let first_holder = new.lease;
    insert(store, &new).await;

    let early = t0() + Duration::seconds(9);
    let second = lease(early + Duration::seconds(10));
    assert!(
        store
            .acquire_lease(new.id, second, early)
            .await
            .unwrap()
            .is_none(),
        "held until it expires"
    );

    let expired_at = first_holder.expires_at;
    let second = lease(expired_at + Duration::seconds(10));
    let taken = store
        .acquire_lease(new.id, second, expired_at)
        .await
        .unwrap()
        .expect("an expired lease is free");
    assert_eq!(taken.lease.unwrap().owner, second.owner);

    let result = round(AttemptStatus::Succeeded, expired_at);
    assert!(
        store
            .finish_round(new.id, first_holder.owner, &result, expired_at)
            .await
            .unwrap()
            .is_none(),
        "the holder whose lease expired writes nothing"
    );
    let unchanged = store.find_by_id(None, new.id).await.unwrap().unwrap();
    assert_eq!(unchanged.status, AttemptStatus::Pending);

    let finished = store
        .finish_round(new.id, second.owner, &result, expired_at)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(finished.status, AttemptStatus::Succeeded);
    assert_eq!(finished.lease, None, "finishing releases the lease");
    let later = expired_at + Duration::seconds(1);
    let third = lease(later + Duration::seconds(10));
    assert!(
        store
            .acquire_lease(new.id, third, later)
            .await
            .unwrap()
            .is_none(),
        "a terminal row is never leased"
    );
}

async fn finish_round_moves_status_only_forward(backend: Backend) {
    let fixture = fixture(backend).await;
    let store = fixture.store.as_ref();
    let new = new_attempt("op-forward", t0(), t0() + Duration::seconds(60));
    insert(store, &new).await;
    let now = t0() + Duration::seconds(1);

    let mut needs_action = round(AttemptStatus::RequiresAction, now);
    needs_action.provider_payment_id = Some("pi_1".into());
    needs_action.provider_status = Some("requires_action".into());
    needs_action.next_action = Some(NextAction {
        kind: "redirect_to_url".into(),
        redirect_url: Some("https://x".into()),
    });
    let written = store
        .finish_round(new.id, new.lease.owner, &needs_action, now)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(written.status, AttemptStatus::RequiresAction);
    assert_eq!(written.next_action, needs_action.next_action);

    // A late, stale answer says "pending" with a failure: the status does not move back, and
    // the fields guarded by the move keep their values; the provider's status is still news.
    let holder = lease(now + Duration::seconds(10));
    store
        .acquire_lease(new.id, holder, now)
        .await
        .unwrap()
        .unwrap();
    let mut stale = round(AttemptStatus::Pending, now);
    stale.provider_payment_id = Some("pi_other".into());
    stale.provider_status = Some("processing".into());
    stale.failure = Some(Failure {
        code: "card_declined".into(),
        message: "no".into(),
    });
    let kept = store
        .finish_round(new.id, holder.owner, &stale, now)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(kept.status, AttemptStatus::RequiresAction);
    assert_eq!(kept.failure, None);
    assert_eq!(kept.next_action, needs_action.next_action);
    assert_eq!(
        kept.provider_payment_id.as_deref(),
        Some("pi_1"),
        "the first known object stays"
    );
    assert_eq!(kept.provider_status.as_deref(), Some("processing"));
    assert_eq!(kept.check_count, 2);
    assert_eq!(kept.provider_calls, 2);

    let holder = lease(now + Duration::seconds(10));
    store
        .acquire_lease(new.id, holder, now)
        .await
        .unwrap()
        .unwrap();
    let mut declined = round(AttemptStatus::Failed, now);
    declined.failure = Some(Failure {
        code: "card_declined".into(),
        message: "declined".into(),
    });
    declined.provider_status = Some("requires_payment_method".into());
    let failed = store
        .finish_round(new.id, holder.owner, &declined, now)
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
    let due_at = t0() + Duration::seconds(5);
    let mut due = HashSet::new();
    for index in 0..24 {
        // Due in insertion order, one millisecond apart, so the claim order is known.
        let new = new_attempt(
            &format!("op-due-{index}"),
            t0(),
            due_at + Duration::milliseconds(index),
        );
        due.insert(insert(store, &new).await.id);
    }
    let later = new_attempt("op-not-due", t0(), due_at + Duration::hours(1));
    let not_due = insert(store, &later).await.id;
    let finished = new_attempt("op-finished", t0(), due_at);
    insert(store, &finished).await;
    store
        .finish_round(
            finished.id,
            finished.lease.owner,
            &round(AttemptStatus::Succeeded, due_at),
            t0(),
        )
        .await
        .unwrap()
        .unwrap();

    // Every insert's lease ran out at t0 + 10 s; claim after that.
    let now = t0() + Duration::seconds(11);
    let first = store
        .claim_due(lease(now + Duration::seconds(30)), now, 1)
        .await
        .unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!(
        first[0].operation_key.as_str(),
        "op-due-0",
        "the longest due first"
    );

    let claimers = (0..4).map(|_| store.claim_due(lease(now + Duration::seconds(30)), now, 5));
    let batches = futures::future::join_all(claimers).await;
    let mut claimed: Vec<AttemptId> = first.iter().map(|attempt| attempt.id).collect();
    for batch in batches {
        let batch = batch.unwrap();
        assert!(batch.len() <= 5, "a batch is bounded");
        claimed.extend(batch.iter().map(|attempt| attempt.id));
    }
    let rest = store
        .claim_due(lease(now + Duration::seconds(30)), now, 100)
        .await
        .unwrap();
    claimed.extend(rest.iter().map(|attempt| attempt.id));
    let distinct: HashSet<AttemptId> = claimed.iter().copied().collect();
    assert_eq!(distinct.len(), claimed.len(), "no row was claimed twice");
    assert_eq!(distinct, due, "every due row, and only due rows, claimed");
    assert!(!distinct.contains(&not_due));
    assert!(
        store
            .claim_due(lease(now + Duration::seconds(30)), now, 100)
            .await
            .unwrap()
            .is_empty(),
        "claimed rows stay leased"
    );
}

async fn lists_are_newest_first_with_ties_broken_by_id(backend: Backend) {
    let fixture = fixture(backend).await;
    let store = fixture.store.as_ref();
    let mut inserted = Vec::new();
    for index in 0..7 {
        // Pairs share a created_at to the microsecond; the id decides between them.
        let created_at = t0() + Duration::microseconds(index / 2);
        let new = new_attempt(&format!("op-list-{index}"), created_at, created_at);
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

    let window = ListFilter {
        status: Some(AttemptStatus::Pending),
        created_from: Some(t0() + Duration::microseconds(1)),
        created_to: Some(t0() + Duration::microseconds(3)),
    };
    let in_window = store.list(&consumer, &window, None, 100).await.unwrap();
    let in_window: Vec<AttemptId> = in_window.iter().map(|attempt| attempt.id).collect();
    assert_eq!(
        in_window,
        expected_ids[1..5].to_vec(),
        "created_from inclusive, created_to exclusive"
    );
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
    let oldest = new_attempt("op-oldest", t0(), t0());
    insert(store, &oldest).await;
    let newer = t0() + Duration::seconds(30);
    insert(store, &new_attempt("op-newer", newer, newer)).await;
    assert_eq!(
        store.oldest_unfinished_created_at().await.unwrap(),
        Some(micros(t0()))
    );
    store
        .finish_round(
            oldest.id,
            oldest.lease.owner,
            &round(AttemptStatus::Failed, t0()),
            t0(),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        store.oldest_unfinished_created_at().await.unwrap(),
        Some(micros(newer)),
        "finished rows do not count"
    );
}

on_both_backends!(
    the_first_insert_wins_and_the_row_reads_back_as_written,
    a_lease_is_taken_only_when_free_or_expired_and_only_its_holder_finishes,
    finish_round_moves_status_only_forward,
    concurrent_claimers_never_get_the_same_row,
    lists_are_newest_first_with_ties_broken_by_id,
    the_oldest_unfinished_attempt_is_found_among_unfinished_ones_only,
);
