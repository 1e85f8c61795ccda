//! Upgrades of a database that already holds attempts: a migration must carry every row over
//! unchanged. payment_attempts is a financial record, and the SQLite twin of a constraint change
//! rebuilds the whole table.

use std::borrow::Cow;

use chargeguard::domain::{AttemptId, AttemptKind, AttemptStatus};
use sqlx::migrate::Migrator;
use uuid::Uuid;

use crate::support::{Backend, TestDatabase, on_both_backends};

/// The first migration of refunds and attempt numbers (issues 15 and 16).
const REFUNDS_AND_ATTEMPT_NUMBERS: i64 = 20261204000001;

/// The backend's migrations older than `version`.
fn migrations_before(backend: Backend, version: i64) -> Migrator {
    let all = match backend {
        Backend::Postgres => &chargeguard::store::postgres::MIGRATOR,
        Backend::Sqlite => &chargeguard::store::sqlite::MIGRATOR,
    };
    let older: Vec<_> = all.iter().filter(|migration| migration.version < version).cloned().collect();
    assert!(older.len() < all.iter().count(), "{version} is one of the migrations");
    Migrator { migrations: Cow::Owned(older), ..Migrator::DEFAULT }
}

async fn migrate_before(database: &TestDatabase, version: i64) {
    let migrator = migrations_before(database.backend, version);
    match database.sqlite_path() {
        None => {
            let pool = sqlx::PgPool::connect(&database.url).await.unwrap();
            migrator.run(&pool).await.unwrap();
            pool.close().await;
        }
        Some(path) => {
            let options = sqlx::sqlite::SqliteConnectOptions::new().filename(path).create_if_missing(true);
            let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
            migrator.run(&pool).await.unwrap();
            pool.close().await;
        }
    }
}

/// A decided charge as the schema before issue 15 held it, every optional column set.
fn decided_charge_insert(backend: Backend, id: Uuid) -> String {
    let (id, instant, metadata) = match backend {
        Backend::Postgres => (format!("'{id}'"), "'2025-12-01 10:00:00.123456+00'".to_owned(), "'{\"order\": \"1\"}'::jsonb"),
        Backend::Sqlite => (format!("X'{}'", id.simple()), "1764583200123456".to_owned(), "'{\"order\":\"1\"}'"),
    };
    format!(
        "INSERT INTO payment_attempts (
            id, consumer, operation_key, kind, amount_minor, currency, payment_method, customer,
            description, metadata, fingerprint, status, provider, provider_payment_id,
            provider_status, idempotency_key, generation, failure_code, failure_message,
            review_reason, provider_calls, key_window_started_at, check_count, next_check_at,
            last_error, created_at, updated_at, return_url, create_sent_until, lookup_cursor,
            review_history)
         VALUES ({id}, 'orders', 'order-1:charge', 'charge', 1234, 'usd', 'pm_card_visa', 'cus_1',
            'an order', {metadata}, 'fp', 'succeeded', 'stripe', 'pi_1', 'succeeded', 'cg1-k-g0', 0,
            NULL, NULL, 'looked at', 2, {instant}, 1, {instant}, 'a timeout', {instant}, {instant},
            'https://example.test/return', {instant}, 'complete', 'cleared once')"
    )
}

async fn rows_written_before_refunds_survive_the_upgrade(backend: Backend) {
    let database = TestDatabase::create_on(backend).await;
    migrate_before(&database, REFUNDS_AND_ATTEMPT_NUMBERS).await;
    let id = Uuid::now_v7();
    assert_eq!(database.execute(&decided_charge_insert(backend, id)).await, 1);

    let store = database.open_store().await;
    let attempt = store.find_by_id(None, AttemptId::from_uuid(id)).await.unwrap().expect("the row is still there");
    assert_eq!(attempt.kind, AttemptKind::Charge);
    assert_eq!(attempt.status, AttemptStatus::Succeeded);
    assert_eq!(attempt.params.amount_minor, 1234);
    assert_eq!(attempt.params.customer.as_ref().map(|c| c.as_str()), Some("cus_1"));
    assert_eq!(attempt.params.metadata.entries().get("order").map(String::as_str), Some("1"));
    assert_eq!(attempt.provider_payment_id.as_deref(), Some("pi_1"));
    assert_eq!(attempt.review_reason.as_deref(), Some("looked at"));
    assert_eq!(attempt.review_history.as_deref(), Some("cleared once"));
    assert_eq!(attempt.return_url.as_deref(), Some("https://example.test/return"));
    assert_eq!(attempt.provider_calls, 2);
    assert_eq!(attempt.created_at.timestamp_micros(), 1_764_583_200_123_456);
    assert_eq!((attempt.parent_attempt_id, attempt.refund_reason, attempt.confirms_payment_id), (None, None, None));
    assert_eq!(database.attempt_rows().await, 1);
}

