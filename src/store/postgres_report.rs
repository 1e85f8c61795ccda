//! `ReportStore` on PostgreSQL (migration `20261202000004_report_staging.sql`).

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::postgres::PgRow;
use uuid::Uuid;

use super::StoreError;
use super::postgres::{PostgresStore, unavailable};
use super::report::{ReportStore, RunId, StagedPayment};
use crate::domain::{AttemptId, AttemptStatus, RefundSnapshot};
use crate::provider::METADATA_ATTEMPT_ID;
use crate::report::{AttemptFacts, JoinedRow, OperationFacts, ProviderObject, ReportPeriod};

impl PostgresStore {
    /// Runs `statement` in its own transaction under `timeout` instead of the pool's statement
    /// timeout: the report's joins and deletes grow with the period.
    async fn execute_with_timeout<'q>(
        &self,
        statement: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
        timeout: Duration,
    ) -> Result<u64, StoreError> {
        let mut transaction = self.pool().begin().await.map_err(unavailable)?;
        // SET LOCAL takes no bind parameters; the value is a number we format ourselves.
        sqlx::query(&format!(
            "SET LOCAL statement_timeout = {}",
            timeout.as_millis()
        ))
        .execute(&mut *transaction)
        .await
        .map_err(unavailable)?;
        let done = statement
            .execute(&mut *transaction)
            .await
            .map_err(unavailable)?;
        transaction.commit().await.map_err(unavailable)?;
        Ok(done.rows_affected())
    }
}

