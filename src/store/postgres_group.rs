//! The batch statements of group commit on PostgreSQL (`group_commit.rs` decides who goes
//! together): the charge path's two writes of many callers — `insert_pending` before a provider
//! call, `finish_round` after it — as one statement and one commit, each row answered exactly as
//! its statement alone would answer it.
//!
//! One committer carries both kinds. With one committer per kind a charge paid two small
//! batches, each its own commit; one statement holding the arriving callers' inserts and the
//! returning callers' finishes halves the commits and round trips per charge (BENCHMARKS.md,
//! "Group commit", fifth round).

use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sqlx::Row;
use sqlx::Postgres;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgPool, PgRow};
use uuid::Uuid;

use super::group_commit::{BatchError, BatchStatement, GroupCommitLimits, GroupCommitter};
use super::postgres::{PING_IF_IDLE_FOR, finish_round_statement, insert_pending_statement, status_names, unavailable};
use super::row::{attempt_from_row, encode_progress};
use super::{CallerTime, NewAttempt, RoundResult, StoreError, micros_of};
use crate::domain::{Attempt, CustomerId, Description, LeaseOwner};

/// The column each batch statement adds to a returned row: which request (1-based) it answers.
const ORDINAL: &str = "batch_ordinal";

/// One caller's answer: the row its statement returned, if any, or its own row's error.
pub(super) type RowAnswer = Result<Option<Attempt>, StoreError>;

/// The committer of one store's charge-path writes.
pub(super) type PostgresGroupCommit = GroupCommitter<ChargeWrites>;

pub(super) fn spawn(pool: &PgPool, limits: GroupCommitLimits, kept: KeptConnection) -> PostgresGroupCommit {
    GroupCommitter::spawn(ChargeWrites { pool: pool.clone(), kept }, limits)
}

/// One caller's write on the charge path.
#[derive(Debug)]
pub(super) enum ChargeWrite {
    /// `insert_pending`: the pending row, committed before any provider call.
    Insert(NewAttempt),
    /// `finish_round`: a round's result, guarded by the lease.
    Finish(FinishRequest),
}

pub(super) struct ChargeWrites {
    pool: PgPool,
    kept: KeptConnection,
}

/// The connection of the committer's last statement that succeeded, kept out of the pool for
/// the next statement. sqlx's pool hands out its oldest idle connection, so consecutive batches
/// rotated through every connection it held, each backend cold by its turn; kept, they run on
/// one warm backend (BENCHMARKS.md, "Group commit", tenth round). Shared with the store, which
/// gives it back before it closes the pool: closing waits for every connection out of the pool.
#[derive(Clone, Default)]
pub(super) struct KeptConnection(Arc<Mutex<Option<Kept>>>);

/// A connection goes back to the pool at least this often, however busy the committer, so that
/// the pool's own rules (its connections' lifetime) still reach it.
const KEPT_FOR_MAX: Duration = Duration::from_secs(60);

/// A kept connection.
struct Kept {
    connection: PoolConnection<Postgres>,
    /// When it came out of the pool.
    since: Instant,
    /// When its last statement succeeded.
    used: Instant,
}

impl KeptConnection {
    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Kept>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The kept connection if it was used within `PING_IF_IDLE_FOR` and came out of the pool
    /// within `KEPT_FOR_MAX`; else one from the pool, which pings a connection idle that long
    /// before handing it out (one that sat longer goes back to the pool first). With when it
    /// came out of the pool.
    async fn take_or_acquire(&self, pool: &PgPool) -> Result<(PoolConnection<Postgres>, Instant), sqlx::Error> {
        let kept = self.slot().take();
        match kept {
            Some(kept) if kept.used.elapsed() < PING_IF_IDLE_FOR && kept.since.elapsed() < KEPT_FOR_MAX => {
                Ok((kept.connection, kept.since))
            }
            _ => Ok((pool.acquire().await?, Instant::now())),
        }
    }

