//! The embedded store: `payment_attempts` in one SQLite file, for a first run, demos and a
//! single process. It keeps exactly the PostgreSQL store's semantics (the same behaviour tests
//! run on both); where SQLite lacks a PostgreSQL feature the comment at that statement says what
//! stands in for it.
//!
//! Storage choices: instants are INTEGER microseconds since the Unix epoch (numeric comparison
//! and ORDER BY, PostgreSQL's precision), ids are 16-byte BLOBs (memcmp order, as PostgreSQL
//! orders uuid), metadata is JSON text. See migrations/sqlite/.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{ConnectOptions, Row};
use uuid::Uuid;

use super::row::{AttemptColumns, ColumnError, attempt_from_row, encode_progress, optional_attempt};
use super::{
    AttemptStore, CallerTime, InsertOutcome, LeaseRequest, Leased, ListCursor, ListFilter,
    NewAttempt, RoundResult, StoreError, conflict_winner, micros_of, requested_attempt,
};
use crate::domain::{
    Admission, Attempt, AttemptId, AttemptKind, AttemptStatus, admit, ConsumerName, CustomerId, Description, LeaseOwner,
    ListProgress, OperationKey,
};

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

/// The unfinished statuses, written into the SQL rather than bound: SQLite uses the partial
/// index `payment_attempts_unfinished_due` only when a query repeats its condition literally.
/// A unit test checks this list against `AttemptStatus::is_terminal`.
const UNFINISHED_SQL: &str = "('pending', 'requires_action')";

/// The database's clock in integer microseconds, plus the shift bound as ?N (zero in the
/// service). SQLite reads 'now' once per statement, so every use in one statement agrees.
macro_rules! database_now {
    ($parameter:literal) => {
        concat!("(CAST(unixepoch('subsec') * 1000000 AS INTEGER) + ?", $parameter, ")")
    };
}
pub(super) const DATABASE_NOW_1: &str = database_now!("1");
const DATABASE_NOW_2: &str = database_now!("2");
pub(super) const DATABASE_NOW_3: &str = database_now!("3");
pub(super) const DATABASE_NOW_6: &str = database_now!("6");
const DATABASE_NOW_14: &str = database_now!("14");
const DATABASE_NOW_15: &str = database_now!("15");

/// PostgreSQL's `append_review_reason(review_reason, ?N)` (migration 20261203140001), inline,
/// with the reason bound as ?N: the new reason after the earlier ones, never twice, the whole
/// under 8192 characters.
macro_rules! append_review_reason {
    ($parameter:literal) => {
        concat!(
            "CASE
    WHEN ?", $parameter, " IS NULL OR ?", $parameter, " = '' THEN review_reason
    WHEN review_reason IS NULL OR review_reason = '' THEN substr(?", $parameter, ", 1, 8192)
    WHEN instr(review_reason, ?", $parameter, ") > 0 THEN review_reason
    WHEN length(review_reason) + 2 + length(?", $parameter, ") > 8192 THEN review_reason
    ELSE review_reason || '; ' || ?", $parameter, " END"
        )
    };
}
pub(super) use append_review_reason;
const APPEND_REVIEW_REASON_10: &str = append_review_reason!("10");

/// The SET of a statement that takes a lease: ?2 owner, ?3 the shift, ?4 duration and ?5 the
/// key window's safe length (microseconds). A lease taken while the key is young enough to be
/// sent extends the range in which a create can have reached the provider.
const LEASE_SET: &str = "lease_owner = ?2,
     lease_expires_at = (CAST(unixepoch('subsec') * 1000000 AS INTEGER) + ?3) + ?4,
     create_sent_until = CASE
         WHEN (CAST(unixepoch('subsec') * 1000000 AS INTEGER) + ?3) - key_window_started_at < ?5
         THEN max(COALESCE(create_sent_until, 0),
                  (CAST(unixepoch('subsec') * 1000000 AS INTEGER) + ?3) + ?4)
         ELSE create_sent_until END";

