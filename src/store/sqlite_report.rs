//! `ReportStore` on the embedded SQLite store (migration `20261205100002_report_staging.sql`):
//! the same staging, join and pages as `postgres_report.rs`, statement for statement, so that
//! both stores give `report::classify` identical `JoinedRow`s. Where SQLite lacks what the
//! PostgreSQL statement uses, what stands in for it:
//!
//! - arrays bound with `UNNEST` → one JSON array of the page's objects, read with `json_each`;
//! - `LEFT JOIN LATERAL … LIMIT 1` → a correlated scalar subquery with the same `ORDER BY`;
//! - `jsonb_agg(… ORDER BY …) FILTER` → `json_group_array(… ORDER BY …) FILTER` (SQLite 3.44+;
//!   the bundled library is 3.46), each staged object re-read with `json()` so it nests as an
//!   object rather than a string;
//! - `SET LOCAL statement_timeout` → a progress handler on the connection that interrupts the
//!   statement once its time is up;
//! - a `uuid`'s text and a `timestamptz` in JSON → the same text built from the 16-byte blob
//!   and the integer microseconds (`UUID_TEXT`, `rfc3339`).
//!
//! One difference no statement can hide: SQLite has one write lock for the whole file, and the
//! join (`build_rows`, one `INSERT … SELECT`) holds it while it runs, so charges wait for it (up
//! to `database.statement_timeout_ms`, SQLite's busy timeout). Staging pages are short writes.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::sqlite::SqliteRow;
use uuid::Uuid;

use super::StoreError;
use super::report::{ReportStore, RunId, StagedPayment};
use super::sqlite::{SqliteStore, unavailable};
use crate::domain::{AttemptId, AttemptStatus, RefundSnapshot};
use crate::provider::METADATA_ATTEMPT_ID;
use crate::report::{AttemptFacts, JoinedRow, OperationFacts, ProviderObject, ReportPeriod};

/// Virtual machine instructions between two looks at the clock while a report statement runs.
const PROGRESS_CHECK_INSTRUCTIONS: i32 = 10_000;

/// The text of a 16-byte uuid blob as PostgreSQL's `uuid::text` writes it (lowercase, hyphens),
/// for a column named `$column`.
macro_rules! uuid_text {
    ($column:literal) => {
        concat!(
            "lower(substr(hex(", $column, "), 1, 8) || '-' || substr(hex(", $column, "), 9, 4) || '-' || ",
            "substr(hex(", $column, "), 13, 4) || '-' || substr(hex(", $column, "), 17, 4) || '-' || ",
            "substr(hex(", $column, "), 21, 12))"
        )
    };
}

/// An instant in integer microseconds as RFC 3339 text in UTC with microseconds, which
/// `DateTime<Utc>` reads back exactly (PostgreSQL's JSON of a `timestamptz` reads back to the
/// same instant). Instants before 1970 are not expected from a provider.
macro_rules! rfc3339 {
    ($column:literal) => {
        concat!(
            "(strftime('%Y-%m-%dT%H:%M:%S', ", $column, " / 1000000, 'unixepoch') || ",
            "printf('.%06dZ', ", $column, " % 1000000))"
        )
    };
}

fn micros(instant: DateTime<Utc>) -> i64 {
    instant.timestamp_micros()
}

impl SqliteStore {
    /// Runs `statement` on one connection, interrupted after `timeout` instead of waiting on:
    /// the report's joins and deletes grow with the period (PostgreSQL: `SET LOCAL
    /// statement_timeout`).
    async fn execute_with_timeout<'q>(
        &self,
        statement: sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
        timeout: Duration,
    ) -> Result<u64, StoreError> {
        let mut connection = self.pool().acquire().await.map_err(unavailable)?;
        let deadline = Instant::now() + timeout;
        connection
            .lock_handle()
            .await
            .map_err(unavailable)?
            .set_progress_handler(PROGRESS_CHECK_INSTRUCTIONS, move || {
                Instant::now() < deadline
            });
        let done = statement.execute(&mut *connection).await;
        // The connection goes back to the pool: it must not interrupt the next user.
        let removed = match connection.lock_handle().await {
            Ok(mut handle) => {
                handle.remove_progress_handler();
                true
            }
            Err(_) => false,
        };
        if !removed {
            // A connection whose handler may still be set is closed, not reused.
            drop(connection.detach());
        }
        let done = done.map_err(|error| match error {
            sqlx::Error::Database(database) if database.message().contains("interrupted") => {
                StoreError::Unavailable(format!(
                    "a report statement ran longer than {} ms (report.statement_timeout_ms)",
                    timeout.as_millis()
                ))
            }
            other => unavailable(other),
        })?;
        Ok(done.rows_affected())
    }
}