    /// Keeps `connection` (only after a statement that succeeded: one that failed goes back to
    /// the pool), replacing any kept already (with more than one batch in flight), unless the
    /// pool is closing or holds a single connection, which the rest of the service would then
    /// wait for. Checked under the slot's lock, so a connection is never kept after `release`.
    fn keep(&self, pool: &PgPool, connection: PoolConnection<Postgres>, since: Instant) {
        let mut slot = self.slot();
        if !pool.is_closed() && pool.options().get_max_connections() > 1 {
            *slot = Some(Kept { connection, since, used: Instant::now() });
        }
    }

    /// Gives the kept connection back; call after the pool was marked closed.
    pub(super) fn release(&self) {
        self.slot().take();
    }
}

#[async_trait]
impl BatchStatement for ChargeWrites {
    type Request = ChargeWrite;
    type Answer = RowAnswer;

    fn kind(request: &ChargeWrite) -> &'static str {
        match request {
            ChargeWrite::Insert(_) => "insert",
            ChargeWrite::Finish(_) => "finish",
        }
    }

    /// A finish names its attempt, an insert its operation: two batches in flight never touch
    /// one row, so they never wait on each other's locks, and a later write of a row sees the
    /// earlier one committed.
    fn key(request: &ChargeWrite) -> Option<u64> {
        match request {
            ChargeWrite::Insert(new) => {
                let mut hasher = std::hash::DefaultHasher::new();
                (new.consumer.as_str(), new.operation_key.as_str()).hash(&mut hasher);
                Some(hasher.finish())
            }
            ChargeWrite::Finish(finish) => {
                let (high, low) = finish.id.as_u64_pair();
                Some(high ^ low)
            }
        }
    }

    /// An UPDATE … FROM changes a row once however many batch rows join it: two results for
    /// one attempt go in separate batches, the second judged against the first's write.
    /// Attempts of one operation may share a batch: the second finds the row the first wrote
    /// (see `first_attempts` and `attempts_row_by_row`). An insert and a finish of one
    /// operation in one batch are two concurrent calls, and the insert's answer is the row as
    /// one of them left it, as it would be with the two statements racing alone.
    fn key_shares_batch(request: &ChargeWrite) -> bool {
        matches!(request, ChargeWrite::Insert(_))
    }

    async fn run_batch(&self, requests: &[ChargeWrite]) -> Result<Vec<RowAnswer>, BatchError> {
        let mut inserts = Vec::with_capacity(requests.len());
        let mut finishes = Vec::with_capacity(requests.len());
        for request in requests {
            match request {
                ChargeWrite::Insert(new) => inserts.push(new),
                ChargeWrite::Finish(finish) => finishes.push(finish),
            }
        }
        let (mut connection, since) = self.kept.take_or_acquire(&self.pool).await.map_err(batch_error)?;
        let (inserted, finished) = if finishes.is_empty() {
            (insert_batch(&mut *connection, &inserts).await?, Vec::new())
        } else if inserts.is_empty() {
            (Vec::new(), finish_batch(&mut *connection, &finishes).await?)
        } else if inserts.iter().all(|new| new.generation == 0) {
            first_attempts_and_finishes(&mut connection, &inserts, &finishes).await?
        } else {
            // Later attempts are rare: their row-by-row insert and the finishes go as two
            // statements of one transaction, so that the batch still commits as a whole.
            let mut transaction = sqlx::Connection::begin(&mut *connection).await.map_err(batch_error)?;
            let finished = finish_batch(&mut *transaction, &finishes).await?;
            let inserted = insert_batch(&mut *transaction, &inserts).await?;
            transaction.commit().await.map_err(batch_error)?;
            (inserted, finished)
        };
        self.kept.keep(&self.pool, connection, since);
        in_request_order(requests, inserted, finished)
    }

    async fn run_one(&self, request: &ChargeWrite) -> Result<RowAnswer, StoreError> {
        let (mut connection, since) = self.kept.take_or_acquire(&self.pool).await.map_err(unavailable)?;
        let answer = match request {
            ChargeWrite::Insert(new) => insert_pending_statement(&mut *connection, new).await,
            ChargeWrite::Finish(finish) => finish_round_statement(&mut *connection, finish).await,
        };
        if answer.is_ok() {
            self.kept.keep(&self.pool, connection, since);
        }
        Ok(answer)
    }
}