fn leased_from_row(row: &SqliteRow) -> Result<Leased, StoreError> {
    let attempt = attempt_from_row(row)?;
    let database_now = row
        .try_get::<i64, _>("database_now")
        .map_err(|error| StoreError::Corrupt(format!("database_now: {error}")))
        .and_then(database_instant)?;
    Ok(Leased { attempt, database_now })
}

/// The database's clock as a statement read it (`database_now!`, integer microseconds).
pub(super) fn database_instant(micros: i64) -> Result<DateTime<Utc>, StoreError> {
    instant_from_micros(micros).map_err(|error| StoreError::Corrupt(format!("database_now: {error}")))
}

/// SQLite's memory in this process, all connections together (`PRAGMA soft_heap_limit`).
const SQLITE_SOFT_HEAP_BYTES_MAX: u64 = 8 * 1024 * 1024;

/// Bounds of the connection pool, passed explicitly rather than left to library defaults.
#[derive(Debug, Clone)]
pub struct SqliteStoreOptions {
    pub connections_max: u32,
    pub acquire_timeout: Duration,
    /// How long a statement waits for the database's one write lock before it fails as
    /// unavailable. The embedded counterpart of PostgreSQL's statement timeout.
    pub busy_timeout: Duration,
}

#[derive(Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
}

impl SqliteStore {
    /// Opens (creating if missing) the database file and connects once, so that a bad path or
    /// a file that is not a database fails at start with its name, not at the first charge.
    pub async fn open(
        connect_options: SqliteConnectOptions,
        options: &SqliteStoreOptions,
    ) -> Result<Self, StoreError> {
        let connect_options = connect_options
            .create_if_missing(true)
            // WAL: readers never block the writer nor each other, so reads (get, list, the
            // health ping) go on while a charge is being recorded.
            .journal_mode(SqliteJournalMode::Wal)
            // FULL: every commit is fsynced to the WAL before the statement returns. With
            // NORMAL, WAL mode stays consistent but the last commits can vanish on power loss
            // or an OS crash; here a commit is a financial record (a pending row whose key may
            // already be at the provider, an outcome a caller was told), so losing one could
            // lose intent (SEMANTICS.md invariant 2) or contradict an answer already given.
            // Measured on the 2-core dev machine: an insert plus a finish (two commits) takes
            // ~9 ms with FULL against ~0.8 ms with NORMAL — small next to the provider call.
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            // SQLite runs in this process: what it caches is this process's memory. Without a
            // bound, a report's join (its temporary sorts, materialized CTEs and automatic
            // indexes, each with a cache of its own) grew the process with the period: peak RSS
            // 39, 46, 72, 84 MiB at 2k, 10k, 100k, 200k attempts (BENCHMARKS.md). The soft
            // limit makes SQLite reuse cache pages before allocating more (never failing an
            // allocation because of it); with it, 39-44 MiB from 2k to 200k (debug build). It is one
            // limit for the whole process, set by every connection alike.
            .pragma("soft_heap_limit", SQLITE_SOFT_HEAP_BYTES_MAX.to_string())
            .busy_timeout(options.busy_timeout)
            .log_statements(tracing::log::LevelFilter::Trace);
        let path = connect_options.get_filename().display().to_string();
        let pool = SqlitePoolOptions::new()
            .max_connections(options.connections_max)
            .acquire_timeout(options.acquire_timeout)
            .connect_with(connect_options)
            .await
            .map_err(|error| {
                StoreError::Unavailable(format!("opening SQLite at {path}: {error}"))
            })?;
        Ok(Self { pool })
    }

    /// Connect options for a database file at `path`.
    pub fn file(path: &Path) -> SqliteConnectOptions {
        SqliteConnectOptions::new().filename(path)
    }

    pub fn from_pool(pool: SqlitePool) -> Self {
        Self { pool }
    }

    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    pub async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR
            .run(&self.pool)
            .await
            .map_err(|error| StoreError::Unavailable(error.to_string()))
    }
}

pub(super) fn unavailable(error: sqlx::Error) -> StoreError {
    StoreError::Unavailable(error.to_string())
}

pub(super) fn micros(instant: DateTime<Utc>) -> i64 {
    instant.timestamp_micros()
}

