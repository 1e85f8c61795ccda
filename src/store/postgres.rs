use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx::{ConnectOptions, Connection, Row};
use uuid::Uuid;

use super::postgres_group::{ChargeWrite, FinishRequest, KeptConnection, PostgresGroupCommit, limits_of};
use super::row::{AttemptColumns, ColumnError, attempt_from_row, encode_progress, optional_attempt};
use super::{
    AttemptStore, CallerTime, InsertOutcome, LeaseRequest, Leased, ListCursor, ListFilter,
    NewAttempt, RoundResult, StoreError, classify_returned, conflict_winner, micros_of,
};
use crate::config::GroupCommitConfig;
use crate::domain::{
    Attempt, AttemptId, AttemptKind, AttemptStatus, ConsumerName, CustomerId, Description, LeaseOwner,
    ListProgress, OperationKey,
};

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// A pooled connection idle this long is pinged before use (see `connect_lazy`).
pub(super) const PING_IF_IDLE_FOR: Duration = Duration::from_secs(1);

/// Bounds of the connection pool, passed explicitly rather than left to library defaults.
#[derive(Debug, Clone)]
pub struct PostgresPoolOptions {
    pub connections_max: u32,
    pub acquire_timeout: Duration,
    pub statement_timeout: Duration,
}

#[derive(Clone)]
pub struct PostgresStore {
    pool: PgPool,
    /// Set, `insert_pending` and `finish_round` go through group commit (`postgres_group.rs`).
    group: Option<PostgresGroupCommit>,
    /// The group committer's connection between its statements (none without group commit).
    kept: KeptConnection,
}

impl PostgresStore {
    /// Connects lazily: the service starts (and reports NOT_SERVING) while the database is down.
    pub fn connect_lazy(url: &str, options: &PostgresPoolOptions) -> Result<Self, StoreError> {
        let connect_options: PgConnectOptions = url
            .parse::<PgConnectOptions>()
            .map_err(|error| StoreError::Unavailable(format!("bad database url: {error}")))?
            .log_statements(tracing::log::LevelFilter::Trace);
        // Set by a statement on each new connection rather than as a startup `options`
        // parameter, which pgbouncer refuses (README "Deploying"): the lease's bound on a round
        // counts on every statement being cut off at this timeout, through a pooler or not.
        let set_statement_timeout = format!("SET statement_timeout = {}", options.statement_timeout.as_millis());
        let pool = PgPoolOptions::new()
            .after_connect(move |connection, _meta| {
                let set_statement_timeout = set_statement_timeout.clone();
                Box::pin(async move {
                    sqlx::Executor::execute(connection, set_statement_timeout.as_str()).await?;
                    Ok(())
                })
            })
            .max_connections(options.connections_max)
            .acquire_timeout(options.acquire_timeout)
            // sqlx pings every connection it hands out by default: one more round trip per
            // statement. Only a connection that sat idle is pinged; a busy one that broke fails
            // its statement, which every caller handles as "database unavailable, retry".
            .test_before_acquire(false)
            .before_acquire(|connection, meta| {
                Box::pin(async move {
                    if meta.idle_for >= PING_IF_IDLE_FOR {
                        connection.ping().await?;
                    }
                    Ok(true)
                })
            })
            .connect_lazy_with(connect_options);
        Ok(Self { pool, group: None, kept: KeptConnection::default() })
    }

    pub fn from_pool(pool: PgPool) -> Self {
        Self { pool, group: None, kept: KeptConnection::default() }
    }

    /// The same store with `insert_pending` and `finish_round` grouped into shared statements
    /// and commits; starts the committer task on the current runtime.
    pub fn with_group_commit(self, config: &GroupCommitConfig) -> Self {
        let group = super::postgres_group::spawn(&self.pool, limits_of(config), self.kept.clone());
        Self { group: Some(group), ..self }
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR.run(&self.pool).await.map_err(|error| StoreError::Unavailable(error.to_string()))
    }
}

pub(super) fn unavailable(error: sqlx::Error) -> StoreError {
    StoreError::Unavailable(error.to_string())
}

pub(super) fn status_names(statuses: &[AttemptStatus]) -> Vec<String> {
    statuses.iter().map(|status| status.as_str().to_owned()).collect()
}

pub(super) const UNFINISHED: [&str; 2] = ["pending", "requires_action"];

