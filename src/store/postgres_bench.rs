//! Bulk seeding of `payment_attempts` for benchmarks (`chargeguard bench seed`): settled rows to
//! grow the table, and stuck rows (pending, due, unleased) for the sweep to find. Used only
//! against a benchmark database; the service never calls it.
//!
//! Seeded rows belong to the consumer [`SEED_CONSUMER`] and are numbered from 1: row n has the
//! operation key `n` (so pgbench can pick one with `random(1, rows)`), and ids and creation
//! times grow with n, so bulk inserts append to the indexes instead of splitting pages at random.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::StoreError;
use super::postgres::{PostgresStore, unavailable};

pub const SEED_CONSUMER: &str = "bench-seed";
/// Seeded ids are `00000000-0000-7000-8000-` followed by n in 12 hex digits.
const SEED_ID_BASE: u128 = 0x0000_0000_0000_7000_8000_0000_0000_0000;
const SEED_NUMBER_MASK: u128 = 0xffff_ffff_ffff;
/// Rows per INSERT statement: bounds each transaction's size while seeding millions.
pub const SEED_STATEMENT_ROWS_MAX: u64 = 500_000;
/// Seedings of at least this many rows rebuild the indexes instead of maintaining them.
pub const SEED_REBUILD_ROWS_MIN: u64 = 200_000;
/// Memory for sorting while the indexes are rebuilt (one transaction's setting).
const SEED_MAINTENANCE_WORK_MEM: &str = "512MB";
/// Settled row n was created n × this many seconds after a fixed instant: creation times grow
/// with the number across seedings (10M rows span about a month).
const SETTLED_SECONDS_PER_ROW: f64 = 0.25;

/// What one seeding asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeedKind {
    /// Succeeded (and every 50th failed) attempts, as years of traffic leave them.
    Settled,
    /// Pending attempts whose provider call was lost: due now, no lease, key window open.
    Stuck,
}

const INSERT_SEEDED: &str = "
    INSERT INTO payment_attempts (
        id, consumer, operation_key, kind, amount_minor, currency, payment_method, customer,
        description, metadata, fingerprint, status, provider, provider_payment_id,
        provider_status, idempotency_key, generation, failure_code, failure_message,
        provider_calls, key_window_started_at, lease_owner, lease_expires_at, check_count,
        next_check_at, created_at, updated_at)
    SELECT
        ('00000000-0000-7000-8000-' || lpad(to_hex(n), 12, '0'))::uuid,
        $1, n::text, 'charge', 1000 + n % 5000, 'usd', 'pm_card_visa',
        NULL, 'bench seed', jsonb_build_object('order_id', n::text),
        md5(n::text) || md5((n + 1)::text),
        CASE WHEN $4 THEN 'pending' WHEN n % 50 = 0 THEN 'failed' ELSE 'succeeded' END,
        'stripe',
        CASE WHEN $4 THEN NULL ELSE 'pi_seed' || n END,
        CASE WHEN $4 THEN NULL WHEN n % 50 = 0 THEN 'requires_payment_method' ELSE 'succeeded' END,
        'cgseed-' || n, 0,
        CASE WHEN NOT $4 AND n % 50 = 0 THEN 'card_declined' END,
        CASE WHEN NOT $4 AND n % 50 = 0 THEN 'Your card was declined.' END,
        1, at, NULL, NULL, CASE WHEN $4 THEN 0 ELSE 1 END,
        CASE WHEN $4 THEN $5 - interval '1 minute' ELSE at + interval '1 minute' END, at, at
    FROM generate_series($2::bigint, $3::bigint - 1) AS n,
         LATERAL (SELECT CASE WHEN $4 THEN $5 - interval '5 minutes'
                              ELSE timestamptz '2026-01-01 00:00:00+00'
                                   + make_interval(secs => n * $6::float8)
                         END AS at) AS t";

/// For each foreign key into or out of the table, index and unique constraint of the table: the
/// statement that drops it and the one that creates it again, read from the catalog so they
/// match the migrations exactly. In drop order — foreign keys (they depend on the primary key),
/// plain indexes, then primary and unique constraints; they are created again in reverse.
const INDEX_DDL: &str = "
    SELECT drop_statement, create_statement FROM (
        SELECT 0 AS phase, c.conname::text AS name,
               format('ALTER TABLE %s DROP CONSTRAINT %I', c.conrelid::regclass, c.conname) AS drop_statement,
               format('ALTER TABLE %s ADD CONSTRAINT %I %s', c.conrelid::regclass, c.conname,
                      pg_get_constraintdef(c.oid)) AS create_statement
        FROM pg_constraint c
        WHERE c.contype = 'f'
          AND 'payment_attempts'::regclass IN (c.conrelid, c.confrelid)
        UNION ALL
        SELECT 1, i.indexrelid::regclass::text,
               format('DROP INDEX %s', i.indexrelid::regclass),
               pg_get_indexdef(i.indexrelid)
        FROM pg_index i
        WHERE i.indrelid = 'payment_attempts'::regclass
          AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)
        UNION ALL
        SELECT 2, c.conname::text,
               format('ALTER TABLE payment_attempts DROP CONSTRAINT %I', c.conname),
               format('ALTER TABLE payment_attempts ADD CONSTRAINT %I %s', c.conname,
                      pg_get_constraintdef(c.oid))
        FROM pg_constraint c
        WHERE c.conrelid = 'payment_attempts'::regclass AND c.contype IN ('p', 'u')
    ) AS ddl
    ORDER BY phase, name";

