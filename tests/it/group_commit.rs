//! Group commit on PostgreSQL (issue 21): concurrent charges share their insert and finish
//! statements, yet each caller hears its own answer; a batch that fails as a whole (statement
//! timeout, terminated backend) answers every caller "unavailable, retry", and the retries charge
//! each operation once. Money is counted at the simulator.
//!
//! Batches are made deterministic by holding `payment_attempts` locked against writes (reads go
//! on): the first batch waits in the database, and the callers behind it queue into the next.

use std::collections::BTreeMap;
use std::time::Duration;

use chargeguard::grpc::proto::{AttemptStatus as ProtoStatus, ChargeOutcome, ChargeRequest, ChargeResponse};
use chargeguard::simulator::{Endpoint, FaultKind, FaultSpec};
use sqlx::{PgPool, Postgres, Transaction};
use tokio::task::JoinHandle;
use tonic::Status;

use crate::support::{TestApp, attempt_request, charge_request, error_code, outcome_of, status_of};

/// Bound on polling for a batch to wait on the lock.
const POLLS_MAX: u32 = 1_000;
const POLL_INTERVAL: Duration = Duration::from_millis(10);
/// Time for the callers behind a blocked batch to reach the committer's queue (debug build, 2
/// shared cores).
pub const QUEUE_SETTLE: Duration = Duration::from_secs(2);

/// Holds payment_attempts against writes until the transaction ends; reads go on.
pub async fn lock_writes(pool: &PgPool) -> Transaction<'static, Postgres> {
    let mut lock = pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE payment_attempts IN EXCLUSIVE MODE").execute(&mut *lock).await.unwrap();
    lock
}

