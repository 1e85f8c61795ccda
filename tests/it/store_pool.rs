//! The pool does not ping a busy connection before each statement (that doubled the round trips
//! of a charge). A pooled connection that broke meanwhile therefore fails its statement: the
//! caller hears "unavailable, retry", and the retry charges once (SEMANTICS.md invariants 1, 6).

use chargeguard::grpc::proto::{AttemptStatus, ChargeOutcome};
use sqlx::PgPool;
use tonic::Code;

use crate::support::{TestApp, charge_request, error_code, outcome_of, status_of};

/// More than the pool's connections: each broken one can fail one call before it is dropped.
const RETRIES_MAX: usize = 40;

#[tokio::test]
async fn calls_on_connections_the_database_dropped_fail_retryably_and_charge_once() {
    let app = TestApp::spawn().await;
    for n in 0..4 {
        app.charge(charge_request(&format!("warm-{n}")))
            .await
            .unwrap();
    }
    let admin = PgPool::connect(&app.database.url).await.unwrap();
    let (terminated,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM (
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid()) AS killed",
    )
    .fetch_one(&admin)
    .await
    .unwrap();
    assert!(terminated > 0, "the service held open connections");

    let mut unavailable = 0;
    let mut answered = None;
    for _ in 0..RETRIES_MAX {
        match app.charge(charge_request("after-restart")).await {
            Ok(response) => {
                answered = Some(response);
                break;
            }
            Err(status) => {
                assert_eq!(status.code(), Code::Unavailable, "{status:?}");
                assert!(
                    ["unavailable", "outcome_unknown", "in_progress"]
                        .contains(&error_code(&status).as_str()),
                    "{status:?}"
                );
                unavailable += 1;
            }
        }
    }
    let response = answered.expect("a retry gets through once the broken connections are gone");
    assert_eq!(status_of(&response), AttemptStatus::Succeeded);
    assert!(
        matches!(
            outcome_of(&response),
            ChargeOutcome::Applied | ChargeOutcome::Reconciled
        ),
        "after {unavailable} retries"
    );
    let ledger = app.sim().ledger().await.unwrap();
    assert_eq!(
        ledger
            .payment_intents_with_metadata("chargeguard_operation_key", "after-restart")
            .count(),
        1
    );
}