/// Puts the inserts' and the finishes' answers (each in the order of its kind) back in the
/// order of the batch's requests.
fn in_request_order(
    requests: &[ChargeWrite],
    inserted: Vec<RowAnswer>,
    finished: Vec<RowAnswer>,
) -> Result<Vec<RowAnswer>, BatchError> {
    let mut inserted = inserted.into_iter();
    let mut finished = finished.into_iter();
    let answers: Vec<RowAnswer> = requests
        .iter()
        .map_while(|request| match request {
            ChargeWrite::Insert(_) => inserted.next(),
            ChargeWrite::Finish(_) => finished.next(),
        })
        .collect();
    if answers.len() != requests.len() || inserted.next().is_some() || finished.next().is_some() {
        return Err(BatchError::Unavailable(format!("a batch of {} rows came back mismatched", requests.len())));
    }
    Ok(answers)
}

/// What a failed batch statement means for its callers. Nothing of it committed either way; a
/// row's data (a constraint, a raised error) is the row's own failure, anything else (timeout
/// `57014`, a terminated backend, a lost connection, a deadlock, the pool) the batch's.
fn batch_error(error: sqlx::Error) -> BatchError {
    let message = error.to_string();
    let Some(database_error) = error.as_database_error() else {
        return BatchError::Unavailable(message);
    };
    let class = database_error.code().map(|code| code.chars().take(2).collect::<String>()).unwrap_or_default();
    match class.as_str() {
        // integrity, data, a function's RAISE: the data of some row.
        "22" | "23" | "P0" => BatchError::RowRejected(message),
        _ => BatchError::Unavailable(message),
    }
}

/// Puts each returned row where its request is; a request whose statement returned nothing
/// gets `None`, as the single statement's `fetch_optional` would.
fn answers_by_ordinal<'r>(rows: impl Iterator<Item = &'r PgRow>, requests: usize) -> Result<Vec<RowAnswer>, BatchError> {
    let mut answers: Vec<RowAnswer> = (0..requests).map(|_| Ok(None)).collect();
    for row in rows {
        let ordinal: i64 = row.try_get(ORDINAL).map_err(|error| BatchError::Unavailable(error.to_string()))?;
        let slot = usize::try_from(ordinal - 1)
            .ok()
            .and_then(|index| answers.get_mut(index))
            .ok_or_else(|| BatchError::Unavailable(format!("a batch row answers request {ordinal} of {requests}")))?;
        // Each statement returns at most one row per request (one attempt, or one row updated).
        if !matches!(slot, Ok(None)) {
            return Err(BatchError::Unavailable(format!("two rows answer request {ordinal}")));
        }
        *slot = attempt_from_row(row).map(Some);
    }
    Ok(answers)
}

/// A batch of inserts alone: first attempts set-based, else row by row.
async fn insert_batch<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    requests: &[&NewAttempt],
) -> Result<Vec<RowAnswer>, BatchError> {
    let arrays = InsertArrays::of(requests)?;
    if requests.iter().all(|new| new.generation == 0) {
        first_attempts(executor, requests, arrays).await
    } else {
        attempts_row_by_row(executor, requests, arrays).await
    }
}

/// The columns of a batch of `NewAttempt`s but its generation, one array each, in request order.
struct InsertArrays {
    id: Vec<Uuid>,
    consumer: Vec<String>,
    operation_key: Vec<String>,
    amount_minor: Vec<i64>,
    currency: Vec<String>,
    payment_method: Vec<String>,
    customer: Vec<Option<String>>,
    description: Vec<Option<String>>,
    metadata: Vec<serde_json::Value>,
    fingerprint: Vec<String>,
    provider: Vec<&'static str>,
    idempotency_key: Vec<String>,
    process_now: Vec<chrono::DateTime<chrono::Utc>>,
    shift_us: Vec<i64>,
    lease_owner: Vec<Uuid>,
    lease_us: Vec<i64>,
    grace_us: Vec<i64>,
    return_url: Vec<Option<String>>,
}