/// The backends of this database waiting on a lock (the batch statement in flight).
async fn blocked_backends(pool: &PgPool) -> Vec<i32> {
    sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity
         WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Waits (bounded) until a statement of this database waits on a lock; returns the backends.
pub async fn wait_for_a_blocked_batch(pool: &PgPool) -> Vec<i32> {
    for _ in 0..POLLS_MAX {
        let blocked = blocked_backends(pool).await;
        if !blocked.is_empty() {
            return blocked;
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    panic!("no batch ever waited on the lock");
}

fn charge_all(app: &TestApp, operations: &[String]) -> Vec<JoinHandle<Result<ChargeResponse, Status>>> {
    send_all(app, operations.iter().map(|operation| charge_request(operation)).collect())
}

/// Sends each request on a connection of its own, all at once.
fn send_all(app: &TestApp, requests: Vec<ChargeRequest>) -> Vec<JoinHandle<Result<ChargeResponse, Status>>> {
    requests
        .into_iter()
        .map(|request| {
            let grpc = app.grpc_addr;
            tokio::spawn(async move {
                let mut client = chargeguard::grpc::proto::payments_client::PaymentsClient::connect(format!(
                    "http://{grpc}"
                ))
                .await
                .unwrap();
                client
                    .charge(crate::support::authed(crate::support::ORDERS_TOKEN, request))
                    .await
                    .map(|response| response.into_inner())
            })
        })
        .collect()
}

async fn answers(calls: Vec<JoinHandle<Result<ChargeResponse, Status>>>) -> Vec<Result<ChargeResponse, Status>> {
    let mut answers = Vec::with_capacity(calls.len());
    for call in calls {
        answers.push(call.await.unwrap());
    }
    answers
}

/// Payment intents at the simulator per operation key (the metadata every create carries).
async fn intents_per_operation(app: &TestApp) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for intent in app.sim().ledger().await.unwrap().payment_intents {
        let operation = intent.metadata.get("chargeguard_operation_key").cloned().unwrap_or_default();
        *counts.entry(operation).or_default() += 1;
    }
    counts
}

/// Retries of `operations` that nothing was written for: each applied, one charge each.
async fn retries_charge_each_once(app: &TestApp, operations: &[String]) {
    for answer in answers(charge_all(app, operations)).await {
        assert_eq!(outcome_of(&answer.unwrap()), ChargeOutcome::Applied);
    }
    let intents = intents_per_operation(app).await;
    assert_eq!(intents.len(), operations.len());
    assert!(intents.values().all(|count| *count == 1), "{intents:?}");
}

/// 48 new operations and 16 concurrent duplicates of some of them, 64 calls: every operation is
/// applied exactly once, every duplicate answered from its row, one create per operation.
#[tokio::test]
async fn sixty_four_concurrent_charges_with_duplicates_in_one_batch_each_get_their_own_answer() {
    let app = TestApp::spawn_with(|config| {
        config.database.group_commit.enabled = true;
        // The blocked batch waits out the lock with time to spare on a slow, loaded machine.
        config.database.statement_timeout_ms = 20_000;
        config.charge.lease_ms = 23_000;
        config.charge.recovery_grace_ms = 23_000;
    })
    .await;
    let pool = PgPool::connect(&app.database.url).await.unwrap();
    let distinct: Vec<String> = (0..48).map(|index| format!("gc-{index}")).collect();
    let mut operations = distinct.clone();
    // Duplicates interleaved with the new ones, so that pairs share a batch.
    for index in 0..16 {
        operations.insert(index * 4 + 1, format!("gc-{index}"));
    }
    assert_eq!(operations.len(), 64);

    let lock = lock_writes(&pool).await;
    let calls = charge_all(&app, &operations);
    wait_for_a_blocked_batch(&pool).await;
    tokio::time::sleep(QUEUE_SETTLE).await;
    lock.commit().await.unwrap();

    let answers = answers(calls).await;
    let mut applied: BTreeMap<String, usize> = BTreeMap::new();
    for (operation, answer) in operations.iter().zip(&answers) {
        let response = answer.as_ref().unwrap_or_else(|error| panic!("{operation}: {error:?}"));
        assert_eq!(status_of(response), ProtoStatus::Succeeded, "{operation}");
        match outcome_of(response) {
            ChargeOutcome::Applied => *applied.entry(operation.clone()).or_default() += 1,
            ChargeOutcome::Duplicate | ChargeOutcome::Reconciled => {}
            other => panic!("{operation}: {other:?}"),
        }
    }
    assert_eq!(applied.len(), 48, "every operation applied: {applied:?}");
    assert!(applied.values().all(|count| *count == 1), "none applied twice: {applied:?}");
    let intents = intents_per_operation(&app).await;
    assert_eq!(intents.len(), 48);
    assert!(intents.values().all(|count| *count == 1), "one charge per operation: {intents:?}");
    assert_eq!(app.attempt_rows().await, 48);

    // The rows of one batch share their transaction's start (created_at): the 64 calls went in
    // a handful of statements, not one each.
    let statements: i64 = sqlx::query_scalar("SELECT count(DISTINCT created_at) FROM payment_attempts")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(statements <= 8, "48 inserts in {statements} statements");
}

/// A service with group commit on and at most `in_flight_max` batches running at once. Its
/// creates (held PROVIDER_WAIT at the simulator) and its statements (blocked behind a lock for
/// seconds) get time to spare on a slow, loaded machine: these tests count batches, not timeouts.
async fn spawn_with_batches_in_flight(in_flight_max: usize) -> TestApp {
    TestApp::spawn_with(|config| {
        config.database.group_commit.enabled = true;
        config.database.group_commit.in_flight_max = in_flight_max;
        config.provider.call_timeout_ms = 5_000;
        config.database.statement_timeout_ms = 20_000;
        config.charge.lease_ms = 31_000;
        config.charge.recovery_grace_ms = 31_000;
    })
    .await
}

/// Waits (bounded) until `count` statements of this database wait on a lock at once.
async fn wait_for_blocked_batches(pool: &PgPool, count: usize) {
    for _ in 0..POLLS_MAX {
        if blocked_backends(pool).await.len() >= count {
            return;
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    panic!("{count} batches never waited on the lock at once");
}

/// With two batches in flight, a batch starts while the one before it still waits in the
/// database; a duplicate of an operation in the first waits for that batch's answer instead of
/// going beside it in the second. Every caller hears its own answer, one charge per operation.
#[tokio::test]
async fn a_second_batch_runs_while_the_first_waits_in_the_database_and_each_operation_is_charged_once() {
    let app = spawn_with_batches_in_flight(2).await;
    let pool = PgPool::connect(&app.database.url).await.unwrap();
    let lock = lock_writes(&pool).await;
    let first = charge_all(&app, &["gc-first".to_owned()]);
    wait_for_a_blocked_batch(&pool).await;
    let later: Vec<String> = ["gc-first", "gc-second", "gc-third"].map(str::to_owned).to_vec();
    let later_calls = charge_all(&app, &later);
    wait_for_blocked_batches(&pool, 2).await;
    tokio::time::sleep(QUEUE_SETTLE).await;
    assert_eq!(blocked_backends(&pool).await.len(), 2, "no third batch while two are in flight");
    lock.commit().await.unwrap();

    assert_applied_and_succeeded(&["gc-first".to_owned()], &answers(first).await);
    let later_answers = answers(later_calls).await;
    assert_applied_and_succeeded(&later[1..], &later_answers[1..]);
    match &later_answers[0] {
        Ok(response) => assert_eq!(outcome_of(response), ChargeOutcome::Duplicate, "{response:?}"),
        Err(error) => assert_eq!(error_code(error), "in_progress", "{error:?}"),
    }
    let again = app.charge(charge_request("gc-first")).await.unwrap();
    assert_eq!(outcome_of(&again), ChargeOutcome::Duplicate);
    let intents = intents_per_operation(&app).await;
    assert_eq!(intents.len(), 3);
    assert!(intents.values().all(|count| *count == 1), "one charge per operation: {intents:?}");
    assert_eq!(app.attempt_rows().await, 3);
}

/// Every caller of a batch that timed out hears "unavailable"; nothing was written or sent, and
/// the retries charge each operation once.
#[tokio::test]
async fn a_statement_timeout_answers_every_caller_of_the_batch_retryably_and_a_retry_charges_once() {
    let app = TestApp::spawn_with(|config| {
        config.database.group_commit.enabled = true;
        config.database.statement_timeout_ms = 300;
    })
    .await;
    let pool = PgPool::connect(&app.database.url).await.unwrap();
    let operations: Vec<String> = (0..16).map(|index| format!("gc-timeout-{index}")).collect();

    let lock = lock_writes(&pool).await;
    let calls = charge_all(&app, &operations);
    for answer in answers(calls).await {
        let error = answer.expect_err("the batch timed out behind the lock");
        assert_eq!(error.code(), tonic::Code::Unavailable, "{error:?}");
        assert_eq!(error_code(&error), "unavailable", "{error:?}");
    }
    lock.commit().await.unwrap();
    assert_eq!(app.attempt_rows().await, 0, "nothing committed");
    assert!(app.creates().await.is_empty(), "nothing sent to the provider");

    retries_charge_each_once(&app, &operations).await;
}

/// A batch whose backend is terminated mid-statement committed nothing: its callers hear
/// "unavailable", and their retries charge each operation once.
#[tokio::test]
async fn a_terminated_backend_fails_its_batch_as_a_whole_and_loses_or_duplicates_nothing() {
    let app = TestApp::spawn_with(|config| config.database.group_commit.enabled = true).await;
    let pool = PgPool::connect(&app.database.url).await.unwrap();
    let operations: Vec<String> = (0..16).map(|index| format!("gc-terminated-{index}")).collect();

    let lock = lock_writes(&pool).await;
    let calls = charge_all(&app, &operations);
    wait_for_a_blocked_batch(&pool).await;
    tokio::time::sleep(QUEUE_SETTLE).await;
    // Every batch that reaches the database while the lock is held is terminated there.
    while !calls.iter().all(JoinHandle::is_finished) {
        for pid in blocked_backends(&pool).await {
            sqlx::query("SELECT pg_terminate_backend($1)").bind(pid).execute(&pool).await.unwrap();
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    for answer in answers(calls).await {
        let error = answer.expect_err("the batch's backend was terminated");
        assert_eq!(error.code(), tonic::Code::Unavailable, "{error:?}");
    }
    lock.commit().await.unwrap();
    assert_eq!(app.attempt_rows().await, 0, "nothing committed");
    assert!(app.creates().await.is_empty(), "nothing sent to the provider");

    retries_charge_each_once(&app, &operations).await;
}

/// The two batch inserts of the charge path.
#[derive(Debug, Clone, Copy)]
enum BatchInsert {
    /// `insert_pending_first_attempts` (migration 20261205000001): first attempts, set-based.
    FirstAttempts,
    /// `insert_pending_attempts` (migration 20261206000003): any attempts, row by row.
    AnyAttempts,
}

/// Calls the batch insert of first attempts for `operations` of one consumer; returns
/// (operation_key, id) of each row it answers with.
async fn insert_first_attempts<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    operations: &[&str],
) -> Vec<(String, uuid::Uuid)> {
    try_batch_insert(executor, BatchInsert::FirstAttempts, operations).await.unwrap()
}

/// Calls `batch` for first attempts (generation 0) of `operations`, of one consumer, in that
/// order; returns (operation_key, id) of each row it answers with, or the statement's error.
async fn try_batch_insert<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    batch: BatchInsert,
    operations: &[&str],
) -> Result<Vec<(String, uuid::Uuid)>, sqlx::Error> {
    let n = operations.len();
    let ids: Vec<uuid::Uuid> = (0..n).map(|_| uuid::Uuid::now_v7()).collect();
    let text = |value: &str| vec![value.to_owned(); n];
    let none = vec![None::<String>; n];
    let sql = match batch {
        BatchInsert::FirstAttempts => {
            "SELECT operation_key, id FROM insert_pending_first_attempts(
                $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)"
        }
        BatchInsert::AnyAttempts => {
            "SELECT (a.attempt).operation_key, (a.attempt).id FROM insert_pending_attempts(
                $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18,
                array_fill(0, ARRAY[cardinality($1)])) AS a"
        }
    };
    sqlx::query_as(sql)
        .bind(ids)
        .bind(text("orders"))
        .bind(operations.iter().map(|operation| operation.to_string()).collect::<Vec<_>>())
        .bind(vec![1_000_i64; n])
        .bind(text("usd"))
        .bind(text("pm_card_visa"))
        .bind(&none)
        .bind(&none)
        .bind(vec![serde_json::json!({}); n])
        .bind(text("fingerprint"))
        .bind(text("stripe"))
        .bind(operations.iter().map(|operation| format!("key-{operation}")).collect::<Vec<_>>())
        .bind(vec![chrono::Utc::now(); n])
        .bind(vec![0_i64; n])
        .bind((0..n).map(|_| uuid::Uuid::now_v7()).collect::<Vec<_>>())
        .bind(vec![30_000_000_i64; n])
        .bind(vec![60_000_000_i64; n])
        .bind(&none)
        .fetch_all(executor)
        .await
}

/// Calls the batch finish (migration 20261206000001) for the attempts `ids` with a lease owner
/// that holds none of them: every row is looked up, none is changed.
async fn finish_rounds_of_strangers<'e>(executor: impl sqlx::PgExecutor<'e>, ids: &[uuid::Uuid]) -> i64 {
    let n = ids.len();
    let text = |value: &str| vec![value.to_owned(); n];
    let none = vec![None::<String>; n];
    sqlx::query_scalar(
        "SELECT count(*) FROM finish_rounds(
            $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)",
    )
    .bind(ids.to_vec())
    .bind((0..n).map(|_| uuid::Uuid::now_v7()).collect::<Vec<_>>())
    .bind(text("succeeded"))
    .bind(text("pending"))
    .bind(text("pi_stranger"))
    .bind(text("succeeded"))
    .bind(&none)
    .bind(&none)
    .bind(&none)
    .bind(&none)
    .bind(&none)
    .bind(vec![1_i32; n])
    .bind(vec![0_i64; n])
    .bind(&none)
    .bind(vec![0_i64; n])
    .bind(vec![false; n])
    .bind(vec!["pending".to_owned(), "requires_action".to_owned()])
    .bind(vec![false; n])
    .bind(&none)
    .fetch_one(executor)
    .await
    .unwrap()
}