#[async_trait]
impl ReportStore for PostgresStore {
    async fn begin_run(
        &self,
        run: RunId,
        now: DateTime<Utc>,
        abandoned_before: DateTime<Utc>,
        timeout: Duration,
    ) -> Result<(), StoreError> {
        let abandoned =
            sqlx::query("DELETE FROM report_runs WHERE started_at < $1").bind(abandoned_before);
        let deleted = self.execute_with_timeout(abandoned, timeout).await?;
        if deleted > 0 {
            tracing::warn!(
                runs = deleted,
                "deleted the staging of abandoned report runs"
            );
        }
        // Staging joins the provider's objects to the attempts: a table autovacuum never
        // analyzed (a young database, or one whose activity counters a crash reset before
        // autovacuum got to it) is planned as empty, and the chaos test's 20,000-attempt report
        // ran for minutes until its statement timeout; analyzed, it took 10 s. A table analyzed
        // once is left to autovacuum.
        let attempts_never_analyzed: bool =
            sqlx::query_scalar("SELECT reltuples < 0 FROM pg_class WHERE oid = 'payment_attempts'::regclass")
                .fetch_one(self.pool())
                .await
                .map_err(unavailable)?;
        if attempts_never_analyzed {
            self.execute_with_timeout(sqlx::query("ANALYZE payment_attempts"), timeout).await?;
        }
        sqlx::query("INSERT INTO report_runs (run_id, started_at) VALUES ($1, $2)")
            .bind(run.as_uuid())
            .bind(now)
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
        let column =
            |get: fn(&StagedPayment<'_>) -> String| payments.iter().map(get).collect::<Vec<_>>();
        let ids = column(|staged| staged.payment.id.clone());
        let statuses = column(|staged| staged.payment.status.as_str().to_owned());
        let currencies = column(|staged| staged.payment.currency.clone());
        let claimed: Vec<Option<Uuid>> = payments
            .iter()
            .map(|staged| staged.claimed_attempt.map(AttemptId::as_uuid))
            .collect();
        let amounts: Vec<i64> = payments
            .iter()
            .map(|staged| staged.payment.amount_minor)
            .collect();
        let received: Vec<i64> = payments
            .iter()
            .map(|staged| staged.payment.amount_received_minor)
            .collect();
        let created: Vec<DateTime<Utc>> = payments
            .iter()
            .map(|staged| staged.payment.created)
            .collect();
        // An intent re-confirmed by later attempts of its operation (issue 16) belongs to the
        // latest of them (its metadata names the attempt that created it, which keeps its
        // decline). Otherwise the metadata's claim wins when that attempt exists; else the
        // attempt that recorded the object's id (the metadata may name an attempt of another
        // database).
        sqlx::query(
            "INSERT INTO report_provider_payments (
                run_id, provider_payment_id, attempt_id, linked_by, status, amount_minor,
                amount_received_minor, currency, created_at)
             SELECT $1, staged.id, COALESCE(by_confirm.id, by_metadata.id, by_provider_id.id),
                    CASE WHEN by_confirm.id IS NOT NULL THEN 'confirms_payment_id'
                         WHEN by_metadata.id IS NOT NULL THEN 'metadata'
                         WHEN by_provider_id.id IS NOT NULL THEN 'provider_payment_id' END,
                    staged.status, staged.amount, staged.received, staged.currency, staged.created
             FROM UNNEST($2::text[], $3::uuid[], $4::text[], $5::bigint[], $6::bigint[], $7::text[],
                         $8::timestamptz[])
                  AS staged(id, claimed, status, amount, received, currency, created)
             LEFT JOIN payment_attempts by_metadata ON by_metadata.id = staged.claimed
             LEFT JOIN LATERAL (
                 SELECT attempt.id FROM payment_attempts attempt
                 WHERE attempt.provider_payment_id = staged.id
                 ORDER BY attempt.created_at, attempt.id
                 LIMIT 1
             ) by_provider_id ON by_metadata.id IS NULL
             LEFT JOIN LATERAL (
                 SELECT attempt.id FROM payment_attempts attempt
                 WHERE attempt.confirms_payment_id = staged.id AND attempt.kind = 'charge'
                 ORDER BY attempt.generation DESC
                 LIMIT 1
             ) by_confirm ON true
             ON CONFLICT (run_id, provider_payment_id) DO NOTHING",
        )
        .bind(run.as_uuid())
        .bind(ids)
        .bind(claimed)
        .bind(statuses)
        .bind(amounts)
        .bind(received)
        .bind(currencies)
        .bind(created)
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
        let ids: Vec<&str> = refunds.iter().map(|refund| refund.id.as_str()).collect();
        let payments: Vec<Option<&str>> = refunds
            .iter()
            .map(|refund| refund.payment_id.as_deref())
            .collect();
        let statuses: Vec<&str> = refunds
            .iter()
            .map(|refund| refund.status.as_str())
            .collect();
        let amounts: Vec<i64> = refunds.iter().map(|refund| refund.amount_minor).collect();
        let currencies: Vec<&str> = refunds
            .iter()
            .map(|refund| refund.currency.as_str())
            .collect();
        let created: Vec<DateTime<Utc>> = refunds.iter().map(|refund| refund.created).collect();
        let claimed: Vec<Option<Uuid>> = refunds
            .iter()
            .map(|refund| {
                refund
                    .metadata
                    .get(METADATA_ATTEMPT_ID)
                    .and_then(|id| Uuid::parse_str(id).ok())
            })
            .collect();
        // Claimed by the refund attempt its metadata names, else by the refund attempt that
        // recorded its id; never by a charge attempt.
        sqlx::query(
            "INSERT INTO report_provider_refunds (
                run_id, provider_refund_id, provider_payment_id, status, amount_minor, currency,
                created_at, attempt_id)
             SELECT $1, staged.id, staged.payment, staged.status, staged.amount, staged.currency,
                    staged.created, COALESCE(by_metadata.id, by_provider_id.id)
             FROM UNNEST($2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[],
                         $7::timestamptz[], $8::uuid[])
                  AS staged(id, payment, status, amount, currency, created, claimed)
             LEFT JOIN payment_attempts by_metadata
                    ON by_metadata.id = staged.claimed AND by_metadata.kind = 'refund'
             LEFT JOIN LATERAL (
                 SELECT attempt.id FROM payment_attempts attempt
                 WHERE attempt.provider_payment_id = staged.id AND attempt.kind = 'refund'
                 ORDER BY attempt.created_at, attempt.id
                 LIMIT 1
             ) by_provider_id ON by_metadata.id IS NULL
             ON CONFLICT (run_id, provider_refund_id) DO NOTHING",
        )
        .bind(run.as_uuid())
        .bind(ids)
        .bind(payments)
        .bind(statuses)
        .bind(amounts)
        .bind(currencies)
        .bind(created)
        .bind(claimed)
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
        // The staging tables were just filled: without fresh statistics the planner takes
        // them for empty and joins them row by row (minutes at 20,000 attempts), and
        // autovacuum, if it runs at all, comes after the report.
        self.execute_with_timeout(sqlx::query("ANALYZE report_provider_payments, report_provider_refunds"), timeout)
            .await?;
        // Objects are ranked within their attempt so a row lists the oldest few but counts
        // all; an attempt's row and an orphan's row sort by their own creation time.
        let statement = sqlx::query(
            "WITH refunded AS (
                 SELECT provider_payment_id, sum(amount_minor) AS refunded_minor
                 FROM report_provider_refunds
                 WHERE run_id = $1 AND status = 'succeeded' AND provider_payment_id IS NOT NULL
                 GROUP BY provider_payment_id
             ),
             objects AS (
                 SELECT payment.*, COALESCE(refunded.refunded_minor, 0) AS refunded_minor,
                        row_number() OVER (PARTITION BY payment.attempt_id
                                           ORDER BY payment.created_at, payment.provider_payment_id) AS rank,
                        jsonb_build_object(
                            'id', payment.provider_payment_id, 'status', payment.status,
                            'amount_minor', payment.amount_minor,
                            'amount_received_minor', payment.amount_received_minor,
                            'currency', payment.currency, 'created_at', payment.created_at,
                            'refunded_minor', COALESCE(refunded.refunded_minor, 0),
                            'linked_by', payment.linked_by) AS listed
                 FROM report_provider_payments payment
                 LEFT JOIN refunded USING (provider_payment_id)
                 WHERE payment.run_id = $1
             ),
             claimed AS (
                 SELECT attempt_id, count(*) AS objects_total,
                        jsonb_agg(listed ORDER BY rank) FILTER (WHERE rank <= $4) AS listed
                 FROM objects WHERE attempt_id IS NOT NULL
                 GROUP BY attempt_id
             ),
             our_refunds AS (
                 SELECT refund.parent_attempt_id, refund.id, refund.provider_payment_id,
                        refund.status, refund.amount_minor, staged.status AS provider_status,
                        row_number() OVER (PARTITION BY refund.parent_attempt_id
                                           ORDER BY refund.created_at, refund.id) AS rank
                 FROM payment_attempts refund
                 JOIN payment_attempts charge ON charge.id = refund.parent_attempt_id
                 -- The provider refund staging tied to this attempt (by metadata or by id); a
                 -- succeeded one first, should the provider hold two.
                 LEFT JOIN LATERAL (
                     SELECT staged.status FROM report_provider_refunds staged
                     WHERE staged.run_id = $1 AND staged.attempt_id = refund.id
                     ORDER BY staged.status = 'succeeded' DESC, staged.created_at
                     LIMIT 1
                 ) staged ON true
                 WHERE refund.kind = 'refund' AND charge.kind = 'charge'
                   AND charge.created_at >= $2 AND charge.created_at < $3
             ),
             ours_refunded AS (
                 SELECT parent_attempt_id AS attempt_id, sum(amount_minor) AS refunded_minor
                 FROM our_refunds WHERE status = 'succeeded'
                 GROUP BY parent_attempt_id
             ),
             mismatched_refunds AS (
                 SELECT parent_attempt_id AS attempt_id, count(*) AS total,
                        jsonb_agg(jsonb_build_object(
                            'attempt_id', id::text, 'provider_refund_id', provider_payment_id,
                            'amount_minor', amount_minor, 'provider_status', provider_status)
                            ORDER BY rank) FILTER (WHERE mismatch_rank <= $4) AS listed
                 FROM (SELECT *, row_number() OVER (PARTITION BY parent_attempt_id ORDER BY rank)
                                 AS mismatch_rank
                       FROM our_refunds
                       WHERE status = 'succeeded'
                         AND provider_status IS DISTINCT FROM 'succeeded') mismatched
                 GROUP BY parent_attempt_id
             ),
             orphan_refunds AS (
                 SELECT charge_attempt_id AS attempt_id, count(*) AS total,
                        jsonb_agg(jsonb_build_object(
                            'id', provider_refund_id, 'status', status, 'amount_minor', amount_minor)
                            ORDER BY rank) FILTER (WHERE rank <= $4) AS listed
                 FROM (SELECT staged.*, payment.attempt_id AS charge_attempt_id,
                              row_number() OVER (PARTITION BY payment.attempt_id
                                                 ORDER BY staged.created_at, staged.provider_refund_id)
                                  AS rank
                       FROM report_provider_refunds staged
                       JOIN report_provider_payments payment
                         ON payment.run_id = $1 AND payment.provider_payment_id = staged.provider_payment_id
                       WHERE staged.run_id = $1 AND staged.attempt_id IS NULL
                         AND payment.attempt_id IS NOT NULL) unclaimed
                 GROUP BY charge_attempt_id
             ),
             rows AS (
                 SELECT attempt.created_at AS sort_at, attempt.id::text AS sort_key,
                        attempt.id AS attempt_id, attempt.consumer, attempt.operation_key,
                        attempt.status AS attempt_status, attempt.amount_minor, attempt.currency,
                        attempt.provider_payment_id, attempt.failure_code, attempt.review_reason,
                        attempt.created_at AS attempt_created_at,
                        COALESCE(claimed.listed, '[]'::jsonb) AS objects,
                        COALESCE(claimed.objects_total, 0) AS objects_total,
                        COALESCE(operation.succeeded_attempts, 0) AS operation_succeeded_attempts,
                        COALESCE(operation.earlier_live_objects, 0) AS operation_earlier_live_objects,
                        COALESCE(ours_refunded.refunded_minor, 0) AS ours_refunded_minor,
                        jsonb_build_object(
                            'orphans', COALESCE(orphan_refunds.listed, '[]'::jsonb),
                            'orphans_total', COALESCE(orphan_refunds.total, 0),
                            'mismatches', COALESCE(mismatched_refunds.listed, '[]'::jsonb),
                            'mismatches_total', COALESCE(mismatched_refunds.total, 0)) AS refunds
                 FROM payment_attempts attempt
                 LEFT JOIN claimed ON claimed.attempt_id = attempt.id
                 LEFT JOIN ours_refunded ON ours_refunded.attempt_id = attempt.id
                 LEFT JOIN mismatched_refunds ON mismatched_refunds.attempt_id = attempt.id
                 LEFT JOIN orphan_refunds ON orphan_refunds.attempt_id = attempt.id
                 -- Attempts of one operation are one business operation (issue 16): only a
                 -- later succeeded attempt has others to compare with (index lookups).
                 LEFT JOIN LATERAL (
                     SELECT count(DISTINCT other.id) FILTER (WHERE other.status = 'succeeded')
                                AS succeeded_attempts,
                            count(payment.provider_payment_id) FILTER (
                                WHERE other.generation < attempt.generation
                                  AND payment.status <> 'canceled'
                                  AND payment.provider_payment_id
                                      IS DISTINCT FROM attempt.provider_payment_id)
                                AS earlier_live_objects
                     FROM payment_attempts other
                     LEFT JOIN report_provider_payments payment
                         ON payment.run_id = $1 AND payment.attempt_id = other.id
                     WHERE attempt.status = 'succeeded' AND attempt.generation > 0
                       AND other.consumer = attempt.consumer
                       AND other.operation_key = attempt.operation_key AND other.kind = 'charge'
                 ) operation ON true
                 WHERE attempt.kind = 'charge' AND attempt.created_at >= $2 AND attempt.created_at < $3
                 UNION ALL
                 SELECT created_at, provider_payment_id, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                        NULL, NULL, NULL, jsonb_build_array(listed), 1, 0, 0, 0, '{}'::jsonb
                 FROM objects
                 WHERE attempt_id IS NULL AND created_at >= $2 AND created_at < $3
             )
             INSERT INTO report_rows (
                 run_id, seq, attempt_id, consumer, operation_key, attempt_status, amount_minor,
                 currency, provider_payment_id, failure_code, review_reason, attempt_created_at,
                 objects, objects_total, operation_succeeded_attempts,
                 operation_earlier_live_objects, ours_refunded_minor, refunds)
             SELECT $1, row_number() OVER (ORDER BY sort_at, sort_key), attempt_id, consumer,
                    operation_key, attempt_status, amount_minor, currency, provider_payment_id,
                    failure_code, review_reason, attempt_created_at, objects, objects_total,
                    operation_succeeded_attempts, operation_earlier_live_objects,
                    ours_refunded_minor, refunds
             FROM rows",
        )
        .bind(run.as_uuid())
        .bind(period.from())
        .bind(period.to())
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
            "SELECT * FROM report_rows WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
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
        let statement =
            sqlx::query("DELETE FROM report_runs WHERE run_id = $1").bind(run.as_uuid());
        self.execute_with_timeout(statement, timeout)
            .await
            .map(drop)
    }
}