impl InsertArrays {
    fn of(requests: &[&NewAttempt]) -> Result<Self, BatchError> {
        let mut metadata = Vec::with_capacity(requests.len());
        for new in requests {
            metadata.push(
                serde_json::to_value(new.params.metadata.entries())
                    .map_err(|error| BatchError::RowRejected(error.to_string()))?,
            );
        }
        let each = |value: fn(&NewAttempt) -> String| requests.iter().map(|new| value(new)).collect::<Vec<_>>();
        Ok(Self {
            id: requests.iter().map(|new| new.id.as_uuid()).collect(),
            consumer: each(|new| new.consumer.as_str().to_owned()),
            operation_key: each(|new| new.operation_key.as_str().to_owned()),
            amount_minor: requests.iter().map(|new| new.params.amount_minor).collect(),
            currency: each(|new| new.params.currency.code().to_owned()),
            payment_method: each(|new| new.params.payment_method.as_str().to_owned()),
            customer: requests
                .iter()
                .map(|new| new.params.customer.as_ref().map(|customer| CustomerId::as_str(customer).to_owned()))
                .collect(),
            description: requests
                .iter()
                .map(|new| new.params.description.as_ref().map(|text| Description::as_str(text).to_owned()))
                .collect(),
            metadata,
            fingerprint: each(|new| new.fingerprint.as_str().to_owned()),
            provider: requests.iter().map(|new| new.provider).collect(),
            idempotency_key: each(|new| new.idempotency_key.as_str().to_owned()),
            process_now: requests.iter().map(|new| new.time.now).collect(),
            shift_us: requests.iter().map(|new| new.time.shift_micros()).collect(),
            lease_owner: requests.iter().map(|new| new.lease_owner.as_uuid()).collect(),
            lease_us: requests.iter().map(|new| micros_of(new.lease_duration)).collect(),
            grace_us: requests.iter().map(|new| micros_of(new.recovery_grace)).collect(),
            return_url: requests.iter().map(|new| new.return_url.clone()).collect(),
        })
    }

    /// Binds the arrays as $1 … $18, in the order of the fields above.
    fn bind_in_order<'q>(self, query: PgQuery<'q>) -> PgQuery<'q> {
        query
            .bind(self.id)
            .bind(self.consumer)
            .bind(self.operation_key)
            .bind(self.amount_minor)
            .bind(self.currency)
            .bind(self.payment_method)
            .bind(self.customer)
            .bind(self.description)
            .bind(self.metadata)
            .bind(self.fingerprint)
            .bind(self.provider)
            .bind(self.idempotency_key)
            .bind(self.process_now)
            .bind(self.shift_us)
            .bind(self.lease_owner)
            .bind(self.lease_us)
            .bind(self.grace_us)
            .bind(self.return_url)
    }
}

type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

/// First attempts (generation 0) of many operations: one set-based INSERT and one read of the
/// rows it did not write (migration 20261205000001; written in key order, so that two replicas'
/// batches never deadlock, since 20261206000003), each row answered as
/// `insert_pending_attempt` would answer it alone. A row comes back once however many requests
/// of its operation the batch holds; each request takes the row of its own operation.
async fn first_attempts<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    requests: &[&NewAttempt],
    arrays: InsertArrays,
) -> Result<Vec<RowAnswer>, BatchError> {
    let rows = arrays
        .bind_in_order(sqlx::query(
            "SELECT * FROM insert_pending_first_attempts(
                $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)",
        ))
        .fetch_all(executor)
        .await
        .map_err(batch_error)?;
    answers_by_operation(rows.iter(), requests)
}

/// Each first attempt's answer: the row of its own operation among `rows` (the function returns
/// an operation's row once however many requests of it the batch holds), or none.
fn answers_by_operation<'r>(
    rows: impl Iterator<Item = &'r PgRow>,
    requests: &[&NewAttempt],
) -> Result<Vec<RowAnswer>, BatchError> {
    // Keyed by the operation as the rows hold it (borrowed from them): at most batch_max rows.
    let mut by_operation = std::collections::HashMap::with_capacity(requests.len());
    for row in rows {
        let operation: (&str, &str) = (
            row.try_get("consumer").map_err(|error| BatchError::Unavailable(error.to_string()))?,
            row.try_get("operation_key").map_err(|error| BatchError::Unavailable(error.to_string()))?,
        );
        if by_operation.insert(operation, attempt_from_row(row)).is_some() {
            return Err(BatchError::Unavailable("two first attempts of one operation came back".to_owned()));
        }
    }
    Ok(requests
        .iter()
        .map(|new| match by_operation.get(&(new.consumer.as_str(), new.operation_key.as_str())) {
            None => Ok(None),
            Some(Ok(attempt)) => Ok(Some(attempt.clone())),
            // A row that does not decode fails the requests of its operation only.
            Some(Err(error)) => Err(StoreError::Corrupt(error.to_string())),
        })
        .collect())
}