#[async_trait]
impl ReportStore for SqliteStore {
    async fn begin_run(
        &self,
        run: RunId,
        now: DateTime<Utc>,
        abandoned_before: DateTime<Utc>,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        let abandoned = sqlx::query("DELETE FROM report_runs WHERE started_at < ?1")
            .bind(micros(abandoned_before));
        let deleted = self.execute_with_timeout(abandoned, timeout).await?;
        if deleted > 0 {
            tracing::warn!(
                runs = deleted,
                "deleted the staging of abandoned report runs"
            );
        }
        sqlx::query("INSERT INTO report_runs (run_id, started_at) VALUES (?1, ?2)")
            .bind(run.as_uuid())
            .bind(micros(now))
            .execute(self.pool())
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn stage_payments(
        &self,
        run: RunId,
        payments: &[StagedPayment<'_>],
    ) -> Result<(), StoreError> {
        let page: Vec<serde_json::Value> = payments
            .iter()
            .map(|staged| {
                serde_json::json!({
                    "id": staged.payment.id,
                    "claimed": staged.claimed_attempt.map(|id| id.as_uuid().simple().to_string()),
                    "status": staged.payment.status.as_str(),
                    "amount": staged.payment.amount_minor,
                    "received": staged.payment.amount_received_minor,
                    "currency": staged.payment.currency,
                    "created": micros(staged.payment.created),
                })
            })
            .collect();
        let page = serde_json::Value::Array(page).to_string();
        // The same ties as PostgreSQL's statement: the latest attempt confirming the intent
        // again (issue 16), else the attempt the metadata names if it exists, else the earliest
        // attempt that recorded the object's id. `json_each` keeps the page's order, so a
        // payment staged twice keeps the first, as `ON CONFLICT DO NOTHING` does there.
        sqlx::query(
            "INSERT INTO report_provider_payments (
                run_id, provider_payment_id, attempt_id, linked_by, status, amount_minor,
                amount_received_minor, currency, created_at)
             SELECT ?1, id, COALESCE(by_confirm, by_metadata, by_provider_id),
                    CASE WHEN by_confirm IS NOT NULL THEN 'confirms_payment_id'
                         WHEN by_metadata IS NOT NULL THEN 'metadata'
                         WHEN by_provider_id IS NOT NULL THEN 'provider_payment_id' END,
                    status, amount, received, currency, created
             FROM (
                 SELECT staged.id, staged.status, staged.amount, staged.received,
                        staged.currency, staged.created,
                        (SELECT attempt.id FROM payment_attempts attempt
                         WHERE attempt.id = unhex(staged.claimed)) AS by_metadata,
                        (SELECT attempt.id FROM payment_attempts attempt
                         WHERE attempt.provider_payment_id = staged.id
                         ORDER BY attempt.created_at, attempt.id
                         LIMIT 1) AS by_provider_id,
                        (SELECT attempt.id FROM payment_attempts attempt
                         WHERE attempt.confirms_payment_id = staged.id AND attempt.kind = 'charge'
                         ORDER BY attempt.generation DESC
                         LIMIT 1) AS by_confirm
                 FROM (SELECT item.value ->> 'id' AS id, item.value ->> 'claimed' AS claimed,
                              item.value ->> 'status' AS status, item.value ->> 'amount' AS amount,
                              item.value ->> 'received' AS received,
                              item.value ->> 'currency' AS currency,
                              item.value ->> 'created' AS created, item.key AS position
                       FROM json_each(?2) item) staged
                 ORDER BY staged.position
             )
             WHERE true
             ON CONFLICT (run_id, provider_payment_id) DO NOTHING",
        )
        .bind(run.as_uuid())
        .bind(page)
        .execute(self.pool())
        .await
        .map_err(unavailable)?;
        Ok(())
    }

    async fn stage_refunds(
        &self,
        run: RunId,
        refunds: &[RefundSnapshot],
    ) -> Result<(), StoreError> {
        let page: Vec<serde_json::Value> = refunds
            .iter()
            .map(|refund| {
                let claimed = refund
                    .metadata
                    .get(METADATA_ATTEMPT_ID)
                    .and_then(|id| Uuid::parse_str(id).ok())
                    .map(|id| id.simple().to_string());
                serde_json::json!({
                    "id": refund.id,
                    "payment": refund.payment_id,
                    "status": refund.status.as_str(),
                    "amount": refund.amount_minor,
                    "currency": refund.currency,
                    "created": micros(refund.created),
                    "claimed": claimed,
                })
            })
            .collect();
        let page = serde_json::Value::Array(page).to_string();
        // Claimed by the refund attempt its metadata names, else by the refund attempt that
        // recorded its id; never by a charge attempt.
        sqlx::query(
            "INSERT INTO report_provider_refunds (
                run_id, provider_refund_id, provider_payment_id, status, amount_minor, currency,
                created_at, attempt_id)
             SELECT ?1, id, payment, status, amount, currency, created,
                    COALESCE(by_metadata, by_provider_id)
             FROM (
                 SELECT staged.*,
                        (SELECT attempt.id FROM payment_attempts attempt
                         WHERE attempt.id = unhex(staged.claimed) AND attempt.kind = 'refund')
                            AS by_metadata,
                        (SELECT attempt.id FROM payment_attempts attempt
                         WHERE attempt.provider_payment_id = staged.id AND attempt.kind = 'refund'
                         ORDER BY attempt.created_at, attempt.id
                         LIMIT 1) AS by_provider_id
                 FROM (SELECT item.value ->> 'id' AS id, item.value ->> 'payment' AS payment,
                              item.value ->> 'status' AS status, item.value ->> 'amount' AS amount,
                              item.value ->> 'currency' AS currency,
                              item.value ->> 'created' AS created,
                              item.value ->> 'claimed' AS claimed, item.key AS position
                       FROM json_each(?2) item) staged
                 ORDER BY staged.position
             )
             WHERE true
             ON CONFLICT (run_id, provider_refund_id) DO NOTHING",
        )
        .bind(run.as_uuid())
        .bind(page)
        .execute(self.pool())
        .await
        .map_err(unavailable)?;
        Ok(())
    }

