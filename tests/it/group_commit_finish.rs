//! The finish batch (`finish_rounds`, migration 20261206000001) against the single-row finish
//! (`finish_round_statement`): a batch of one row runs the single statement, so only a batch of
//! several rows reaches the function's copy of the monotonic guard (SEMANTICS.md invariant 8)
//! and of the lease check. Each round's result is written twice, on twin rows set up alike —
//! once alone, once in one batch with the others — and each twin must come out the same, with
//! the guard's refusals (a stale round, a round after a webhook's success, a lost lease) kept.
//! (A success undone would also trip the trigger of migration 20261204000004: the batch would
//! then fall back to one statement per row, which the one-transaction check below catches.)

use std::sync::Arc;

use chargeguard::domain::{
    Attempt, AttemptStatus, Failure, LeaseOwner, ListProgress, NextAction,
};
use chargeguard::store::{AttemptStore, RoundResult};
use chrono::Duration;
use sqlx::PgPool;
use uuid::Uuid;

use crate::group_commit::{QUEUE_SETTLE, lock_writes, wait_for_a_blocked_batch};
use crate::support::attempts::{insert_new, lease_request, new_attempt, now, owner, round};
use crate::support::{Backend, TestDatabase};

/// The state a row is in when its round's result arrives.
#[derive(Clone, Copy, Debug)]
enum Before {
    /// Just inserted; the round's holder has the insert's lease.
    Pending,
    /// An earlier round asked the customer to act; this round's holder took the lease again.
    RequiresAction,
    /// A webhook recorded the success while this round held the lease.
    SucceededByWebhook,
    /// Another holder took the lease after this round's expired: this round's write is refused.
    LeaseLost,
}

struct Scenario {
    name: &'static str,
    before: Before,
    result: RoundResult,
}

fn scenarios() -> Vec<Scenario> {
    let mut needs_action = round(AttemptStatus::RequiresAction);
    needs_action.provider_payment_id = Some("pi_action".into());
    needs_action.provider_status = Some("requires_action".into());
    needs_action.next_action =
        Some(NextAction { kind: "redirect_to_url".into(), redirect_url: Some("https://bank.example/3ds".into()) });

    let mut stale = round(AttemptStatus::Pending);
    stale.provider_payment_id = Some("pi_other".into());
    stale.provider_status = Some("processing".into());
    stale.failure = Some(Failure { code: "card_declined".into(), message: "stale".into() });
    stale.review_reason = Some("stale answer".into());

    let mut late_decline = round(AttemptStatus::Failed);
    late_decline.provider_payment_id = Some("pi_late".into());
    late_decline.provider_status = Some("requires_payment_method".into());
    late_decline.failure = Some(Failure { code: "card_declined".into(), message: "late".into() });

    let mut declined = round(AttemptStatus::Failed);
    declined.provider_payment_id = Some("pi_declined".into());
    declined.provider_status = Some("requires_payment_method".into());
    declined.failure = Some(Failure { code: "card_declined".into(), message: "declined".into() });
    declined.create_replays_failure = true;
    declined.lookup_progress = Some(ListProgress::After("pi_cursor".into()));

    let mut unknown = RoundResult::unchanged(
        AttemptStatus::Pending,
        2,
        Duration::seconds(90),
        Some("provider timed out".into()),
    );
    unknown.lookup_progress = Some(ListProgress::Complete);
    unknown.review_reason = Some("key window closing".into());

    let mut succeeded = round(AttemptStatus::Succeeded);
    succeeded.provider_payment_id = Some("pi_won".into());
    succeeded.provider_status = Some("succeeded".into());

    vec![
        Scenario { name: "pending to requires_action", before: Before::Pending, result: needs_action },
        Scenario { name: "stale pending after requires_action", before: Before::RequiresAction, result: stale },
        Scenario { name: "late decline after a webhook's success", before: Before::SucceededByWebhook, result: late_decline },
        Scenario { name: "pending to failed", before: Before::Pending, result: declined },
        Scenario { name: "still unknown", before: Before::Pending, result: unknown },
        Scenario { name: "lease lost", before: Before::LeaseLost, result: succeeded },
    ]
}

