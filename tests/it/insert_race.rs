//! `insert_pending` answers a duplicate in the same statement as the insert. When the row that
//! holds the operation commits while that statement's insert waits for it, the first read
//! could not see the row: the store must read it again rather than report nothing (SEMANTICS.md
//! invariants 1 and 3).

use std::time::Duration;

use chargeguard::grpc::proto::ChargeOutcome;
use sqlx::PgPool;

use crate::support::{TestApp, charge_request, outcome_of};

/// Bound on polling for the racing call to block on the uncommitted row.
const BLOCKED_POLLS_MAX: u32 = 500;
const BLOCKED_POLL_INTERVAL: Duration = Duration::from_millis(10);

#[tokio::test]
async fn a_call_that_waited_for_a_concurrent_insert_returns_the_row_that_won() {
    let app = TestApp::spawn().await;
    app.charge(charge_request("race-seed")).await.unwrap();
    let pool = PgPool::connect(&app.database.url).await.unwrap();

    // Another writer inserts the operation "race" (a copy of the seed's row under a new id and
    // key) and holds its transaction open.
    let winner = uuid::Uuid::new_v4();
    let mut other = pool.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO payment_attempts
         SELECT (jsonb_populate_record(NULL::payment_attempts, to_jsonb(seed) || jsonb_build_object(
             'id', $1::uuid, 'operation_key', 'race', 'idempotency_key', 'race-key'))).*
         FROM payment_attempts AS seed WHERE operation_key = 'race-seed'",
    )
    .bind(winner)
    .execute(&mut *other)
    .await
    .unwrap();

    // The same parameters as the seed's (its metadata included), under the operation "race".
    let mut request = charge_request("race-seed");
    request.operation_key = "race".to_owned();
    let call = tokio::spawn({
        let grpc = app.grpc_addr;
        async move {
            let mut client = chargeguard::grpc::proto::payments_client::PaymentsClient::connect(
                format!("http://{grpc}"),
            )
            .await
            .unwrap();
            client
                .charge(crate::support::authed(
                    crate::support::ORDERS_TOKEN,
                    request,
                ))
                .await
        }
    });

    // The call's insert now waits on the other transaction's row (a lock wait in this database).
    let mut blocked = false;
    for _ in 0..BLOCKED_POLLS_MAX {
        let (waiting,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        if waiting > 0 {
            blocked = true;
            break;
        }
        tokio::time::sleep(BLOCKED_POLL_INTERVAL).await;
    }
    assert!(
        blocked,
        "the racing call never waited for the uncommitted row"
    );
    other.commit().await.unwrap();

    let response = call.await.unwrap().unwrap().into_inner();
    assert_eq!(outcome_of(&response), ChargeOutcome::Duplicate);
    assert_eq!(response.attempt.unwrap().attempt_id, winner.to_string());
    assert_eq!(
        app.sim().ledger().await.unwrap().payment_intents.len(),
        1,
        "only the seed was charged"
    );
    assert_eq!(app.attempt_rows().await, 2);
}