async fn the_upgraded_schema_holds_one_row_per_operation_and_generation(backend: Backend) {
    let database = TestDatabase::create_on(backend).await;
    migrate_before(&database, REFUNDS_AND_ATTEMPT_NUMBERS).await;
    let _store = database.open_store().await;
    let first = decided_charge_insert(backend, Uuid::now_v7());
    assert_eq!(database.execute(&first).await, 1);
    // The same operation and generation again (another id, another key): refused.
    let again = decided_charge_insert(backend, Uuid::now_v7()).replace("cg1-k-g0", "cg1-k-other");
    let refused = match database.sqlite_path() {
        None => {
            let mut connection = <sqlx::PgConnection as sqlx::Connection>::connect(&database.url).await.unwrap();
            sqlx::query(&again).execute(&mut connection).await.err()
        }
        Some(path) => {
            let options = sqlx::sqlite::SqliteConnectOptions::new().filename(path);
            let mut connection = <sqlx::SqliteConnection as sqlx::Connection>::connect_with(&options).await.unwrap();
            sqlx::query(&again).execute(&mut connection).await.err()
        }
    };
    let refused = refused.expect("a second row for one operation and generation is refused").to_string();
    assert!(refused.to_lowercase().contains("unique"), "{refused}");
    // The next generation of the operation is a row of its own.
    let next = again.replace("'fp', 'succeeded'", "'fp', 'failed'").replace("'cg1-k-other', 0", "'cg1-k-g1', 1");
    assert_eq!(database.execute(&next).await, 1);
    assert_eq!(database.attempt_rows().await, 2);
}

/// Runs `statement` on the test's database; the error text when it was refused.
async fn refusal(database: &TestDatabase, statement: &str) -> Option<String> {
    let result = match database.sqlite_path() {
        None => {
            let mut connection = <sqlx::PgConnection as sqlx::Connection>::connect(&database.url).await.unwrap();
            sqlx::query(statement).execute(&mut connection).await.map(drop)
        }
        Some(path) => {
            let options = sqlx::sqlite::SqliteConnectOptions::new().filename(path);
            let mut connection = <sqlx::SqliteConnection as sqlx::Connection>::connect_with(&options).await.unwrap();
            sqlx::query(statement).execute(&mut connection).await.map(drop)
        }
    };
    result.err().map(|error| error.to_string())
}

fn uuid_literal(backend: Backend, id: Uuid) -> String {
    match backend {
        Backend::Postgres => format!("'{id}'"),
        Backend::Sqlite => format!("X'{}'", id.simple()),
    }
}

/// SEMANTICS invariant 8 and its one exception, in the table itself: whoever writes, a succeeded
/// attempt stays succeeded, except a refund that moves to failed with failed_after_success_at.
async fn a_succeeded_attempt_leaves_succeeded_only_as_a_refund_the_provider_failed(backend: Backend) {
    let database = TestDatabase::create_on(backend).await;
    let _store = database.open_store().await;
    let charge = Uuid::now_v7();
    assert_eq!(database.execute(&decided_charge_insert(backend, charge)).await, 1);
    let refund = Uuid::now_v7();
    let refund_insert = decided_charge_insert(backend, refund)
        .replace("'order-1:charge', 'charge'", "'order-1:refund-1', 'refund'")
        .replace("'pi_1', 'succeeded', 'cg1-k-g0'", "'re_1', 'succeeded', 'cg1-r-g0'")
        .replace("review_history)", "review_history, parent_attempt_id)")
        .replace("'cleared once')", &format!("'cleared once', {})", uuid_literal(backend, charge)));
    assert_eq!(database.execute(&refund_insert).await, 1, "{refund_insert}");

    let (instant, charge_id, refund_id) = match backend {
        Backend::Postgres => ("now()".to_owned(), uuid_literal(backend, charge), uuid_literal(backend, refund)),
        Backend::Sqlite => ("1764583300000000".to_owned(), uuid_literal(backend, charge), uuid_literal(backend, refund)),
    };
    for (what, statement) in [
        ("a charge to failed", format!("UPDATE payment_attempts SET status = 'failed' WHERE id = {charge_id}")),
        ("a charge to pending", format!("UPDATE payment_attempts SET status = 'pending' WHERE id = {charge_id}")),
        (
            "a charge to failed claiming failed after success",
            format!("UPDATE payment_attempts SET status = 'failed', failed_after_success_at = {instant} WHERE id = {charge_id}"),
        ),
        ("a refund to failed without failed_after_success_at", format!("UPDATE payment_attempts SET status = 'failed' WHERE id = {refund_id}")),
        (
            "a refund to pending",
            format!("UPDATE payment_attempts SET status = 'pending' WHERE id = {refund_id}"),
        ),
    ] {
        assert!(refusal(&database, &statement).await.is_some(), "{what} must be refused");
    }
    let allowed = format!(
        "UPDATE payment_attempts SET status = 'failed', failure_code = 'expired_or_canceled_card',
             failed_after_success_at = {instant} WHERE id = {refund_id}"
    );
    assert_eq!(refusal(&database, &allowed).await, None, "the one move out of succeeded");
    let store = database.open_store().await;
    let charge_row = store.find_by_id(None, AttemptId::from_uuid(charge)).await.unwrap().unwrap();
    assert_eq!(charge_row.status, AttemptStatus::Succeeded);
    let refund_row = store.find_by_id(None, AttemptId::from_uuid(refund)).await.unwrap().unwrap();
    assert_eq!(refund_row.status, AttemptStatus::Failed);
    assert!(refund_row.failed_after_success_at.is_some());
}

on_both_backends!(
    rows_written_before_refunds_survive_the_upgrade,
    the_upgraded_schema_holds_one_row_per_operation_and_generation,
    a_succeeded_attempt_leaves_succeeded_only_as_a_refund_the_provider_failed,
);