/// This transaction's own reads of payment_attempts so far (`pg_stat_xact_user_tables`, which
/// needs no flush): (sequential scans, rows they read, rows fetched through indexes).
async fn reads_of_attempts(connection: &mut sqlx::PgConnection) -> (i64, i64, i64) {
    sqlx::query_as(
        "SELECT seq_scan, seq_tup_read, idx_tup_fetch FROM pg_stat_xact_user_tables
         WHERE relname = 'payment_attempts'",
    )
    .fetch_one(connection)
    .await
    .unwrap()
}

/// Both batch functions plan once per connection, at its first batch. On a new table (empty,
/// never analyzed) that plan must still look rows up by key: a plan that reads the table
/// (a sequential scan, or a walk of a whole index) is kept until ANALYZE, and every batch reads
/// the whole table meanwhile (migration 20261206000002). After the plans are made on the empty
/// table, the table grows to 200 rows; the later batches may then fetch only the rows they
/// look up.
#[tokio::test]
async fn batches_planned_on_an_empty_table_look_rows_up_by_key_not_by_reading_the_table() {
    let database = crate::support::TestDatabase::create().await;
    drop(database.open_store().await);
    let mut connection = <sqlx::PgConnection as sqlx::Connection>::connect(&database.url).await.unwrap();
    let mut transaction = sqlx::Connection::begin(&mut connection).await.unwrap();

    let first = insert_first_attempts(&mut *transaction, &["empty-1", "empty-2"]).await;
    let first_ids: Vec<uuid::Uuid> = first.iter().map(|(_, id)| *id).collect();
    assert_eq!(finish_rounds_of_strangers(&mut *transaction, &first_ids).await, 0, "no lease of theirs to finish");
    let fillers: Vec<String> = (0..200).map(|n| format!("filler-{n}")).collect();
    let fillers: Vec<&str> = fillers.iter().map(String::as_str).collect();
    assert_eq!(insert_first_attempts(&mut *transaction, &fillers).await.len(), 200);

    let before = reads_of_attempts(&mut transaction).await;
    let later = insert_first_attempts(&mut *transaction, &["later-1", "later-2", "empty-1"]).await;
    assert_eq!(later.len(), 3, "{later:?}");
    let ids: Vec<uuid::Uuid> = first_ids.iter().copied().chain(later.iter().map(|(_, id)| *id)).collect();
    assert_eq!(finish_rounds_of_strangers(&mut *transaction, &ids).await, 0);
    let after = reads_of_attempts(&mut transaction).await;

    let (scans, scanned, fetched) = (after.0 - before.0, after.1 - before.1, after.2 - before.2);
    // Keys looked up: 3 operations, then 5 attempts; each row at most twice (an operation's
    // row by the INSERT's conflict check and by the read after it). Reading the table would
    // fetch its 205 rows at each batch.
    let lookups = 3 + 5;
    assert_eq!((scans, scanned), (0, 0), "no batch scanned the table ({scans} scans read {scanned} rows)");
    assert!(fetched <= 2 * lookups, "{fetched} rows fetched through indexes for {lookups} keys in a table of 205");
}