/// A row set up in `before`; returns it with the owner whose round finishes it.
async fn set_up(store: &dyn AttemptStore, pool: &PgPool, operation: &str, before: Before) -> (Attempt, LeaseOwner) {
    let holder = owner();
    let inserted = insert_new(store, &new_attempt(operation, holder)).await;
    match before {
        Before::Pending => (inserted, holder),
        Before::RequiresAction => {
            let mut earlier = round(AttemptStatus::RequiresAction);
            earlier.provider_payment_id = Some("pi_first".into());
            earlier.provider_status = Some("requires_action".into());
            earlier.next_action = Some(NextAction { kind: "redirect_to_url".into(), redirect_url: Some("https://x".into()) });
            store.finish_round(inserted.id, holder, &earlier, now()).await.unwrap().expect("the insert's holder");
            let next = owner();
            store.acquire_lease(inserted.id, lease_request(next, now())).await.unwrap().expect("the lease is free");
            (inserted, next)
        }
        Before::SucceededByWebhook => {
            sqlx::query(
                "UPDATE payment_attempts SET status = 'succeeded', provider_payment_id = 'pi_hook',
                     provider_status = 'succeeded' WHERE id = $1",
            )
            .bind(inserted.id.as_uuid())
            .execute(pool)
            .await
            .unwrap();
            (inserted, holder)
        }
        Before::LeaseLost => {
            sqlx::query("UPDATE payment_attempts SET lease_owner = $2 WHERE id = $1")
                .bind(inserted.id.as_uuid())
                .bind(Uuid::new_v4())
                .execute(pool)
                .await
                .unwrap();
            (inserted, holder)
        }
    }
}

/// What a finish decides about a row: everything but its identity and its instants (the twins
/// are written at different times), with the instants the finish sets kept as durations.
#[derive(Debug, PartialEq)]
struct Written {
    status: AttemptStatus,
    provider_payment_id: Option<String>,
    provider_status: Option<String>,
    failure: Option<Failure>,
    next_action: Option<NextAction>,
    review_reason: Option<String>,
    provider_calls: u32,
    check_count: u32,
    last_error: Option<String>,
    create_replays_failure: bool,
    lookup_progress: ListProgress,
    leased: bool,
    action_started: bool,
    next_check_after_update_s: i64,
}

fn written(attempt: &Attempt) -> Written {
    Written {
        status: attempt.status,
        provider_payment_id: attempt.provider_payment_id.clone(),
        provider_status: attempt.provider_status.clone(),
        failure: attempt.failure.clone(),
        next_action: attempt.next_action.clone(),
        review_reason: attempt.review_reason.clone(),
        provider_calls: attempt.provider_calls,
        check_count: attempt.check_count,
        last_error: attempt.last_error.clone(),
        create_replays_failure: attempt.create_replays_failure,
        lookup_progress: attempt.lookup_progress.clone(),
        leased: attempt.lease.is_some(),
        action_started: attempt.action_started_at.is_some(),
        next_check_after_update_s: (attempt.next_check_at - attempt.updated_at).num_seconds(),
    }
}

async fn read(store: &dyn AttemptStore, attempt: &Attempt) -> Attempt {
    store.find_by_id(None, attempt.id).await.unwrap().expect("the row is there")
}