/// The SET of a statement that takes a lease: $2 owner, $4 duration and $5 the key window's
/// safe length in microseconds, `clock.database_now` the statement's reading. A lease taken
/// while the key is young enough to be sent extends the range in which a create can have
/// reached the provider.
const LEASE_SET: &str = "lease_owner = $2,
                lease_expires_at = clock.database_now + $4 * interval '1 microsecond',
                create_sent_until = CASE
                    WHEN clock.database_now - key_window_started_at
                         < $5 * interval '1 microsecond'
                    THEN GREATEST(create_sent_until,
                                  clock.database_now + $4 * interval '1 microsecond')
                    ELSE create_sent_until END";

fn leased_from_row(row: &PgRow) -> Result<Leased, StoreError> {
    let attempt = attempt_from_row(row)?;
    let database_now = row
        .try_get("database_now")
        .map_err(|error| StoreError::Corrupt(format!("database_now: {error}")))?;
    Ok(Leased { attempt, database_now })
}

/// `insert_pending`'s statement alone: the row it returned, if any (one round trip, one commit).
pub(super) async fn insert_pending_statement<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    new: &NewAttempt,
) -> Result<Option<Attempt>, StoreError> {
    let metadata = serde_json::to_value(new.params.metadata.entries())
        .map_err(|error| StoreError::Corrupt(error.to_string()))?;
    // One round trip for every outcome (migrations 20261202000005, 20261203000001,
    // 20261204000002): the row that holds the attempt, or the earlier attempt that refuses
    // it, or else the new pending row. A duplicate, the common
    // repeated call, costs one indexed read; the insert is not even started when the row is
    // there. The function reads the database's clock for the key window, lease and check.
    let row = sqlx::query(
        "SELECT * FROM insert_pending_attempt(
            $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18,
            $19)",
    )
    .bind(new.id.as_uuid())
    .bind(new.consumer.as_str())
    .bind(new.operation_key.as_str())
    .bind(new.params.amount_minor)
    .bind(new.params.currency.code())
    .bind(new.params.payment_method.as_str())
    .bind(new.params.customer.as_ref().map(CustomerId::as_str))
    .bind(new.params.description.as_ref().map(Description::as_str))
    .bind(metadata)
    .bind(new.fingerprint.as_str())
    .bind(new.provider)
    .bind(new.idempotency_key.as_str())
    .bind(new.generation as i32)
    .bind(new.time.now)
    .bind(new.time.shift_micros())
    .bind(new.lease_owner.as_uuid())
    .bind(micros_of(new.lease_duration))
    .bind(micros_of(new.recovery_grace))
    .bind(new.return_url.as_deref())
    .fetch_optional(executor)
    .await
    .map_err(unavailable)?;
    row.as_ref().map(attempt_from_row).transpose()
}

