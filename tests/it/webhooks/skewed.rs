//! Instants the webhook path writes, and the cutoff it deletes by, when the process doing it has
//! a wall clock off the database's (libfaketime, a real `chargeguard serve` beside the test's
//! app on one PostgreSQL database). Each instant is compared later by another process: the
//! sweep measures a customer's time to authenticate from `action_started_at`, and retention
//! deletes inbox rows and de-duplication keys by their age. Both read the database's clock, so
//! the webhook path stamps with it too.

use std::time::Duration;

use super::{Hooked, ServeBeside, send_with_lost_answer, wait_for_child};
use crate::recovery::{advance, minutes, stored, sweep_until_idle};
use crate::support::faketime::ClockOffset;
use crate::support::{Backend, charge_request};
use chargeguard::domain::AttemptStatus;

/// Two hours: as `recovery::skew`'s replicas and the killed-worker tests.
const SKEW_MINUTES: i64 = 120;
/// The customer's time to authenticate in these tests: shorter than the skew, so a worker two
/// hours behind would have the intent cancelled at once.
const ACTION_AGE_MAX_MINUTES: u64 = 60;
/// The shortest `webhooks.retention_interval_ms` the configuration takes.
const RETENTION_INTERVAL_MS: u64 = 1_000;

/// A 3-D Secure charge whose create answer was lost (pending here, `requires_action` at the
/// provider); a real `chargeguard serve` whose clock is off by `worker_clock` applies the
/// provider's `payment_intent.requires_action` event, which records when the customer's action
/// began. Returns the app and the intent's id.
async fn requires_action_recorded_by_a_worker(
    operation: &str,
    worker_clock: ClockOffset,
) -> (Hooked, String) {
    let hooked = Hooked::spawn_backend_with(Backend::Postgres, |config| {
        config.charge.requires_action_age_max_minutes = ACTION_AGE_MAX_MINUTES;
    })
    .await;
    hooked.lose_create_answers(1).await;
    let mut request = charge_request(operation);
    request.payment_method = "pm_card_threeDSecure2Required".into();
    send_with_lost_answer(&hooked, request).await;
    hooked.flush().await;

    let mut worker = ServeBeside::start(&hooked, worker_clock, &[]);
    worker.assert_clock().await;
    let attempt = wait_for_child(
        async || stored(&hooked.app, operation).await,
        |attempt| attempt.status == AttemptStatus::RequiresAction,
        "the worker never applied the event",
    )
    .await;
    worker.process.kill().await.unwrap();
    let intent = attempt
        .provider_payment_id
        .expect("the event named the intent");
    (hooked, intent)
}

/// The intent's status at the simulator and the attempt's, after the sweep's passes, which
/// must have looked at the attempt (it is due).
async fn after_sweeping(hooked: &Hooked, operation: &str, intent: &str) -> (String, AttemptStatus) {
    let swept = sweep_until_idle(&hooked.app).await;
    assert_eq!(swept.claimed, 1, "the sweep looked at the attempt: {swept}");
    let ledger = hooked.app.sim().ledger().await.unwrap();
    let at_provider = ledger
        .payment_intents
        .iter()
        .find(|i| i.id == intent)
        .expect("the intent")
        .status
        .clone();
    (at_provider, stored(&hooked.app, operation).await.status)
}

/// A worker two hours behind the database records the action as begun two hours before it did;
/// the sweep, on the database's clock, would cancel the customer's payment while they are still
/// authenticating. It is cancelled only once the whole time has passed.
#[tokio::test]
async fn an_action_recorded_by_a_worker_whose_clock_runs_behind_is_not_cancelled_early() {
    let operation = "order-action-behind";
    let (hooked, intent) =
        requires_action_recorded_by_a_worker(operation, ClockOffset::minutes(-SKEW_MINUTES)).await;

    advance(&hooked.app, minutes(2)).await;
    assert_eq!(
        after_sweeping(&hooked, operation, &intent).await,
        ("requires_action".to_owned(), AttemptStatus::RequiresAction),
        "two minutes into the customer's action"
    );
    advance(&hooked.app, minutes(ACTION_AGE_MAX_MINUTES)).await;
    assert_eq!(
        after_sweeping(&hooked, operation, &intent).await,
        ("canceled".to_owned(), AttemptStatus::Failed),
        "past the customer's time"
    );
}