/// Statuses as a JSON array, for `status IN (SELECT value FROM json_each(?))`: SQLite has no
/// array parameters, and the set depends on the target status.
pub(super) fn status_list(statuses: &[AttemptStatus]) -> String {
    let names: Vec<&str> = statuses.iter().map(|status| status.as_str()).collect();
    serde_json::to_string(&names).expect("a list of strings serializes")
}

/// The pending row's insert. ?14 is the caller's clock, ?15 the shift of the database's, ?20 the
/// earlier attempt's intent this one confirms again; the SELECT's WHERE is needed by SQLite's
/// parser before an upsert clause.
fn insert_statement() -> String {
    format!(
        "WITH clock AS (SELECT {DATABASE_NOW_15} AS database_now)
         INSERT INTO payment_attempts (
            id, consumer, operation_key, kind, amount_minor, currency, payment_method,
            customer, description, metadata, fingerprint, status, provider, idempotency_key,
            generation, key_window_started_at, create_sent_until, return_url, lease_owner,
            lease_expires_at, next_check_at, created_at, updated_at, confirms_payment_id)
         SELECT ?1, ?2, ?3, 'charge', ?4, ?5, ?6, ?7, ?8, ?9, ?10, 'pending', ?11, ?12, ?13,
                min(?14, database_now), database_now + ?17, ?19, ?16, database_now + ?17,
                database_now + ?18, database_now, database_now, ?20
         FROM clock WHERE true
         ON CONFLICT DO NOTHING
         RETURNING *"
    )
}

/// The row of `new`'s attempt of its operation, if written.
async fn find_attempt<'e>(
    executor: impl sqlx::SqliteExecutor<'e>,
    new: &NewAttempt,
) -> Result<Option<Attempt>, StoreError> {
    sqlx::query(
        "SELECT * FROM payment_attempts
         WHERE consumer = ?1 AND operation_key = ?2 AND generation = ?3",
    )
    .bind(new.consumer.as_str())
    .bind(new.operation_key.as_str())
    .bind(i64::from(new.generation))
    .fetch_optional(executor)
    .await
    .map_err(unavailable)
    .and_then(optional_attempt)
}

fn bind_insert<'q>(
    sql: &'q str,
    new: &'q NewAttempt,
    metadata: String,
    confirms_payment_id: Option<&'q str>,
) -> sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>> {
    sqlx::query(sql)
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
        .bind(i64::from(new.generation))
        .bind(micros(new.time.now))
        .bind(new.time.shift_micros())
        .bind(new.lease_owner.as_uuid())
        .bind(micros_of(new.lease_duration))
        .bind(micros_of(new.recovery_grace))
        .bind(new.return_url.as_deref())
        .bind(confirms_payment_id)
}