/// Two replicas' batches that meet on several operations, each in its own order: a batch
/// writes its rows in key order (migration 20261206000003), so the later batch waits for the
/// first and neither ever holds a row the other needs. In request order, `a, m, z` and
/// `z, m, a` deadlock: once the writer holding `m` steps aside, whichever batch takes `m` waits
/// for the other's end row while the other waits for `m`, and PostgreSQL fails one whole batch
/// (40P01) after deadlock_timeout. Checked for both batch inserts.
#[tokio::test]
async fn replicas_batching_the_same_operations_in_opposite_orders_wait_for_each_other_and_never_deadlock() {
    let database = crate::support::TestDatabase::create().await;
    drop(database.open_store().await);
    let pool = PgPool::connect(&database.url).await.unwrap();

    for (round, batch) in [BatchInsert::FirstAttempts, BatchInsert::AnyAttempts].into_iter().enumerate() {
        let [a, m, z] = ["a", "m", "z"].map(|name| format!("{name}-{round}"));
        // Another writer holds `m` uncommitted, so that both batches are in the middle of their
        // rows when it steps aside.
        let mut gate = pool.begin().await.unwrap();
        insert_first_attempts(&mut *gate, &[m.as_str()]).await;
        let replica = |operations: [String; 3]| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let operations = operations.each_ref().map(String::as_str);
                try_batch_insert(&pool, batch, &operations).await
            })
        };
        let first = replica([a.clone(), m.clone(), z.clone()]);
        wait_for_blocked_batches(&pool, 1).await;
        let second = replica([z.clone(), m.clone(), a.clone()]);
        wait_for_blocked_batches(&pool, 2).await;
        gate.rollback().await.unwrap();

        let first: BTreeMap<String, uuid::Uuid> =
            first.await.unwrap().unwrap_or_else(|error| panic!("{batch:?}, first batch: {error}")).into_iter().collect();
        let second: BTreeMap<String, uuid::Uuid> =
            second.await.unwrap().unwrap_or_else(|error| panic!("{batch:?}, second batch: {error}")).into_iter().collect();
        assert_eq!(first.len(), 3, "{batch:?}: {first:?}");
        assert_eq!(first, second, "{batch:?}: both replicas answer each operation with its one row");
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM payment_attempts WHERE operation_key LIKE '%-' || $1")
            .bind(round.to_string())
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(rows, 3, "{batch:?}: one row per operation");
    }
}

