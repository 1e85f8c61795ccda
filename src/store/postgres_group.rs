//! The batch statements of group commit on PostgreSQL (`group_commit.rs` decides who goes
//! together): `insert_pending` and `finish_round` of many callers, each as one statement and one
//! commit, each row answered exactly as its statement alone would answer it.

use async_trait::async_trait;
use sqlx::Row;
use sqlx::postgres::{PgPool, PgRow};
use uuid::Uuid;

use super::group_commit::{BatchError, BatchStatement, GroupCommitLimits, GroupCommitter};
use super::postgres::{finish_round_statement, insert_pending_statement, status_names};
use super::row::{attempt_from_row, encode_progress};
use super::{CallerTime, NewAttempt, RoundResult, StoreError, micros_of};
use crate::domain::{Attempt, CustomerId, Description, LeaseOwner};

/// The column each batch statement adds to a returned row: which request (1-based) it answers.
const ORDINAL: &str = "batch_ordinal";

/// One caller's answer: the row its statement returned, if any, or its own row's error.
pub(super) type RowAnswer = Result<Option<Attempt>, StoreError>;

/// The two committers of one store.
#[derive(Clone)]
pub(super) struct PostgresGroupCommit {
    pub insert: GroupCommitter<InsertBatch>,
    pub finish: GroupCommitter<FinishBatch>,
}