/// Any attempts, later ones included: one call of `insert_pending_attempts` (migration
/// 20261206000003), which calls the single statement's function once per row, in the batch's
/// key order; each row comes back with its request's ordinal.
async fn attempts_row_by_row<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    requests: &[&NewAttempt],
    arrays: InsertArrays,
) -> Result<Vec<RowAnswer>, BatchError> {
    let generation: Vec<i32> = requests.iter().map(|new| new.generation as i32).collect();
    let rows = arrays
        .bind_in_order(sqlx::query(
            "SELECT a.batch_ordinal, (a.attempt).*
             FROM insert_pending_attempts(
                 $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19) AS a",
        ))
        .bind(generation)
        .fetch_all(executor)
        .await
        .map_err(batch_error)?;
    answers_by_ordinal(rows.iter(), requests.len())
}

/// One caller's `finish_round`.
#[derive(Debug, Clone)]
pub(super) struct FinishRequest {
    pub id: Uuid,
    pub owner: LeaseOwner,
    pub result: RoundResult,
    pub time: CallerTime,
}

/// The finishes of a batch alone: one call of finish_rounds (migration 20261206000001), the
/// UPDATE … FROM unnest(…) of every result, planned once per connection; each row comes back
/// with its ordinal.
const FINISHES: &str = "SELECT f.batch_ordinal, (f.attempt).*
     FROM finish_rounds($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
                        $17, $18, $19) AS f";

/// First attempts and finishes as one statement (one round trip, one commit): the two
/// functions run as two parts of it, and their rows come back together, a finish's with its
/// ordinal among the finishes, an insert's with none. Both parts are read whole by the
/// UNION ALL, so both run whole.
const FIRST_ATTEMPTS_AND_FINISHES: &str = "WITH inserted AS (
         SELECT * FROM insert_pending_first_attempts(
             $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)),
     finished AS (
         SELECT f.batch_ordinal, (f.attempt).*
         FROM finish_rounds($19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30, $31,
                            $32, $33, $34, $35, $36, $37) AS f)
     SELECT NULL::bigint AS batch_ordinal, inserted.* FROM inserted
     UNION ALL
     SELECT * FROM finished";

/// A batch of finishes alone.
async fn finish_batch<'e>(
    executor: impl sqlx::PgExecutor<'e>,
    requests: &[&FinishRequest],
) -> Result<Vec<RowAnswer>, BatchError> {
    let rows = FinishArrays::of(requests)
        .bind_in_order(sqlx::query(FINISHES))
        .fetch_all(executor)
        .await
        .map_err(batch_error)?;
    answers_by_ordinal(rows.iter(), requests.len())
}

/// First attempts and finishes of one batch in one statement; the inserts' answers and the
/// finishes' answers, each in its own order.
async fn first_attempts_and_finishes(
    connection: &mut sqlx::PgConnection,
    inserts: &[&NewAttempt],
    finishes: &[&FinishRequest],
) -> Result<(Vec<RowAnswer>, Vec<RowAnswer>), BatchError> {
    let query = InsertArrays::of(inserts)?.bind_in_order(sqlx::query(FIRST_ATTEMPTS_AND_FINISHES));
    let rows = FinishArrays::of(finishes)
        .bind_in_order(query)
        .fetch_all(connection)
        .await
        .map_err(batch_error)?;
    let mut inserted_rows = Vec::with_capacity(inserts.len());
    let mut finished_rows = Vec::with_capacity(finishes.len());
    for row in &rows {
        let ordinal: Option<i64> = row.try_get(ORDINAL).map_err(|error| BatchError::Unavailable(error.to_string()))?;
        if ordinal.is_some() {
            finished_rows.push(row);
        } else {
            inserted_rows.push(row);
        }
    }
    Ok((
        answers_by_operation(inserted_rows.into_iter(), inserts)?,
        answers_by_ordinal(finished_rows.into_iter(), finishes.len())?,
    ))
}