/// The batch insert's second query is what answers a first attempt that another writer (a
/// replica's own batch, a single insert) committed after the batch's INSERT had started: the
/// INSERT waits for that writer and skips the row, and only a new snapshot sees it. Without the
/// second query the caller of that operation would hear nothing; with one query in one snapshot,
/// the same. A duplicate in the batch itself is answered with the row written for the first.
#[tokio::test]
async fn a_batch_insert_answers_a_first_attempt_another_writer_committed_during_it_with_that_row() {
    let app = TestApp::spawn_with(|config| config.database.group_commit.enabled = true).await;
    let pool = PgPool::connect(&app.database.url).await.unwrap();

    // Another writer holds the row of `race` uncommitted.
    let mut other_writer = pool.begin().await.unwrap();
    let (other_id,): (uuid::Uuid,) = sqlx::query_as(
        "SELECT id FROM insert_pending_attempt(gen_random_uuid(), 'orders', 'race', 1000, 'usd',
             'pm_card_visa', NULL, NULL, '{}'::jsonb, 'fingerprint', 'stripe', 'key-race', 0, now(), 0,
             gen_random_uuid(), 30000000, 60000000, NULL)",
    )
    .fetch_one(&mut *other_writer)
    .await
    .unwrap();

    let batch = {
        let pool = pool.clone();
        tokio::spawn(async move { insert_first_attempts(&pool, &["calm", "race", "calm"]).await })
    };
    wait_for_a_blocked_batch(&pool).await;
    other_writer.commit().await.unwrap();
    let answered: BTreeMap<String, uuid::Uuid> = batch.await.unwrap().into_iter().collect();

    assert_eq!(answered.len(), 2, "one row per operation: {answered:?}");
    assert_eq!(answered["race"], other_id, "the other writer's row, not nothing and not a second row");
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT operation_key, count(*) FROM payment_attempts GROUP BY operation_key ORDER BY operation_key",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(rows, vec![("calm".to_owned(), 1), ("race".to_owned(), 1)]);
}