/// A worker two hours ahead records the action as begun two hours after it did; the sweep would
/// leave the intent open for two hours beyond the customer's time.
#[tokio::test]
async fn an_action_recorded_by_a_worker_whose_clock_runs_ahead_is_cancelled_on_time() {
    let operation = "order-action-ahead";
    let (hooked, intent) =
        requires_action_recorded_by_a_worker(operation, ClockOffset::minutes(SKEW_MINUTES)).await;

    advance(&hooked.app, minutes(ACTION_AGE_MAX_MINUTES + 2)).await;
    assert_eq!(
        after_sweeping(&hooked, operation, &intent).await,
        ("canceled".to_owned(), AttemptStatus::Failed),
        "past the customer's time"
    );
}

/// Processed events and their de-duplication keys aged 34 and 36 days by the database's clock,
/// with the 35-day retention: a real `chargeguard serve` two days ahead prunes the older and
/// keeps the younger. Going by its own clock it would delete keys two days early, and a resent
/// event could then be applied twice.
#[tokio::test]
async fn a_pruner_whose_clock_runs_ahead_keeps_what_is_younger_than_the_retention() {
    let hooked = Hooked::spawn().await;
    for operation in ["order-kept", "order-pruned"] {
        hooked.app.charge(charge_request(operation)).await.unwrap();
    }
    assert_eq!(hooked.deliver().await.len(), 2);
    let store = hooked.database_pool();
    for (operation, age_days) in [("order-kept", 34), ("order-pruned", 36)] {
        let intent = stored(&hooked.app, operation)
            .await
            .provider_payment_id
            .unwrap();
        for statement in [
            "UPDATE webhook_inbox SET received_at = now() - make_interval(days => $2) WHERE object_id = $1",
            "UPDATE webhook_dedup SET recorded_at = now() - make_interval(days => $2) WHERE object_id = $1",
        ] {
            let aged = sqlx::query(statement)
                .bind(&intent)
                .bind(age_days)
                .execute(store)
                .await
                .unwrap();
            assert_eq!(aged.rows_affected(), 1, "{statement}");
        }
    }

    let retention_interval_ms = RETENTION_INTERVAL_MS.to_string();
    let mut pruner = ServeBeside::start(
        &hooked,
        ClockOffset::minutes(2 * 24 * 60),
        &[(
            "CHARGEGUARD_WEBHOOKS__RETENTION_INTERVAL_MS",
            &retention_interval_ms,
        )],
    );
    pruner.assert_clock().await;
    let left = wait_for_child(
        async || left_by_retention(&hooked).await,
        |left| {
            !left
                .iter()
                .any(|(operation, _, _)| operation == "order-pruned")
        },
        "the pruner never pruned",
    )
    .await;
    // Another of its passes, had it anything more to delete.
    tokio::time::sleep(Duration::from_millis(RETENTION_INTERVAL_MS * 3 / 2)).await;
    pruner.process.kill().await.unwrap();
    assert_eq!(left, left_by_retention(&hooked).await);
    assert_eq!(
        left,
        [("order-kept".to_owned(), 1, 1)],
        "the 34-day-old event and its key are kept"
    );
}

/// Per operation whose intent still has rows: its inbox rows and its de-duplication keys.
async fn left_by_retention(hooked: &Hooked) -> Vec<(String, i64, i64)> {
    sqlx::query_as(
        "SELECT a.operation_key,
                (SELECT count(*) FROM webhook_inbox i WHERE i.object_id = a.provider_payment_id),
                (SELECT count(*) FROM webhook_dedup d WHERE d.object_id = a.provider_payment_id)
         FROM payment_attempts a
         WHERE EXISTS (SELECT 1 FROM webhook_inbox i WHERE i.object_id = a.provider_payment_id)
            OR EXISTS (SELECT 1 FROM webhook_dedup d WHERE d.object_id = a.provider_payment_id)
         ORDER BY a.operation_key",
    )
    .fetch_all(hooked.database_pool())
    .await
    .unwrap()
}