/// `finish_round`'s statement alone (one round trip, one commit).
pub(super) async fn finish_round_statement<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    request: &FinishRequest,
) -> Result<Option<Attempt>, StoreError> {
    // In SET, `status` is the row's value before this update, so each CASE asks whether the
    // move is allowed from the state the row really is in. A review reason is added to the
    // earlier ones by the same function the webhook inbox uses (migration 20261203140001).
    sqlx::query(
        "UPDATE payment_attempts SET
            failure_code = CASE WHEN status = ANY($3) THEN $6 ELSE failure_code END,
            failure_message = CASE WHEN status = ANY($3) THEN $7 ELSE failure_message END,
            next_action_type = CASE WHEN status = ANY($3) THEN $8 ELSE next_action_type END,
            next_action_url = CASE WHEN status = ANY($3) THEN $9 ELSE next_action_url END,
            provider_status = CASE WHEN status = ANY($12) THEN COALESCE($5, provider_status)
                                   ELSE provider_status END,
            action_started_at = CASE WHEN status = ANY($3) AND $2 = 'requires_action'
                                     THEN now() + $15 * interval '1 microsecond'
                                     ELSE action_started_at END,
            status = CASE WHEN status = ANY($3) THEN $2 ELSE status END,
            provider_payment_id = COALESCE(provider_payment_id, $4),
            review_reason = append_review_reason(review_reason, $10::text),
            provider_calls = provider_calls + $11,
            check_count = check_count + 1,
            next_check_at = now() + ($15::bigint + $13::bigint) * interval '1 microsecond',
            last_error = $14,
            create_replays_failure = create_replays_failure OR $17,
            lookup_cursor = CASE WHEN $18 THEN $19 ELSE lookup_cursor END,
            lease_owner = NULL,
            lease_expires_at = NULL,
            updated_at = now() + $15 * interval '1 microsecond'
         WHERE id = $1 AND lease_owner = $16
         RETURNING *",
    )
    .bind(request.id)
    .bind(request.result.status.as_str())
    .bind(status_names(&request.result.status.allowed_sources()))
    .bind(request.result.provider_payment_id.as_deref())
    .bind(request.result.provider_status.as_deref())
    .bind(request.result.failure.as_ref().map(|failure| failure.code.as_str()))
    .bind(request.result.failure.as_ref().map(|failure| failure.message.as_str()))
    .bind(request.result.next_action.as_ref().map(|action| action.kind.as_str()))
    .bind(request.result.next_action.as_ref().and_then(|action| action.redirect_url.as_deref()))
    .bind(request.result.review_reason.as_deref())
    .bind(request.result.calls_made as i32)
    .bind(&UNFINISHED[..])
    .bind(micros_of(request.result.next_check_in))
    .bind(request.result.last_error.as_deref())
    .bind(request.time.shift_micros())
    .bind(request.owner.as_uuid())
    .bind(request.result.create_replays_failure)
    .bind(request.result.lookup_progress.is_some())
    .bind(request.result.lookup_progress.as_ref().and_then(encode_progress))
    .fetch_optional(executor)
    .await
    .map_err(unavailable)
    .and_then(optional_attempt)
}

#[async_trait]
impl AttemptStore for PostgresStore {
    async fn insert_pending(&self, new: &NewAttempt) -> Result<InsertOutcome, StoreError> {
        let returned = match &self.group {
            Some(group) => group.submit(ChargeWrite::Insert(new.clone())).await??,
            None => insert_pending_statement(&self.pool, new).await?,
        };
        if let Some(attempt) = returned {
            // Only the row this call proposed carries its new id.
            if attempt.id == new.id {
                return Ok(InsertOutcome::Inserted(attempt));
            }
            return classify_returned(new, attempt);
        }
        if new.generation > 0 {
            // A later attempt with no earlier charge attempt of its operation.
            return Ok(InsertOutcome::OutOfOrder { latest_attempt: None });
        }
        // Nothing: the function re-reads after a conflict, so only a conflict on the derived
        // key with another operation's row (impossible: the key is a function of the operation)
        // gets here. Read once more and report what is there.
        conflict_winner(self, new).await
    }

    async fn insert_pending_refund(
        &self,
        new: &super::NewRefund,
    ) -> Result<super::RefundInsertOutcome, StoreError> {
        self.insert_pending_refund_statement(new).await
    }

    async fn refund_totals(
        &self,
        charge_ids: &[AttemptId],
    ) -> Result<std::collections::HashMap<AttemptId, super::RefundTotals>, StoreError> {
        self.refund_totals_statement(charge_ids).await
    }