/// How long the simulator holds the creates of charges whose results must come back while the
/// table is locked (under `spawn_with_batches_in_flight`'s provider call timeout, 5 s).
const PROVIDER_WAIT_MS: u64 = 700;
const PROVIDER_WAIT: Duration = Duration::from_millis(PROVIDER_WAIT_MS);

/// Waits (bounded) until `payment_attempts` holds `rows` rows.
async fn wait_for_rows(app: &TestApp, rows: i64) {
    for _ in 0..POLLS_MAX {
        if app.attempt_rows().await >= rows {
            return;
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    panic!("payment_attempts never held {rows} rows");
}

/// Starts `returning` (their creates held at the simulator for PROVIDER_WAIT) and, once their
/// pending rows committed, locks the table against writes, so that their results queue behind
/// the blocked batch of whatever is sent next. Returns the lock and the calls.
async fn results_held_behind_a_lock(
    app: &TestApp,
    pool: &PgPool,
    returning: &[String],
) -> (Transaction<'static, Postgres>, Vec<JoinHandle<Result<ChargeResponse, Status>>>) {
    let held = u32::try_from(returning.len()).unwrap();
    app.sim()
        .set_fault(Endpoint::CreatePaymentIntent, FaultSpec::next(FaultKind::Latency(PROVIDER_WAIT_MS), held))
        .await
        .unwrap();
    let calls = charge_all(app, returning);
    wait_for_rows(app, i64::from(held)).await;
    (lock_writes(pool).await, calls)
}

/// Rows of `finished` whose result was written by the transaction that inserted a row of
/// `inserted`: a transaction's rows share its `now()` (no clock shift in these tests).
async fn results_written_with_inserts(pool: &PgPool, finished: &str, inserted: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(DISTINCT f.id) FROM payment_attempts f JOIN payment_attempts i ON f.updated_at = i.created_at
         WHERE f.operation_key LIKE $1 AND i.operation_key LIKE $2",
    )
    .bind(format!("{finished}%"))
    .bind(format!("{inserted}%"))
    .fetch_one(pool)
    .await
    .unwrap()
}

fn assert_applied_and_succeeded(operations: &[String], answers: &[Result<ChargeResponse, Status>]) {
    for (operation, answer) in operations.iter().zip(answers) {
        let response = answer.as_ref().unwrap_or_else(|error| panic!("{operation}: {error:?}"));
        assert_eq!(outcome_of(response), ChargeOutcome::Applied, "{operation}");
        assert_eq!(status_of(response), ProtoStatus::Succeeded, "{operation}");
    }
}

/// One committer carries both writes of the charge path: the pending rows of charges that
/// arrive and the results of charges that come back from the provider go to PostgreSQL as one
/// statement (the insert function and the UPDATE in one WITH), and each caller still hears its
/// own answer. Shown by the rows: the results of the first charges carry the transaction time
/// of the second charges' pending rows.
#[tokio::test]
async fn pending_rows_and_results_of_other_charges_share_one_statement_and_each_caller_hears_its_own_answer() {
    // One batch in flight: the results then queue behind the blocked one with the new rows.
    let app = spawn_with_batches_in_flight(1).await;
    let pool = PgPool::connect(&app.database.url).await.unwrap();
    let returning: Vec<String> = (0..8).map(|index| format!("gc-returning-{index}")).collect();
    let arriving: Vec<String> = (0..8).map(|index| format!("gc-arriving-{index}")).collect();

    let (lock, returning_calls) = results_held_behind_a_lock(&app, &pool, &returning).await;
    // The first new charge goes alone and blocks; the others queue behind it. Sent all at once,
    // a busy machine could let every one of them into the blocked batch, leaving the results a
    // batch of their own.
    let (blocker, others) = arriving.split_at(1);
    let mut arriving_calls = charge_all(&app, blocker);
    wait_for_a_blocked_batch(&pool).await;
    arriving_calls.extend(charge_all(&app, others));
    // The first charges' results come back from the provider and queue with the new charges.
    tokio::time::sleep(PROVIDER_WAIT + QUEUE_SETTLE).await;
    lock.commit().await.unwrap();

    assert_applied_and_succeeded(&returning, &answers(returning_calls).await);
    assert_applied_and_succeeded(&arriving, &answers(arriving_calls).await);
    let intents = intents_per_operation(&app).await;
    assert_eq!(intents.len(), 16);
    assert!(intents.values().all(|count| *count == 1), "one charge per operation: {intents:?}");
    assert_eq!(app.attempt_rows().await, 16);
    let shared = results_written_with_inserts(&pool, "gc-returning-", "gc-arriving-").await;
    assert!(shared >= 1, "no result was written by the statement of a new charge's pending row");
}

/// A later attempt (charging again after a decline) in a batch with other charges' results:
/// its insert runs row by row, and both statements commit in one transaction. The new attempt
/// is charged once, the results are written, and the shared transaction shows in the rows.
#[tokio::test]
async fn a_later_attempt_batched_with_results_commits_with_them_in_one_transaction() {
    let app = spawn_with_batches_in_flight(1).await;
    let pool = PgPool::connect(&app.database.url).await.unwrap();
    let declined = app.charge(attempt_request("gc-again", 1, "pm_card_chargeDeclined")).await.unwrap();
    assert_eq!(status_of(&declined), ProtoStatus::Failed);
    let returning: Vec<String> = (0..4).map(|index| format!("gc-returning-{index}")).collect();

    let (lock, returning_calls) = results_held_behind_a_lock(&app, &pool, &returning).await;
    // The first write after the lock goes alone and blocks; attempt 2 queues behind it.
    let blocker = charge_all(&app, &["gc-blocker".to_owned()]);
    wait_for_a_blocked_batch(&pool).await;
    let again = send_all(&app, vec![attempt_request("gc-again", 2, "pm_card_visa")]);
    tokio::time::sleep(PROVIDER_WAIT + QUEUE_SETTLE).await;
    lock.commit().await.unwrap();

    assert_applied_and_succeeded(&returning, &answers(returning_calls).await);
    assert_applied_and_succeeded(&["gc-blocker".to_owned()], &answers(blocker).await);
    assert_applied_and_succeeded(&["gc-again".to_owned()], &answers(again).await);
    let generations: Vec<i32> =
        sqlx::query_scalar("SELECT generation FROM payment_attempts WHERE operation_key = 'gc-again' ORDER BY generation")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(generations.len(), 2, "attempts 1 and 2 of gc-again: {generations:?}");
    let ledger = app.sim().ledger().await.unwrap();
    let succeeded = ledger.succeeded_payment_intents().count();
    assert_eq!(succeeded, 6, "4 returning, the blocker and attempt 2, each once");
    let shared = results_written_with_inserts(&pool, "gc-returning-", "gc-again").await;
    assert!(shared >= 1, "no result was written in the transaction of attempt 2's pending row");
}

/// A store with group commit opened on `database` with at most `connections_max` connections.
async fn store_with_connections(
    database: &crate::support::TestDatabase,
    connections_max: u32,
) -> std::sync::Arc<dyn chargeguard::store::AttemptStore> {
    database
        .open_store_with(|config| {
            config.database.group_commit.enabled = true;
            config.database.connections_max = connections_max;
            config.database.acquire_timeout_ms = 2_000;
        })
        .await
}

/// The backends connected to the database of `admin` (one connection, not a pool, so that it
/// counts only itself out), other than its own.
async fn backends_of(admin: &mut sqlx::PgConnection) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .fetch_one(admin)
    .await
    .unwrap()
}