fn joined_row(row: &PgRow) -> Result<JoinedRow, StoreError> {
    let seq: i64 = row.try_get("seq").map_err(unavailable)?;
    let corrupt = |what: String| StoreError::Corrupt(format!("report row {seq}: {what}"));
    let objects: serde_json::Value = row.try_get("objects").map_err(|e| corrupt(e.to_string()))?;
    let objects: Vec<ProviderObject> =
        serde_json::from_value(objects).map_err(|e| corrupt(e.to_string()))?;
    let objects_total: i32 = row
        .try_get("objects_total")
        .map_err(|e| corrupt(e.to_string()))?;
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
                created_at: row
                    .try_get::<Option<DateTime<Utc>>, _>("attempt_created_at")
                    .map_err(|e| corrupt(e.to_string()))?
                    .ok_or_else(|| corrupt("attempt_created_at is null".to_owned()))?,
                ours_refunded_minor: row
                    .try_get("ours_refunded_minor")
                    .map_err(|e| corrupt(e.to_string()))?,
                refunds: serde_json::from_value(
                    row.try_get::<serde_json::Value, _>("refunds")
                        .map_err(|e| corrupt(e.to_string()))?,
                )
                .map_err(|e| corrupt(format!("refunds: {e}")))?,
            })
        })
        .transpose()?;
    let count = |column: &str| -> Result<u32, StoreError> {
        let value: i32 = row.try_get(column).map_err(|e| corrupt(e.to_string()))?;
        u32::try_from(value).map_err(|e| corrupt(e.to_string()))
    };
    Ok(JoinedRow {
        seq,
        attempt,
        objects,
        objects_total: u32::try_from(objects_total).map_err(|e| corrupt(e.to_string()))?,
        operation: OperationFacts {
            succeeded_attempts: count("operation_succeeded_attempts")?,
            earlier_live_objects: count("operation_earlier_live_objects")?,
        },
    })
}