    async fn find_by_operation(
        &self,
        consumer: &ConsumerName,
        operation_key: &OperationKey,
    ) -> Result<Option<Attempt>, StoreError> {
        sqlx::query("SELECT * FROM payment_attempts WHERE consumer = $1 AND operation_key = $2
             ORDER BY generation DESC LIMIT 1")
            .bind(consumer.as_str())
            .bind(operation_key.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(unavailable)
            .and_then(optional_attempt)
    }

    async fn count_operation_attempts(
        &self,
        consumer: &ConsumerName,
        operation_key: &OperationKey,
    ) -> Result<u32, StoreError> {
        let count: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM payment_attempts WHERE consumer = $1 AND operation_key = $2",
        )
        .bind(consumer.as_str())
        .bind(operation_key.as_str())
        .fetch_one(&self.pool)
        .await
        .map_err(unavailable)?;
        u32::try_from(count).map_err(|_| StoreError::Corrupt(format!("{count} attempts of one operation")))
    }

    async fn record_payment_canceled(
        &self,
        id: AttemptId,
        provider_payment_id: &str,
        time: CallerTime,
    ) -> Result<bool, StoreError> {
        let updated = sqlx::query(
            "UPDATE payment_attempts
             SET provider_status = 'canceled', updated_at = now() + $3 * interval '1 microsecond'
             WHERE id = $1 AND status = 'failed' AND provider_payment_id = $2",
        )
        .bind(id.as_uuid())
        .bind(provider_payment_id)
        .bind(time.shift_micros())
        .execute(&self.pool)
        .await
        .map_err(unavailable)?;
        Ok(updated.rows_affected() == 1)
    }

    async fn find_by_id(
        &self,
        consumer: Option<&ConsumerName>,
        id: AttemptId,
    ) -> Result<Option<Attempt>, StoreError> {
        sqlx::query(
            "SELECT * FROM payment_attempts WHERE id = $1 AND ($2::text IS NULL OR consumer = $2)",
        )
        .bind(id.as_uuid())
        .bind(consumer.map(ConsumerName::as_str))
        .fetch_optional(&self.pool)
        .await
        .map_err(unavailable)
        .and_then(optional_attempt)
    }

    async fn acquire_lease(
        &self,
        id: AttemptId,
        lease: LeaseRequest,
    ) -> Result<Option<Leased>, StoreError> {
        // updated_at is left alone: it records the row's last change, and a clock reading
        // earlier than it is how a decision notices a clock that went back.
        sqlx::query(&format!(
            "WITH clock AS (SELECT now() + $3 * interval '1 microsecond' AS database_now)
             UPDATE payment_attempts SET {LEASE_SET}
             FROM clock
             WHERE id = $1 AND status = ANY($6)
               AND (lease_expires_at IS NULL OR lease_expires_at <= clock.database_now)
             RETURNING payment_attempts.*, clock.database_now"
        ))
        .bind(id.as_uuid())
        .bind(lease.owner.as_uuid())
        .bind(lease.time.shift_micros())
        .bind(micros_of(lease.duration))
        .bind(micros_of(lease.key_window_safe))
        .bind(&UNFINISHED[..])
        .fetch_optional(&self.pool)
        .await
        .map_err(unavailable)?
        .map(|row| leased_from_row(&row))
        .transpose()
    }

    async fn renew_lease(
        &self,
        id: AttemptId,
        owner: LeaseOwner,
        duration: chrono::Duration,
        lookup_progress: &ListProgress,
        time: CallerTime,
    ) -> Result<bool, StoreError> {
        let renewed = sqlx::query(
            "UPDATE payment_attempts
             SET lease_expires_at = now() + ($3::bigint + $4::bigint) * interval '1 microsecond',
                 lookup_cursor = $5
             WHERE id = $1 AND lease_owner = $2",
        )
        .bind(id.as_uuid())
        .bind(owner.as_uuid())
        .bind(time.shift_micros())
        .bind(micros_of(duration))
        .bind(encode_progress(lookup_progress))
        .execute(&self.pool)
        .await
        .map_err(unavailable)?;
        Ok(renewed.rows_affected() == 1)
    }

    async fn finish_round(
        &self,
        id: AttemptId,
        owner: LeaseOwner,
        result: &RoundResult,
        time: CallerTime,
    ) -> Result<Option<Attempt>, StoreError> {
        let request = FinishRequest { id: id.as_uuid(), owner, result: result.clone(), time };
        match &self.group {
            Some(group) => group.submit(ChargeWrite::Finish(request)).await?,
            None => finish_round_statement(&self.pool, &request).await,
        }
    }

    async fn clear_review(
        &self,
        id: AttemptId,
        time: CallerTime,
    ) -> Result<Option<Attempt>, StoreError> {
        sqlx::query(
            "UPDATE payment_attempts SET
                review_history = CASE WHEN review_history IS NULL THEN review_reason
                                      ELSE review_history || '; ' || review_reason END,
                review_reason = NULL,
                next_check_at = now() + $2 * interval '1 microsecond',
                updated_at = now() + $2 * interval '1 microsecond'
             WHERE id = $1 AND status = ANY($3) AND review_reason IS NOT NULL
             RETURNING *",
        )
        .bind(id.as_uuid())
        .bind(time.shift_micros())
        .bind(&UNFINISHED[..])
        .fetch_optional(&self.pool)
        .await
        .map_err(unavailable)
        .and_then(optional_attempt)
    }

    async fn list(
        &self,
        consumer: &ConsumerName,
        filter: &ListFilter,
        after: Option<ListCursor>,
        limit: u32,
    ) -> Result<Vec<Attempt>, StoreError> {
        let rows = sqlx::query(
            "SELECT * FROM payment_attempts
             WHERE consumer = $1
               AND ($2::text IS NULL OR status = $2)
               AND ($3::timestamptz IS NULL OR created_at >= $3)
               AND ($4::timestamptz IS NULL OR created_at < $4)
               AND ($5::timestamptz IS NULL OR (created_at, id) < ($5, $6))
               AND ($8::text IS NULL OR operation_key = $8)
               AND ($9::text IS NULL OR kind = $9)
             ORDER BY created_at DESC, id DESC
             LIMIT $7",
        )
        .bind(consumer.as_str())
        .bind(filter.status.map(AttemptStatus::as_str))
        .bind(filter.created_from)
        .bind(filter.created_to)
        .bind(after.map(|cursor| cursor.created_at))
        .bind(after.map(|cursor| cursor.id.as_uuid()))
        .bind(i64::from(limit))
        .bind(filter.operation_key.as_ref().map(OperationKey::as_str))
        .bind(filter.kind.map(AttemptKind::as_str))
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        rows.iter().map(attempt_from_row).collect()
    }

    async fn claim_due(
        &self,
        lease: LeaseRequest,
        batch_max: u32,
    ) -> Result<Vec<Leased>, StoreError> {
        // SKIP LOCKED: concurrent sweepers each take different rows instead of queueing on the
        // same ones; the lease then keeps the row theirs after this statement commits.
        let rows = sqlx::query(&format!(
            "WITH clock AS (SELECT now() + $3 * interval '1 microsecond' AS database_now)
             UPDATE payment_attempts SET {LEASE_SET}
             FROM clock
             WHERE id IN (
                SELECT id FROM payment_attempts, clock
                WHERE status = ANY($6) AND next_check_at <= clock.database_now
                  AND (lease_expires_at IS NULL OR lease_expires_at <= clock.database_now)
                ORDER BY next_check_at
                LIMIT $1
                FOR UPDATE OF payment_attempts SKIP LOCKED)
             RETURNING payment_attempts.*, clock.database_now"
        ))
        .bind(i64::from(batch_max))
        .bind(lease.owner.as_uuid())
        .bind(lease.time.shift_micros())
        .bind(micros_of(lease.duration))
        .bind(micros_of(lease.key_window_safe))
        .bind(&UNFINISHED[..])
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        rows.iter().map(leased_from_row).collect()
    }

    async fn oldest_unfinished_created_at(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        // The predicate is spelled as the partial index's, so that even a generic plan uses it.
        sqlx::query_scalar(
            "SELECT min(created_at) FROM payment_attempts
             WHERE status IN ('pending', 'requires_action')",
        )
        .fetch_one(&self.pool)
        .await
        .map_err(unavailable)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await.map_err(unavailable)?;
        Ok(())
    }

    async fn close(&self) {
        // Marks the pool closed before the kept connection goes back, so the committer keeps
        // none after this; closing waits for every connection out of the pool.
        let closing = self.pool.close();
        self.kept.release();
        closing.await;
    }
}

/// PostgreSQL reads instants as `timestamptz`, ids as `uuid`, counters as `integer` and
/// metadata as `jsonb`; `row::attempt_from_row` checks the values.
impl AttemptColumns for PgRow {
    fn uuid(&self, column: &str) -> Result<Option<Uuid>, ColumnError> {
        Ok(self.try_get(column)?)
    }

    fn text(&self, column: &str) -> Result<Option<String>, ColumnError> {
        Ok(self.try_get(column)?)
    }

    fn time(&self, column: &str) -> Result<Option<DateTime<Utc>>, ColumnError> {
        Ok(self.try_get(column)?)
    }

    fn count(&self, column: &str) -> Result<i64, ColumnError> {
        Ok(i64::from(self.try_get::<i32, _>(column)?))
    }

    fn flag(&self, column: &str) -> Result<bool, ColumnError> {
        Ok(self.try_get(column)?)
    }

    fn amount_minor(&self) -> Result<i64, ColumnError> {
        Ok(self.try_get("amount_minor")?)
    }

    fn metadata(&self) -> Result<BTreeMap<String, String>, ColumnError> {
        let value: serde_json::Value = self.try_get("metadata")?;
        Ok(serde_json::from_value(value)?)
    }
}