    async fn build_rows(
        &self,
        run: RunId,
        period: &ReportPeriod,
        objects_listed_max: u32,
        timeout: Duration,
    ) -> Result<u64, StoreError> {
        // PostgreSQL's statement, clause for clause (see `postgres_report.rs` for the why of
        // each): objects ranked within their attempt so a row lists the oldest few but counts
        // all, rows sorted by their own creation time, then by id text.
        let statement = sqlx::query(concat!(
            "WITH refunded AS (
                 SELECT provider_payment_id, sum(amount_minor) AS refunded_minor
                 FROM report_provider_refunds
                 WHERE run_id = ?1 AND status = 'succeeded' AND provider_payment_id IS NOT NULL
                 GROUP BY provider_payment_id
             ),
             objects AS (
                 SELECT payment.attempt_id, payment.provider_payment_id, payment.created_at,
                        row_number() OVER (PARTITION BY payment.attempt_id
                                           ORDER BY payment.created_at, payment.provider_payment_id) AS rank,
                        json_object(
                            'id', payment.provider_payment_id, 'status', payment.status,
                            'amount_minor', payment.amount_minor,
                            'amount_received_minor', payment.amount_received_minor,
                            'currency', payment.currency,
                            'created_at', ", rfc3339!("payment.created_at"), ",
                            'refunded_minor', COALESCE(refunded.refunded_minor, 0),
                            'linked_by', payment.linked_by) AS listed
                 FROM report_provider_payments payment
                 LEFT JOIN refunded ON refunded.provider_payment_id = payment.provider_payment_id
                 WHERE payment.run_id = ?1
             ),
             claimed AS (
                 SELECT attempt_id, count(*) AS objects_total,
                        json_group_array(json(listed) ORDER BY rank) FILTER (WHERE rank <= ?4)
                            AS listed
                 FROM objects WHERE attempt_id IS NOT NULL
                 GROUP BY attempt_id
             ),
             our_refunds AS (
                 SELECT refund.parent_attempt_id, refund.id, refund.provider_payment_id,
                        refund.status, refund.amount_minor,
                        -- The provider refund staging tied to this attempt (by metadata or by
                        -- id); a succeeded one first, should the provider hold two.
                        (SELECT staged.status FROM report_provider_refunds staged
                         WHERE staged.run_id = ?1 AND staged.attempt_id = refund.id
                         ORDER BY staged.status = 'succeeded' DESC, staged.created_at
                         LIMIT 1) AS provider_status,
                        row_number() OVER (PARTITION BY refund.parent_attempt_id
                                           ORDER BY refund.created_at, refund.id) AS rank
                 FROM payment_attempts refund
                 JOIN payment_attempts charge ON charge.id = refund.parent_attempt_id
                 WHERE refund.kind = 'refund' AND charge.kind = 'charge'
                   AND charge.created_at >= ?2 AND charge.created_at < ?3
             ),
             ours_refunded AS (
                 SELECT parent_attempt_id AS attempt_id, sum(amount_minor) AS refunded_minor
                 FROM our_refunds WHERE status = 'succeeded'
                 GROUP BY parent_attempt_id
             ),
             mismatched_refunds AS (
                 SELECT parent_attempt_id AS attempt_id, count(*) AS total,
                        json_group_array(json_object(
                            'attempt_id', ", uuid_text!("id"), ",
                            'provider_refund_id', provider_payment_id,
                            'amount_minor', amount_minor, 'provider_status', provider_status)
                            ORDER BY rank) FILTER (WHERE mismatch_rank <= ?4) AS listed
                 FROM (SELECT *, row_number() OVER (PARTITION BY parent_attempt_id ORDER BY rank)
                                 AS mismatch_rank
                       FROM our_refunds
                       WHERE status = 'succeeded'
                         AND provider_status IS NOT 'succeeded') mismatched
                 GROUP BY parent_attempt_id
             ),
             orphan_refunds AS (
                 SELECT charge_attempt_id AS attempt_id, count(*) AS total,
                        json_group_array(json_object(
                            'id', provider_refund_id, 'status', status, 'amount_minor', amount_minor)
                            ORDER BY rank) FILTER (WHERE rank <= ?4) AS listed
                 FROM (SELECT staged.*, payment.attempt_id AS charge_attempt_id,
                              row_number() OVER (PARTITION BY payment.attempt_id
                                                 ORDER BY staged.created_at, staged.provider_refund_id)
                                  AS rank
                       FROM report_provider_refunds staged
                       JOIN report_provider_payments payment
                         ON payment.run_id = ?1 AND payment.provider_payment_id = staged.provider_payment_id
                       WHERE staged.run_id = ?1 AND staged.attempt_id IS NULL
                         AND payment.attempt_id IS NOT NULL) unclaimed
                 GROUP BY charge_attempt_id
             ),
             joined AS (
                 SELECT attempt.created_at AS sort_at, ", uuid_text!("attempt.id"), " AS sort_key,
                        attempt.id AS attempt_id, attempt.consumer, attempt.operation_key,
                        attempt.status AS attempt_status, attempt.amount_minor, attempt.currency,
                        attempt.provider_payment_id, attempt.failure_code, attempt.review_reason,
                        attempt.created_at AS attempt_created_at,
                        COALESCE(claimed.listed, '[]') AS objects,
                        COALESCE(claimed.objects_total, 0) AS objects_total,
                        -- Attempts of one operation are one business operation (issue 16):
                        -- only a later succeeded attempt has others to compare with (index
                        -- lookups); PostgreSQL's LATERAL join, as two scalar subqueries.
                        CASE WHEN attempt.status = 'succeeded' AND attempt.generation > 0 THEN
                            (SELECT count(*) FROM payment_attempts other
                             WHERE other.consumer = attempt.consumer
                               AND other.operation_key = attempt.operation_key
                               AND other.kind = 'charge' AND other.status = 'succeeded')
                        ELSE 0 END AS operation_succeeded_attempts,
                        CASE WHEN attempt.status = 'succeeded' AND attempt.generation > 0 THEN
                            (SELECT count(*) FROM payment_attempts other
                             JOIN report_provider_payments payment
                               ON payment.run_id = ?1 AND payment.attempt_id = other.id
                             WHERE other.consumer = attempt.consumer
                               AND other.operation_key = attempt.operation_key
                               AND other.kind = 'charge'
                               AND other.generation < attempt.generation
                               AND payment.status <> 'canceled'
                               AND payment.provider_payment_id IS NOT attempt.provider_payment_id)
                        ELSE 0 END AS operation_earlier_live_objects,
                        COALESCE(ours_refunded.refunded_minor, 0) AS ours_refunded_minor,
                        json_object(
                            'orphans', json(COALESCE(orphan_refunds.listed, '[]')),
                            'orphans_total', COALESCE(orphan_refunds.total, 0),
                            'mismatches', json(COALESCE(mismatched_refunds.listed, '[]')),
                            'mismatches_total', COALESCE(mismatched_refunds.total, 0)) AS refunds
                 FROM payment_attempts attempt
                 LEFT JOIN claimed ON claimed.attempt_id = attempt.id
                 LEFT JOIN ours_refunded ON ours_refunded.attempt_id = attempt.id
                 LEFT JOIN mismatched_refunds ON mismatched_refunds.attempt_id = attempt.id
                 LEFT JOIN orphan_refunds ON orphan_refunds.attempt_id = attempt.id
                 WHERE attempt.kind = 'charge' AND attempt.created_at >= ?2 AND attempt.created_at < ?3
                 UNION ALL
                 SELECT created_at, provider_payment_id, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                        NULL, NULL, NULL, json_array(json(listed)), 1, 0, 0, 0, '{}'
                 FROM objects
                 WHERE attempt_id IS NULL AND created_at >= ?2 AND created_at < ?3
             )
             INSERT INTO report_rows (
                 run_id, seq, attempt_id, consumer, operation_key, attempt_status, amount_minor,
                 currency, provider_payment_id, failure_code, review_reason, attempt_created_at,
                 objects, objects_total, operation_succeeded_attempts,
                 operation_earlier_live_objects, ours_refunded_minor, refunds)
             SELECT ?1, row_number() OVER (ORDER BY sort_at, sort_key), attempt_id, consumer,
                    operation_key, attempt_status, amount_minor, currency, provider_payment_id,
                    failure_code, review_reason, attempt_created_at, objects, objects_total,
                    operation_succeeded_attempts, operation_earlier_live_objects,
                    ours_refunded_minor, refunds
             FROM joined"
        ))
        .bind(run.as_uuid())
        .bind(micros(period.from()))
        .bind(micros(period.to()))
        .bind(i64::from(objects_listed_max));
        self.execute_with_timeout(statement, timeout).await
    }

    async fn rows_page(
        &self,
        run: RunId,
        after_seq: i64,
        limit: u32,
    ) -> Result<Vec<JoinedRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT * FROM report_rows WHERE run_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
        )
        .bind(run.as_uuid())
        .bind(after_seq)
        .bind(i64::from(limit))
        .fetch_all(self.pool())
        .await
        .map_err(unavailable)?;
        rows.iter().map(joined_row).collect()
    }

    async fn end_run(&self, run: RunId, timeout: Duration) -> Result<(), StoreError> {
        let statement = sqlx::query("DELETE FROM report_runs WHERE run_id = ?1").bind(run.as_uuid());
        self.execute_with_timeout(statement, timeout)
            .await
            .map(drop)
    }
}