#[async_trait]
impl AttemptStore for SqliteStore {
    async fn insert_pending(&self, new: &NewAttempt) -> Result<InsertOutcome, StoreError> {
        let metadata = serde_json::to_string(new.params.metadata.entries())
            .map_err(|error| StoreError::Corrupt(error.to_string()))?;
        let sql = insert_statement();
        if new.generation == 0 {
            // A first attempt needs nothing before it: one statement, as before attempt numbers.
            let inserted = bind_insert(&sql, new, metadata, None)
                .fetch_optional(&self.pool)
                .await
                .map_err(unavailable)?;
            if let Some(row) = inserted {
                return Ok(InsertOutcome::Inserted(attempt_from_row(&row)?));
            }
            // The conflict's winner: this attempt of the operation (later ones may exist).
            return match find_attempt(&self.pool, new).await? {
                Some(existing) => Ok(InsertOutcome::Existing(existing)),
                None => conflict_winner(self, new).await,
            };
        }
        // A later attempt: the rule's reads and the insert in one short transaction. BEGIN
        // IMMEDIATE takes the database's one write lock before the first read, so no other
        // writer (another attempt's insert, a round's finish, a cancel being recorded) can
        // change what the rule read before this transaction commits: PostgreSQL's FOR UPDATE
        // of the earlier attempt, for a database with one writer.
        let mut transaction = self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(unavailable)?;
        if let Some(existing) = find_attempt(&mut *transaction, new).await? {
            return Ok(InsertOutcome::Existing(existing));
        }
        let latest = sqlx::query(
            "SELECT * FROM payment_attempts
             WHERE consumer = ?1 AND operation_key = ?2 AND kind = 'charge' AND generation < ?3
             ORDER BY generation DESC LIMIT 1",
        )
        .bind(new.consumer.as_str())
        .bind(new.operation_key.as_str())
        .bind(i64::from(new.generation))
        .fetch_optional(&mut *transaction)
        .await
        .map_err(unavailable)?
        .map(|row| attempt_from_row(&row))
        .transpose()?;
        let admission = admit(latest.as_ref(), requested_attempt(new)?, &new.params);
        let confirms_payment_id = match admission {
            Admission::Insert { confirms_payment_id } => confirms_payment_id,
            // Dropping the transaction rolls it back: nothing was written.
            refused => return Ok(InsertOutcome::refused(refused).expect("not an insert")),
        };
        let inserted = bind_insert(&sql, new, metadata, confirms_payment_id.as_deref())
            .fetch_optional(&mut *transaction)
            .await
            .map_err(unavailable)?;
        transaction.commit().await.map_err(unavailable)?;
        match inserted {
            Some(row) => Ok(InsertOutcome::Inserted(attempt_from_row(&row)?)),
            // Under the write lock nobody inserted this attempt after the read above.
            None => Err(StoreError::Corrupt(format!(
                "attempt {} of {:?} conflicted under the write lock",
                new.generation + 1,
                new.operation_key.as_str()
            ))),
        }
    }

    async fn insert_pending_refund(
        &self,
        new: &super::NewRefund,
    ) -> Result<super::RefundInsertOutcome, StoreError> {
        self.insert_pending_refund_transaction(new).await
    }

    async fn refund_totals(
        &self,
        charge_ids: &[AttemptId],
    ) -> Result<std::collections::HashMap<AttemptId, super::RefundTotals>, StoreError> {
        self.refund_totals_statement(charge_ids).await
    }

    async fn count_operation_attempts(
        &self,
        consumer: &ConsumerName,
        operation_key: &OperationKey,
    ) -> Result<u32, StoreError> {
        let count: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM payment_attempts WHERE consumer = ?1 AND operation_key = ?2",
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
        let updated = sqlx::query(&format!(
            "UPDATE payment_attempts SET provider_status = 'canceled', updated_at = {DATABASE_NOW_3}
             WHERE id = ?1 AND status = 'failed' AND provider_payment_id = ?2"
        ))
        .bind(id.as_uuid())
        .bind(provider_payment_id)
        .bind(time.shift_micros())
        .execute(&self.pool)
        .await
        .map_err(unavailable)?;
        Ok(updated.rows_affected() == 1)
    }