#[tokio::test]
async fn a_finish_batch_writes_each_row_as_its_finish_alone_would_and_never_moves_one_backwards() {
    let database = TestDatabase::create_on(Backend::Postgres).await;
    let store: Arc<dyn AttemptStore> = database.open_store().await;
    let pool = PgPool::connect(&database.url).await.unwrap();
    let scenarios = scenarios();

    // Alone: one finish at a time, each a batch of one (the single-row statement).
    let mut alone = Vec::new();
    for (index, scenario) in scenarios.iter().enumerate() {
        let (row, holder) = set_up(store.as_ref(), &pool, &format!("alone-{index}"), scenario.before).await;
        let answer = store.finish_round(row.id, holder, &scenario.result, now()).await.unwrap();
        alone.push((answer, read(store.as_ref(), &row).await));
    }

    // Batched: the twins' finishes queue behind a finish held on a write lock, and go together.
    let mut twins = Vec::new();
    for (index, scenario) in scenarios.iter().enumerate() {
        twins.push(set_up(store.as_ref(), &pool, &format!("batched-{index}"), scenario.before).await);
    }
    let (probe, probe_holder) = set_up(store.as_ref(), &pool, "probe", Before::Pending).await;
    let lock = lock_writes(&pool).await;
    let held = {
        let store = Arc::clone(&store);
        tokio::spawn(async move { store.finish_round(probe.id, probe_holder, &round(AttemptStatus::Failed), now()).await })
    };
    wait_for_a_blocked_batch(&pool).await;
    let finishes: Vec<_> = twins
        .iter()
        .zip(&scenarios)
        .map(|((row, holder), scenario)| {
            let (store, id, holder, result) = (Arc::clone(&store), row.id, *holder, scenario.result.clone());
            tokio::spawn(async move { store.finish_round(id, holder, &result, now()).await })
        })
        .collect();
    tokio::time::sleep(QUEUE_SETTLE).await;
    lock.commit().await.unwrap();
    held.await.unwrap().unwrap().expect("the probe's holder");
    let mut batched = Vec::new();
    for (finish, (row, _)) in finishes.into_iter().zip(&twins) {
        let answer = finish.await.unwrap().unwrap();
        batched.push((answer, read(store.as_ref(), row).await));
    }

    // They went as one statement: the rows it changed carry one transaction id, not the probe's.
    let updated: Vec<Uuid> = twins
        .iter()
        .zip(&scenarios)
        .filter(|(_, scenario)| !matches!(scenario.before, Before::LeaseLost))
        .map(|((row, _), _)| row.id.as_uuid())
        .collect();
    let transactions: Vec<String> =
        sqlx::query_scalar("SELECT DISTINCT xmin::text FROM payment_attempts WHERE id = ANY($1)")
            .bind(&updated)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(transactions.len(), 1, "the twins' finishes went in {} transactions", transactions.len());

    for ((scenario, (alone_answer, alone_row)), (batched_answer, batched_row)) in
        scenarios.iter().zip(&alone).zip(&batched)
    {
        let name = scenario.name;
        assert_eq!(
            alone_answer.as_ref().map(written),
            batched_answer.as_ref().map(written),
            "{name}: the answer differs from the finish alone"
        );
        assert_eq!(written(alone_row), written(batched_row), "{name}: the row differs from the finish alone");
    }

    // And what both wrote is the guard's, not merely the same.
    let by_name = |name: &str| {
        let index = scenarios.iter().position(|scenario| scenario.name == name).unwrap();
        (&batched[index].0, &batched[index].1)
    };
    let (_, forward) = by_name("pending to requires_action");
    assert_eq!(forward.status, AttemptStatus::RequiresAction);
    assert!(forward.action_started_at.is_some(), "the customer's time starts");
    let (_, stale) = by_name("stale pending after requires_action");
    assert_eq!(stale.status, AttemptStatus::RequiresAction, "never back to pending");
    assert_eq!(stale.failure, None, "the guarded fields keep their values");
    assert_eq!(stale.provider_payment_id.as_deref(), Some("pi_first"), "the first known object stays");
    assert_eq!(stale.provider_status.as_deref(), Some("processing"), "an unfinished row takes the provider's news");
    assert_eq!(stale.review_reason.as_deref(), Some("stale answer"));
    let (_, webhook) = by_name("late decline after a webhook's success");
    assert_eq!(webhook.status, AttemptStatus::Succeeded, "success is never undone");
    assert_eq!(webhook.failure, None);
    assert_eq!(webhook.provider_payment_id.as_deref(), Some("pi_hook"));
    assert_eq!(webhook.provider_status.as_deref(), Some("succeeded"), "a terminal row keeps its provider status");
    let (_, declined) = by_name("pending to failed");
    assert_eq!(declined.status, AttemptStatus::Failed);
    assert!(declined.create_replays_failure);
    assert_eq!(declined.lookup_progress, ListProgress::After("pi_cursor".into()));
    let (_, unknown) = by_name("still unknown");
    assert_eq!(unknown.status, AttemptStatus::Pending);
    assert_eq!(unknown.provider_calls, 2);
    assert_eq!(unknown.last_error.as_deref(), Some("provider timed out"));
    assert_eq!((unknown.next_check_at - unknown.updated_at).num_seconds(), 90);
    let (lost_answer, lost) = by_name("lease lost");
    assert!(lost_answer.is_none(), "a lost lease's round is refused");
    assert_eq!(lost.status, AttemptStatus::Pending);
    assert_eq!(lost.check_count, 0, "nothing of the refused round was written");
    assert!(lost.lease.is_some(), "the other holder keeps its lease");
}