/// The arguments of `finish_rounds` for a batch of `FinishRequest`s, one array each, in
/// request order.
struct FinishArrays {
    id: Vec<Uuid>,
    owner: Vec<Uuid>,
    status: Vec<&'static str>,
    sources: Vec<String>,
    payment_id: Vec<Option<String>>,
    provider_status: Vec<Option<String>>,
    failure_code: Vec<Option<String>>,
    failure_message: Vec<Option<String>>,
    action_type: Vec<Option<String>>,
    action_url: Vec<Option<String>>,
    review_reason: Vec<Option<String>>,
    calls: Vec<i32>,
    next_check_us: Vec<i64>,
    last_error: Vec<Option<String>>,
    shift_us: Vec<i64>,
    replays_failure: Vec<bool>,
    has_lookup: Vec<bool>,
    lookup_cursor: Vec<Option<String>>,
}

impl FinishArrays {
    fn of(requests: &[&FinishRequest]) -> Self {
        let texts = |value: fn(&RoundResult) -> Option<String>| {
            requests.iter().map(|request| value(&request.result)).collect::<Vec<_>>()
        };
        Self {
            id: requests.iter().map(|request| request.id).collect(),
            owner: requests.iter().map(|request| request.owner.as_uuid()).collect(),
            status: requests.iter().map(|request| request.result.status.as_str()).collect(),
            sources: requests
                .iter()
                .map(|request| status_names(&request.result.status.allowed_sources()).join(","))
                .collect(),
            payment_id: texts(|result| result.provider_payment_id.clone()),
            provider_status: texts(|result| result.provider_status.clone()),
            failure_code: texts(|result| result.failure.as_ref().map(|failure| failure.code.clone())),
            failure_message: texts(|result| result.failure.as_ref().map(|failure| failure.message.clone())),
            action_type: texts(|result| result.next_action.as_ref().map(|action| action.kind.clone())),
            action_url: texts(|result| result.next_action.as_ref().and_then(|action| action.redirect_url.clone())),
            review_reason: texts(|result| result.review_reason.clone()),
            calls: requests.iter().map(|request| request.result.calls_made as i32).collect(),
            next_check_us: requests.iter().map(|request| micros_of(request.result.next_check_in)).collect(),
            last_error: texts(|result| result.last_error.clone()),
            shift_us: requests.iter().map(|request| request.time.shift_micros()).collect(),
            replays_failure: requests.iter().map(|request| request.result.create_replays_failure).collect(),
            has_lookup: requests.iter().map(|request| request.result.lookup_progress.is_some()).collect(),
            lookup_cursor: texts(|result| result.lookup_progress.as_ref().and_then(encode_progress)),
        }
    }

    /// Binds `finish_rounds`' 19 arguments after whatever `query` bound already (the 17th, the
    /// statuses a result may still change, is the same for every row).
    fn bind_in_order<'q>(self, query: PgQuery<'q>) -> PgQuery<'q> {
        query
            .bind(self.id)
            .bind(self.owner)
            .bind(self.status)
            .bind(self.sources)
            .bind(self.payment_id)
            .bind(self.provider_status)
            .bind(self.failure_code)
            .bind(self.failure_message)
            .bind(self.action_type)
            .bind(self.action_url)
            .bind(self.review_reason)
            .bind(self.calls)
            .bind(self.next_check_us)
            .bind(self.last_error)
            .bind(self.shift_us)
            .bind(self.replays_failure)
            .bind(&super::postgres::UNFINISHED[..])
            .bind(self.has_lookup)
            .bind(self.lookup_cursor)
    }
}

/// The limits of `[database.group_commit]`.
pub(super) fn limits_of(config: &crate::config::GroupCommitConfig) -> GroupCommitLimits {
    GroupCommitLimits {
        batch_max: config.batch_max,
        wait_max: std::time::Duration::from_micros(config.wait_max_us),
        in_flight_max: config.in_flight_max,
    }
}