/// The committer keeps the connection of its last statement for the next one: sqlx's pool
/// hands out its oldest idle connection, so consecutive statements used to rotate through every
/// connection the pool had opened. Twenty writes in a row run on one backend, and the store,
/// closing with that connection kept, still closes (the pool's close waits for every
/// connection out of it).
#[tokio::test]
async fn consecutive_writes_run_on_one_kept_connection_and_the_store_still_closes() {
    use crate::support::attempts::{insert_new, new_attempt, owner};

    let database = crate::support::TestDatabase::create().await;
    let store = store_with_connections(&database, 16).await;
    let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(&database.url).await.unwrap();
    let holder = owner();
    for n in 0..20 {
        insert_new(&*store, &new_attempt(&format!("kept-{n}"), holder)).await;
    }
    assert_eq!(backends_of(&mut admin).await, 1, "twenty writes in a row on one backend");

    tokio::time::timeout(Duration::from_secs(10), store.close())
        .await
        .expect("the store closes while its committer keeps a connection");
    for _ in 0..POLLS_MAX {
        if backends_of(&mut admin).await == 0 {
            return;
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    panic!("the kept connection was never closed");
}

/// A pool of one connection is never kept from the rest of the service: a read right after a
/// write gets the connection (else it would wait the pool's acquire timeout and fail).
#[tokio::test]
async fn with_one_connection_the_committer_keeps_none_and_reads_go_on() {
    use crate::support::attempts::{insert_new, new_attempt, owner};

    let database = crate::support::TestDatabase::create().await;
    let store = store_with_connections(&database, 1).await;
    for n in 0..3 {
        let written = insert_new(&*store, &new_attempt(&format!("alone-{n}"), owner())).await;
        let read = store.find_by_id(None, written.id).await.expect("the read gets the one connection");
        assert_eq!(read.map(|attempt| attempt.id), Some(written.id));
    }
}