impl PostgresGroupCommit {
    pub fn spawn(pool: &PgPool, limits: GroupCommitLimits) -> Self {
        Self {
            insert: GroupCommitter::spawn(InsertBatch { pool: pool.clone() }, limits),
            finish: GroupCommitter::spawn(FinishBatch { pool: pool.clone() }, limits),
        }
    }
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
fn answers_by_ordinal(rows: &[PgRow], requests: usize) -> Result<Vec<RowAnswer>, BatchError> {
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

pub(super) struct InsertBatch {
    pool: PgPool,
}

#[async_trait]
impl BatchStatement for InsertBatch {
    type Request = NewAttempt;
    type Answer = RowAnswer;
    const NAME: &'static str = "insert";

    /// Attempts of one operation may share a batch: the second finds the row the first wrote
    /// (see `first_attempts` and `attempts_row_by_row`).
    fn key(_: &NewAttempt) -> Option<Uuid> {
        None
    }

    async fn run_batch(&self, requests: &[NewAttempt]) -> Result<Vec<RowAnswer>, BatchError> {
        let arrays = InsertArrays::of(requests)?;
        if requests.iter().all(|new| new.generation == 0) {
            first_attempts(&self.pool, requests, arrays).await
        } else {
            attempts_row_by_row(&self.pool, requests, arrays).await
        }
    }

    async fn run_one(&self, new: &NewAttempt) -> Result<RowAnswer, StoreError> {
        Ok(insert_pending_statement(&self.pool, new).await)
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
    fn of(requests: &[NewAttempt]) -> Result<Self, BatchError> {
        let mut metadata = Vec::with_capacity(requests.len());
        for new in requests {
            metadata.push(
                serde_json::to_value(new.params.metadata.entries())
                    .map_err(|error| BatchError::RowRejected(error.to_string()))?,
            );
        }
        let each = |value: fn(&NewAttempt) -> String| requests.iter().map(value).collect::<Vec<_>>();
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
/// rows it did not write (migration 20261205000001), each row answered as
/// `insert_pending_attempt` would answer it alone. A row comes back once however many requests
/// of its operation the batch holds; each request takes the row of its own operation.
async fn first_attempts(pool: &PgPool, requests: &[NewAttempt], arrays: InsertArrays) -> Result<Vec<RowAnswer>, BatchError> {
    let rows = arrays
        .bind_in_order(sqlx::query(
            "SELECT * FROM insert_pending_first_attempts(
                $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)",
        ))
        .fetch_all(pool)
        .await
        .map_err(batch_error)?;
    // Keyed by the operation as the rows hold it (borrowed from them): at most batch_max rows.
    let mut by_operation = std::collections::HashMap::with_capacity(rows.len());
    for row in &rows {
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

/// Any attempts, later ones included: one call of the function the single statement calls,
/// per row, in request order (the lateral call depends on each unnest row in turn; a volatile
/// function takes a new snapshot per query, so a call sees what earlier calls wrote).
async fn attempts_row_by_row(pool: &PgPool, requests: &[NewAttempt], arrays: InsertArrays) -> Result<Vec<RowAnswer>, BatchError> {
    let generation: Vec<i32> = requests.iter().map(|new| new.generation as i32).collect();
    let rows = arrays
        .bind_in_order(sqlx::query(
            "SELECT u.ord AS batch_ordinal, a.*
             FROM unnest($1::uuid[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::text[],
                         $7::text[], $8::text[], $9::jsonb[], $10::text[], $11::text[], $12::text[],
                         $13::timestamptz[], $14::bigint[], $15::uuid[], $16::bigint[], $17::bigint[],
                         $18::text[], $19::integer[])
                  WITH ORDINALITY AS u(id, consumer, operation_key, amount_minor, currency,
                         payment_method, customer, description, metadata, fingerprint, provider,
                         idempotency_key, process_now, shift_us, lease_owner, lease_us, grace_us,
                         return_url, generation, ord)
             CROSS JOIN LATERAL insert_pending_attempt(
                 u.id, u.consumer, u.operation_key, u.amount_minor, u.currency, u.payment_method,
                 u.customer, u.description, u.metadata, u.fingerprint, u.provider,
                 u.idempotency_key, u.generation, u.process_now, u.shift_us, u.lease_owner,
                 u.lease_us, u.grace_us, u.return_url) AS a",
        ))
        .bind(generation)
        .fetch_all(pool)
        .await
        .map_err(batch_error)?;
    answers_by_ordinal(&rows, requests.len())
}

/// One caller's `finish_round`.
#[derive(Debug, Clone)]
pub(super) struct FinishRequest {
    pub id: Uuid,
    pub owner: LeaseOwner,
    pub result: RoundResult,
    pub time: CallerTime,
}

pub(super) struct FinishBatch {
    pool: PgPool,
}

#[async_trait]
impl BatchStatement for FinishBatch {
    type Request = FinishRequest;
    type Answer = RowAnswer;
    const NAME: &'static str = "finish";

    /// An UPDATE … FROM changes a row once however many batch rows join it: two results for
    /// one attempt go in separate batches, the second judged against the first's write.
    fn key(request: &FinishRequest) -> Option<Uuid> {
        Some(request.id)
    }

    async fn run_batch(&self, requests: &[FinishRequest]) -> Result<Vec<RowAnswer>, BatchError> {
        let texts = |value: fn(&RoundResult) -> Option<String>| {
            requests.iter().map(|request| value(&request.result)).collect::<Vec<_>>()
        };
        // One call of finish_rounds (migration 20261206000001): the UPDATE … FROM unnest(…) of
        // every result, planned once per connection; each row comes back with its ordinal.
        let rows = sqlx::query(
            "SELECT f.batch_ordinal, (f.attempt).*
             FROM finish_rounds($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15,
                                $16, $17, $18, $19) AS f",
        )
        .bind(requests.iter().map(|request| request.id).collect::<Vec<_>>())
        .bind(requests.iter().map(|request| request.owner.as_uuid()).collect::<Vec<_>>())
        .bind(texts(|result| Some(result.status.as_str().to_owned())))
        .bind(texts(|result| Some(status_names(&result.status.allowed_sources()).join(","))))
        .bind(texts(|result| result.provider_payment_id.clone()))
        .bind(texts(|result| result.provider_status.clone()))
        .bind(texts(|result| result.failure.as_ref().map(|failure| failure.code.clone())))
        .bind(texts(|result| result.failure.as_ref().map(|failure| failure.message.clone())))
        .bind(texts(|result| result.next_action.as_ref().map(|action| action.kind.clone())))
        .bind(texts(|result| result.next_action.as_ref().and_then(|action| action.redirect_url.clone())))
        .bind(texts(|result| result.review_reason.clone()))
        .bind(requests.iter().map(|request| request.result.calls_made as i32).collect::<Vec<_>>())
        .bind(requests.iter().map(|request| micros_of(request.result.next_check_in)).collect::<Vec<_>>())
        .bind(texts(|result| result.last_error.clone()))
        .bind(requests.iter().map(|request| request.time.shift_micros()).collect::<Vec<_>>())
        .bind(requests.iter().map(|request| request.result.create_replays_failure).collect::<Vec<_>>())
        .bind(&super::postgres::UNFINISHED[..])
        .bind(requests.iter().map(|request| request.result.lookup_progress.is_some()).collect::<Vec<_>>())
        .bind(texts(|result| result.lookup_progress.as_ref().and_then(encode_progress)))
        .fetch_all(&self.pool)
        .await
        .map_err(batch_error)?;
        answers_by_ordinal(&rows, requests.len())
    }

    async fn run_one(&self, request: &FinishRequest) -> Result<RowAnswer, StoreError> {
        Ok(finish_round_statement(&self.pool, request).await)
    }
}

/// The limits of `[database.group_commit]`.
pub(super) fn limits_of(config: &crate::config::GroupCommitConfig) -> GroupCommitLimits {
    GroupCommitLimits {
        batch_max: config.batch_max,
        wait_max: std::time::Duration::from_micros(config.wait_max_us),
    }
}