    async fn find_by_operation(
        &self,
        consumer: &ConsumerName,
        operation_key: &OperationKey,
    ) -> Result<Option<Attempt>, StoreError> {
        sqlx::query("SELECT * FROM payment_attempts WHERE consumer = ?1 AND operation_key = ?2
             ORDER BY generation DESC LIMIT 1")
            .bind(consumer.as_str())
            .bind(operation_key.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(unavailable)
            .and_then(optional_attempt)
    }

    async fn find_by_id(
        &self,
        consumer: Option<&ConsumerName>,
        id: AttemptId,
    ) -> Result<Option<Attempt>, StoreError> {
        sqlx::query(
            "SELECT * FROM payment_attempts WHERE id = ?1 AND (?2 IS NULL OR consumer = ?2)",
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
            "UPDATE payment_attempts SET {LEASE_SET}
             WHERE id = ?1 AND status IN {UNFINISHED_SQL}
               AND (lease_expires_at IS NULL OR lease_expires_at <= {DATABASE_NOW_3})
             RETURNING *, {DATABASE_NOW_3} AS database_now"
        ))
        .bind(id.as_uuid())
        .bind(lease.owner.as_uuid())
        .bind(lease.time.shift_micros())
        .bind(micros_of(lease.duration))
        .bind(micros_of(lease.key_window_safe))
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
        let renewed = sqlx::query(&format!(
            "UPDATE payment_attempts
             SET lease_expires_at = {DATABASE_NOW_3} + ?4, lookup_cursor = ?5
             WHERE id = ?1 AND lease_owner = ?2"
        ))
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
        // As in PostgreSQL, every expression in SET reads the row as it was before this update
        // (SQLite: "all scalar expressions ... refer to the original row"), so each CASE asks
        // whether the move is allowed from the state the row really is in, even though `status`
        // is assigned in the same SET. A behaviour test moves a terminal row and checks that
        // nothing guarded changed.
        sqlx::query(&format!(
            "UPDATE payment_attempts SET
                failure_code = CASE WHEN status IN (SELECT value FROM json_each(?3))
                                    THEN ?6 ELSE failure_code END,
                failure_message = CASE WHEN status IN (SELECT value FROM json_each(?3))
                                       THEN ?7 ELSE failure_message END,
                next_action_type = CASE WHEN status IN (SELECT value FROM json_each(?3))
                                        THEN ?8 ELSE next_action_type END,
                next_action_url = CASE WHEN status IN (SELECT value FROM json_each(?3))
                                       THEN ?9 ELSE next_action_url END,
                provider_status = CASE WHEN status IN {UNFINISHED_SQL}
                                       THEN COALESCE(?5, provider_status)
                                       ELSE provider_status END,
                action_started_at = CASE WHEN status IN (SELECT value FROM json_each(?3))
                                              AND ?2 = 'requires_action'
                                         THEN {DATABASE_NOW_14} ELSE action_started_at END,
                status = CASE WHEN status IN (SELECT value FROM json_each(?3))
                              THEN ?2 ELSE status END,
                provider_payment_id = COALESCE(provider_payment_id, ?4),
                review_reason = {APPEND_REVIEW_REASON_10},
                provider_calls = provider_calls + ?11,
                check_count = check_count + 1,
                next_check_at = {DATABASE_NOW_14} + ?12,
                last_error = ?13,
                create_replays_failure = max(create_replays_failure, ?16),
                lookup_cursor = CASE WHEN ?17 THEN ?18 ELSE lookup_cursor END,
                lease_owner = NULL,
                lease_expires_at = NULL,
                updated_at = {DATABASE_NOW_14}
             WHERE id = ?1 AND lease_owner = ?15
             RETURNING *"
        ))
        .bind(id.as_uuid())
        .bind(result.status.as_str())
        .bind(status_list(&result.status.allowed_sources()))
        .bind(result.provider_payment_id.as_deref())
        .bind(result.provider_status.as_deref())
        .bind(result.failure.as_ref().map(|failure| failure.code.as_str()))
        .bind(result.failure.as_ref().map(|failure| failure.message.as_str()))
        .bind(result.next_action.as_ref().map(|action| action.kind.as_str()))
        .bind(result.next_action.as_ref().and_then(|action| action.redirect_url.as_deref()))
        .bind(result.review_reason.as_deref())
        .bind(i64::from(result.calls_made))
        .bind(micros_of(result.next_check_in))
        .bind(result.last_error.as_deref())
        .bind(time.shift_micros())
        .bind(owner.as_uuid())
        .bind(result.create_replays_failure)
        .bind(result.lookup_progress.is_some())
        .bind(result.lookup_progress.as_ref().and_then(encode_progress))
        .fetch_optional(&self.pool)
        .await
        .map_err(unavailable)
        .and_then(optional_attempt)
    }

    async fn clear_review(
        &self,
        id: AttemptId,
        time: CallerTime,
    ) -> Result<Option<Attempt>, StoreError> {
        sqlx::query(&format!(
            "UPDATE payment_attempts SET
                review_history = CASE WHEN review_history IS NULL THEN review_reason
                                      ELSE review_history || '; ' || review_reason END,
                review_reason = NULL,
                next_check_at = {DATABASE_NOW_2},
                updated_at = {DATABASE_NOW_2}
             WHERE id = ?1 AND status IN {UNFINISHED_SQL} AND review_reason IS NOT NULL
             RETURNING *"
        ))
        .bind(id.as_uuid())
        .bind(time.shift_micros())
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
        // Row-value comparison `(created_at, id) < (?, ?)` is the keyset step, as in
        // PostgreSQL; both columns compare numerically / bytewise, matching the ORDER BY.
        let rows = sqlx::query(
            "SELECT * FROM payment_attempts
             WHERE consumer = ?1
               AND (?2 IS NULL OR status = ?2)
               AND (?3 IS NULL OR created_at >= ?3)
               AND (?4 IS NULL OR created_at < ?4)
               AND (?5 IS NULL OR (created_at, id) < (?5, ?6))
               AND (?8 IS NULL OR operation_key = ?8)
               AND (?9 IS NULL OR kind = ?9)
             ORDER BY created_at DESC, id DESC
             LIMIT ?7",
        )
        .bind(consumer.as_str())
        .bind(filter.status.map(AttemptStatus::as_str))
        .bind(filter.created_from.map(micros))
        .bind(filter.created_to.map(micros))
        .bind(after.map(|cursor| micros(cursor.created_at)))
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
        // No SKIP LOCKED here (SQLite has none, and needs none): SQLite lets one writer at a
        // time into the whole database, and this one statement takes that write lock before it
        // reads, so concurrent claimers — other connections of this pool or other processes on
        // the same file — run one after another (waiting up to busy_timeout), and each sees the
        // leases written by the one before it. Never the same row twice; a behaviour test races
        // two claimers.
        let rows = sqlx::query(&format!(
            "UPDATE payment_attempts SET {LEASE_SET}
             WHERE id IN (
                SELECT id FROM payment_attempts
                WHERE status IN {UNFINISHED_SQL} AND next_check_at <= {DATABASE_NOW_3}
                  AND (lease_expires_at IS NULL OR lease_expires_at <= {DATABASE_NOW_3})
                ORDER BY next_check_at
                LIMIT ?1)
             RETURNING *, {DATABASE_NOW_3} AS database_now"
        ))
        .bind(i64::from(batch_max))
        .bind(lease.owner.as_uuid())
        .bind(lease.time.shift_micros())
        .bind(micros_of(lease.duration))
        .bind(micros_of(lease.key_window_safe))
        .fetch_all(&self.pool)
        .await
        .map_err(unavailable)?;
        rows.iter().map(leased_from_row).collect()
    }

    async fn oldest_unfinished_created_at(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        // The predicate is spelled as the partial index's, so that SQLite may use it.
        let oldest: Option<i64> = sqlx::query_scalar(&format!(
            "SELECT min(created_at) FROM payment_attempts WHERE status IN {UNFINISHED_SQL}"
        ))
        .fetch_one(&self.pool)
        .await
        .map_err(unavailable)?;
        oldest
            .map(instant_from_micros)
            .transpose()
            .map_err(|error| StoreError::Corrupt(format!("oldest unfinished created_at: {error}")))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn close(&self) {
        // sqlx 0.8's `close` can miss a connection that was being handed back while it ran: the
        // connection reaches the idle queue after `close` last looked there, and stays open
        // until the pool is dropped — with it the `-wal` file a clean stop should fold away.
        // Closing again closes what was missed; bounded, since nothing can open a new one.
        for _ in 0..CLOSE_PASSES_MAX {
            self.pool.close().await;
            if self.pool.size() == 0 {
                return;
            }
            tokio::time::sleep(CLOSE_PASS_INTERVAL).await;
        }
        tracing::warn!(connections = self.pool.size(), "SQLite connections still open after closing the store");
    }
}

/// How many times `close` looks for connections a pass missed, and how long it waits between.
const CLOSE_PASSES_MAX: u32 = 50;
const CLOSE_PASS_INTERVAL: Duration = Duration::from_millis(10);

pub(super) fn instant_from_micros(value: i64) -> Result<DateTime<Utc>, ColumnError> {
    DateTime::from_timestamp_micros(value)
        .ok_or_else(|| format!("{value} microseconds is out of range").into())
}

/// SQLite reads instants as integer microseconds, ids as 16-byte blobs, counters as integers
/// and metadata as JSON text; `row::attempt_from_row` checks the values.
impl AttemptColumns for SqliteRow {
    fn uuid(&self, column: &str) -> Result<Option<Uuid>, ColumnError> {
        Ok(self.try_get(column)?)
    }

    fn text(&self, column: &str) -> Result<Option<String>, ColumnError> {
        Ok(self.try_get(column)?)
    }

    fn time(&self, column: &str) -> Result<Option<DateTime<Utc>>, ColumnError> {
        self.try_get::<Option<i64>, _>(column)?
            .map(instant_from_micros)
            .transpose()
    }

    fn flag(&self, column: &str) -> Result<bool, ColumnError> {
        Ok(self.try_get(column)?)
    }

    fn count(&self, column: &str) -> Result<i64, ColumnError> {
        Ok(self.try_get(column)?)
    }

    fn amount_minor(&self) -> Result<i64, ColumnError> {
        Ok(self.try_get("amount_minor")?)
    }

    fn metadata(&self) -> Result<BTreeMap<String, String>, ColumnError> {
        let text: String = self.try_get("metadata")?;
        Ok(serde_json::from_str(&text)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn open_in(dir: &Path) -> SqliteStore {
        let options = SqliteStoreOptions {
            connections_max: 2,
            acquire_timeout: Duration::from_secs(5),
            busy_timeout: Duration::from_secs(5),
        };
        let store = SqliteStore::open(SqliteStore::file(&dir.join("unit.sqlite")), &options)
            .await
            .unwrap();
        store.migrate().await.unwrap();
        store
    }

    #[test]
    fn unfinished_sql_lists_exactly_the_non_terminal_statuses() {
        let expected: Vec<String> = AttemptStatus::ALL
            .into_iter()
            .filter(|status| !status.is_terminal())
            .map(|status| format!("'{}'", status.as_str()))
            .collect();
        assert_eq!(UNFINISHED_SQL, format!("({})", expected.join(", ")));
    }

    #[test]
    fn every_postgres_migration_of_payment_attempts_has_a_sqlite_twin() {
        // The two schemas must not drift: a change to payment_attempts on PostgreSQL (its table
        // or an index on it) needs its SQLite counterpart, with the same version and name. A
        // PostgreSQL function over the table is not schema: SQLite runs the statement inline.
        let sqlite: Vec<(i64, String)> = MIGRATOR
            .iter()
            .map(|m| (m.version, m.description.to_string()))
            .collect();
        for migration in super::super::postgres::MIGRATOR.iter() {
            let sql = migration.sql.to_string();
            if sql.contains("TABLE payment_attempts") || sql.contains("ON payment_attempts") {
                let twin = (migration.version, migration.description.to_string());
                assert!(
                    sqlite.contains(&twin),
                    "no migrations/sqlite twin of {twin:?}"
                );
            }
        }
    }

    #[test]
    fn instants_keep_microseconds_and_order() {
        let early = DateTime::from_timestamp_micros(1_700_000_000_000_001).unwrap();
        let late = DateTime::from_timestamp_micros(1_700_000_000_000_002).unwrap();
        assert!(micros(early) < micros(late));
        assert_eq!(instant_from_micros(micros(late)).unwrap(), late);
        assert!(instant_from_micros(i64::MAX).is_err());
    }

    #[tokio::test]
    async fn connections_use_wal_full_sync_foreign_keys_and_a_busy_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(dir.path()).await;
        let mut connection = store.pool().acquire().await.unwrap();
        let pragma = |name: &'static str| format!("PRAGMA {name}");
        let journal: String = sqlx::query_scalar(&pragma("journal_mode"))
            .fetch_one(&mut *connection)
            .await
            .unwrap();
        assert_eq!(journal, "wal");
        // 2 = FULL (0 OFF, 1 NORMAL, 3 EXTRA).
        let synchronous: i64 = sqlx::query_scalar(&pragma("synchronous"))
            .fetch_one(&mut *connection)
            .await
            .unwrap();
        assert_eq!(synchronous, 2);
        let foreign_keys: i64 = sqlx::query_scalar(&pragma("foreign_keys"))
            .fetch_one(&mut *connection)
            .await
            .unwrap();
        assert_eq!(foreign_keys, 1);
        let busy_timeout_ms: i64 = sqlx::query_scalar(&pragma("busy_timeout"))
            .fetch_one(&mut *connection)
            .await
            .unwrap();
        assert_eq!(busy_timeout_ms, 5_000);
    }

    #[tokio::test]
    async fn set_expressions_read_the_row_as_it_was_before_the_update() {
        // finish_round relies on this: its CASEs must see the old status even where they come
        // after `status = …` in the SET list.
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(dir.path()).await;
        sqlx::query("CREATE TABLE moves (status TEXT NOT NULL, seen TEXT)")
            .execute(store.pool())
            .await
            .unwrap();
        sqlx::query("INSERT INTO moves (status) VALUES ('pending')")
            .execute(store.pool())
            .await
            .unwrap();
        let seen: String = sqlx::query_scalar(
            "UPDATE moves SET status = 'succeeded',
                              seen = CASE WHEN status = 'pending' THEN 'old' ELSE 'new' END
             RETURNING seen",
        )
        .fetch_one(store.pool())
        .await
        .unwrap();
        assert_eq!(seen, "old");
    }

    #[tokio::test]
    async fn the_due_scan_uses_the_partial_index() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(dir.path()).await;
        let plan: Vec<(i64, i64, i64, String)> = sqlx::query_as(&format!(
            "EXPLAIN QUERY PLAN SELECT id FROM payment_attempts
             WHERE status IN {UNFINISHED_SQL} AND next_check_at <= ?1
               AND (lease_expires_at IS NULL OR lease_expires_at <= ?1)
             ORDER BY next_check_at LIMIT ?2"
        ))
        .bind(0_i64)
        .bind(10_i64)
        .fetch_all(store.pool())
        .await
        .unwrap();
        assert_plan_uses(&plan, "payment_attempts_unfinished_due");
    }

    /// `plan` is `EXPLAIN QUERY PLAN` output; one of its steps must name `index`.
    fn assert_plan_uses(plan: &[(i64, i64, i64, String)], index: &str) {
        let details: Vec<&str> = plan.iter().map(|(_, _, _, detail)| detail.as_str()).collect();
        assert!(details.iter().any(|detail| detail.contains(index)), "{index} unused: {details:?}");
    }

    #[tokio::test]
    async fn the_oldest_unfinished_probe_uses_its_partial_index() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(dir.path()).await;
        let plan: Vec<(i64, i64, i64, String)> = sqlx::query_as(&format!(
            "EXPLAIN QUERY PLAN
             SELECT min(created_at) FROM payment_attempts WHERE status IN {UNFINISHED_SQL}"
        ))
        .fetch_all(store.pool())
        .await
        .unwrap();
        assert_plan_uses(&plan, "payment_attempts_unfinished_created");
    }

    #[tokio::test]
    async fn the_schema_rejects_values_of_the_wrong_type() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_in(dir.path()).await;
        // STRICT: text in an instant column is an error, not a string that sorts after numbers.
        let error = sqlx::query(
            "INSERT INTO payment_attempts (id, consumer, operation_key, kind, amount_minor,
                currency, payment_method, fingerprint, status, provider, idempotency_key,
                key_window_started_at, next_check_at, created_at, updated_at)
             VALUES (?1, 'orders', 'op', 'charge', 100, 'usd', 'pm_card_visa', 'f', 'pending',
                     'stripe', 'k', 'yesterday', 0, 0, 0)",
        )
        .bind(Uuid::now_v7())
        .execute(store.pool())
        .await
        .unwrap_err();
        assert!(
            error.to_string().contains("key_window_started_at"),
            "{error}"
        );
    }
}