impl PostgresStore {
    /// The next free seed number: one past the highest seeded so far. Seeded ids sort below
    /// every time-ordered id the service makes, so the primary key finds the highest at once.
    pub async fn next_seed_number(&self) -> Result<u64, StoreError> {
        let highest: Option<Uuid> = sqlx::query_scalar(
            "SELECT id FROM payment_attempts WHERE id <= $1 ORDER BY id DESC LIMIT 1",
        )
        .bind(Uuid::from_u128(SEED_ID_BASE | SEED_NUMBER_MASK))
        .fetch_optional(self.pool())
        .await
        .map_err(unavailable)?;
        Ok(highest.map_or(1, |id| (id.as_u128() & SEED_NUMBER_MASK) as u64 + 1))
    }

    /// Inserts `count` seeded rows numbered from `first`, in statements of at most
    /// [`SEED_STATEMENT_ROWS_MAX`] rows, in one transaction. From [`SEED_REBUILD_ROWS_MIN`] rows
    /// on, the table's indexes and unique constraints are dropped first and built again from
    /// their own definitions afterwards: building an index once is many times faster than
    /// maintaining it through millions of inserts, and leaves the same index. Returns the rows
    /// inserted.
    pub async fn seed_attempts(
        &self,
        kind: SeedKind,
        first: u64,
        count: u64,
        now: DateTime<Utc>,
    ) -> Result<u64, StoreError> {
        let stuck = kind == SeedKind::Stuck;
        let mut transaction = self.pool().begin().await.map_err(unavailable)?;
        let rebuild = if count >= SEED_REBUILD_ROWS_MIN {
            sqlx::raw_sql(&format!(
                "SET LOCAL maintenance_work_mem = '{SEED_MAINTENANCE_WORK_MEM}'"
            ))
            .execute(&mut *transaction)
            .await
            .map_err(unavailable)?;
            let ddl: Vec<(String, String)> = sqlx::query_as(INDEX_DDL)
                .fetch_all(&mut *transaction)
                .await
                .map_err(unavailable)?;
            for (drop, _) in &ddl {
                sqlx::raw_sql(drop)
                    .execute(&mut *transaction)
                    .await
                    .map_err(unavailable)?;
            }
            ddl
        } else {
            Vec::new()
        };
        let end = first + count;
        let mut start = first;
        let mut inserted = 0;
        while start < end {
            let stop = end.min(start + SEED_STATEMENT_ROWS_MAX);
            let done = sqlx::query(INSERT_SEEDED)
                .bind(SEED_CONSUMER)
                .bind(start as i64)
                .bind(stop as i64)
                .bind(stuck)
                .bind(now)
                .bind(SETTLED_SECONDS_PER_ROW)
                .execute(&mut *transaction)
                .await
                .map_err(unavailable)?;
            inserted += done.rows_affected();
            start = stop;
        }
        for (_, create) in rebuild.iter().rev() {
            sqlx::raw_sql(create)
                .execute(&mut *transaction)
                .await
                .map_err(unavailable)?;
        }
        transaction.commit().await.map_err(unavailable)?;
        Ok(inserted)
    }

    /// Ends every unfinished seeded row as failed, so the next timing starts from fresh stuck
    /// rows only (rows a timing leased would otherwise sit in the sweep's index).
    pub async fn settle_seeded_unfinished(&self, now: DateTime<Utc>) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "UPDATE payment_attempts
             SET status = 'failed', failure_code = 'bench_settled', lease_owner = NULL,
                 lease_expires_at = NULL, updated_at = $2
             WHERE consumer = $1 AND status IN ('pending', 'requires_action')",
        )
        .bind(SEED_CONSUMER)
        .bind(now)
        .execute(self.pool())
        .await
        .map_err(unavailable)?;
        Ok(done.rows_affected())
    }

    /// Unfinished rows due at `now` whose lease is free: what a sweep has left to do.
    pub async fn count_due(&self, now: DateTime<Utc>) -> Result<u64, StoreError> {
        let count: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM payment_attempts
             WHERE status IN ('pending', 'requires_action') AND next_check_at <= $1
               AND (lease_expires_at IS NULL OR lease_expires_at <= $1)",
        )
        .bind(now)
        .fetch_one(self.pool())
        .await
        .map_err(unavailable)?;
        Ok(count as u64)
    }

    /// Refreshes the planner's statistics after a bulk load.
    pub async fn analyze_attempts(&self) -> Result<(), StoreError> {
        sqlx::query("ANALYZE payment_attempts")
            .execute(self.pool())
            .await
            .map_err(unavailable)?;
        Ok(())
    }
}
