//! The consumer's own table: each order's payment state, written before the broker is told,
//! in one transaction with the figures of the delivery that decided it.

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use crate::decision::{Decided, OrderStatus};
use crate::event::OrderPlaced;

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS order_payments (
    order_id            text PRIMARY KEY,
    operation_key       text NOT NULL,
    status              text NOT NULL CHECK (status IN ('paid', 'declined', 'requires_action', 'rejected')),
    attempt_id          text,
    provider_payment_id text,
    outcome             text,
    failure_code        text,
    reason              text,
    amount_minor        bigint NOT NULL,
    currency            text NOT NULL,
    placed_at           timestamptz NOT NULL,
    decided_at          timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS order_deliveries (
    order_id   text PRIMARY KEY,
    deliveries bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS consumer_counters (
    name  text PRIMARY KEY,
    value bigint NOT NULL
);
"#;

#[derive(Debug, thiserror::Error)]
#[error("the consumer's database: {0}")]
pub struct LedgerError(#[from] sqlx::Error);

#[derive(Clone)]
pub struct Ledger {
    pool: PgPool,
}

impl Ledger {
    /// Connects lazily (a database that is down at start is retried per delivery) and creates
    /// the tables when it first can.
    pub fn connect_lazy(url: &str, connections_max: u32) -> Result<Self, LedgerError> {
        let options: PgConnectOptions = url.parse()?;
        let pool = PgPoolOptions::new()
            .max_connections(connections_max)
            .acquire_timeout(Duration::from_secs(5))
            .connect_lazy_with(options);
        Ok(Self { pool })
    }

    pub async fn create_tables(&self) -> Result<(), LedgerError> {
        sqlx::raw_sql(SCHEMA).execute(&self.pool).await?;
        Ok(())
    }

    /// Counts a delivery of the order's event, and says whether the order is already decided
    /// (a redelivery, or the event published twice): then it is acked without a call.
    pub async fn note_delivery(&self, order_id: &str) -> Result<Option<OrderStatus>, LedgerError> {
        let mut transaction = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO order_deliveries (order_id, deliveries) VALUES ($1, 1)
             ON CONFLICT (order_id) DO UPDATE SET deliveries = order_deliveries.deliveries + 1",
        )
        .bind(order_id)
        .execute(&mut *transaction)
        .await?;
        let status: Option<String> = sqlx::query_scalar("SELECT status FROM order_payments WHERE order_id = $1")
            .bind(order_id)
            .fetch_optional(&mut *transaction)
            .await?;
        transaction.commit().await?;
        Ok(status.as_deref().and_then(parse_status).filter(|status| *status != OrderStatus::RequiresAction))
    }

    /// Records chargeguard's decision. The first decision stays (chargeguard answers every later
    /// call with the same one); only a `requires_action` row moves on.
    pub async fn record(&self, event: &OrderPlaced, decided: &Decided) -> Result<(), LedgerError> {
        sqlx::query(
            "INSERT INTO order_payments (order_id, operation_key, status, attempt_id, provider_payment_id,
                 outcome, failure_code, amount_minor, currency, placed_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, to_timestamp($10::float8 / 1000))
             ON CONFLICT (order_id) DO UPDATE SET status = EXCLUDED.status, attempt_id = EXCLUDED.attempt_id,
                 provider_payment_id = EXCLUDED.provider_payment_id, outcome = EXCLUDED.outcome,
                 failure_code = EXCLUDED.failure_code, decided_at = now()
             WHERE order_payments.status = 'requires_action'",
        )
        .bind(&event.order_id)
        .bind(event.operation_key())
        .bind(decided.status.as_str())
        .bind(&decided.attempt_id)
        .bind(&decided.provider_payment_id)
        .bind(decided.outcome)
        .bind(&decided.failure_code)
        .bind(event.amount_minor)
        .bind(&event.currency)
        .bind(event.placed_at_ms as f64)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Records a refusal before the message is dead-lettered, so the order's fate is in the
    /// table as well as in the dead-letter queue.
    pub async fn record_rejected(&self, event: &OrderPlaced, code: &str, message: &str) -> Result<(), LedgerError> {
        let reason: String = format!("{code}: {message}").chars().take(500).collect();
        sqlx::query(
            "INSERT INTO order_payments (order_id, operation_key, status, reason, amount_minor, currency, placed_at)
             VALUES ($1, $2, 'rejected', $3, $4, $5, to_timestamp($6::float8 / 1000))
             ON CONFLICT (order_id) DO NOTHING",
        )
        .bind(&event.order_id)
        .bind(event.operation_key())
        .bind(reason)
        .bind(event.amount_minor)
        .bind(&event.currency)
        .bind(event.placed_at_ms as f64)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Adds one to a figure (retries by class, broker redeliveries). Figures only: one lost to
    /// a crash changes nothing.
    pub async fn count(&self, name: &str) -> Result<(), LedgerError> {
        sqlx::query(
            "INSERT INTO consumer_counters (name, value) VALUES ($1, 1)
             ON CONFLICT (name) DO UPDATE SET value = consumer_counters.value + 1",
        )
        .bind(name)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }
}

fn parse_status(status: &str) -> Option<OrderStatus> {
    [OrderStatus::Paid, OrderStatus::Declined, OrderStatus::RequiresAction, OrderStatus::Rejected]
        .into_iter()
        .find(|known| known.as_str() == status)
}