/// `postgres_report.rs`'s `joined_row` for SQLite's column types: JSON as text, instants as
/// integer microseconds, counts as 64-bit integers.
fn joined_row(row: &SqliteRow) -> Result<JoinedRow, StoreError> {
    let seq: i64 = row.try_get("seq").map_err(unavailable)?;
    let corrupt = |what: String| StoreError::Corrupt(format!("report row {seq}: {what}"));
    let json = |column: &str| -> Result<String, StoreError> {
        row.try_get::<String, _>(column)
            .map_err(|e| corrupt(e.to_string()))
    };
    let objects: Vec<ProviderObject> =
        serde_json::from_str(&json("objects")?).map_err(|e| corrupt(e.to_string()))?;
    let count = |column: &str| -> Result<u32, StoreError> {
        let value: i64 = row.try_get(column).map_err(|e| corrupt(e.to_string()))?;
        u32::try_from(value).map_err(|e| corrupt(format!("{column}: {e}")))
    };
    let attempt_id: Option<Uuid> = row
        .try_get("attempt_id")
        .map_err(|e| corrupt(e.to_string()))?;
    let attempt = attempt_id
        .map(|id| -> Result<AttemptFacts, StoreError> {
            let get = |column: &str| {
                row.try_get::<Option<String>, _>(column)
                    .map_err(|e| corrupt(e.to_string()))
            };
            let required =
                |column: &str| get(column)?.ok_or_else(|| corrupt(format!("{column} is null")));
            let status = required("attempt_status")?;
            let created_micros = row
                .try_get::<Option<i64>, _>("attempt_created_at")
                .map_err(|e| corrupt(e.to_string()))?
                .ok_or_else(|| corrupt("attempt_created_at is null".to_owned()))?;
            Ok(AttemptFacts {
                id: AttemptId::from_uuid(id),
                consumer: required("consumer")?,
                operation_key: required("operation_key")?,
                status: AttemptStatus::parse(&status)
                    .ok_or_else(|| corrupt(format!("unknown status {status:?}")))?,
                amount_minor: row
                    .try_get::<Option<i64>, _>("amount_minor")
                    .map_err(|e| corrupt(e.to_string()))?
                    .ok_or_else(|| corrupt("amount_minor is null".to_owned()))?,
                currency: required("currency")?,
                provider_payment_id: get("provider_payment_id")?,
                failure_code: get("failure_code")?,
                review_reason: get("review_reason")?,
                created_at: DateTime::from_timestamp_micros(created_micros).ok_or_else(|| {
                    corrupt(format!("attempt_created_at {created_micros} is out of range"))
                })?,
                ours_refunded_minor: row
                    .try_get("ours_refunded_minor")
                    .map_err(|e| corrupt(e.to_string()))?,
                refunds: serde_json::from_str(&json("refunds")?)
                    .map_err(|e| corrupt(format!("refunds: {e}")))?,
            })
        })
        .transpose()?;
    Ok(JoinedRow {
        seq,
        attempt,
        objects,
        objects_total: count("objects_total")?,
        operation: OperationFacts {
            succeeded_attempts: count("operation_succeeded_attempts")?,
            earlier_live_objects: count("operation_earlier_live_objects")?,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite::SqliteStoreOptions;

    #[tokio::test]
    async fn a_statement_past_its_timeout_is_interrupted_and_its_connection_goes_on_unhindered() {
        let dir = tempfile::tempdir().unwrap();
        let options = SqliteStoreOptions {
            // One connection: the statement after the timeout runs on the interrupted one.
            connections_max: 1,
            acquire_timeout: Duration::from_secs(10),
            busy_timeout: Duration::from_secs(10),
        };
        let store = SqliteStore::open(SqliteStore::file(&dir.path().join("t.sqlite")), &options)
            .await
            .unwrap();
        store.migrate().await.unwrap();
        let counting = |to: u64| {
            format!(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {to})
                 INSERT INTO report_runs SELECT randomblob(16), max(i) FROM n"
            )
        };
        let slow = counting(1_000_000_000);
        let error = store
            .execute_with_timeout(sqlx::query(&slow), Duration::from_millis(50))
            .await
            .unwrap_err();
        assert!(
            matches!(&error, StoreError::Unavailable(message) if message.contains("report.statement_timeout_ms")),
            "{error:?}"
        );
        // Longer than the interrupted statement's 50 ms, with no handler left to stop it.
        let longer = counting(3_000_000);
        let started = Instant::now();
        sqlx::query(&longer).execute(store.pool()).await.unwrap();
        assert!(started.elapsed() > Duration::from_millis(50), "the check needs a statement past 50 ms");
        let runs: i64 = sqlx::query_scalar("SELECT count(*) FROM report_runs")
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(runs, 1, "the interrupted statement wrote nothing");
    }
}
