//! One delivery, whichever broker brought it: parse, look up, charge, record. The broker
//! modules only carry out the returned [`Fate`].

use std::time::Duration;

use chargeguard_client::{Backoff, Client};

use crate::decision::{self, Disposition};
use crate::event::OrderPlaced;
use crate::ledger::Ledger;

/// What the broker must do with the delivery. Everything the consumer's table needs is already
/// committed when this is returned.
#[derive(Debug, Clone, PartialEq)]
pub enum Fate {
    Ack,
    /// Deliver it again after `after` (the delivery's retry count goes up by one).
    Retry { after: Duration },
    /// To the dead-letter queue, for a person; never delivered to this consumer again.
    DeadLetter { reason: String },
}

#[derive(Clone)]
pub struct Handler {
    client: Client,
    ledger: Ledger,
    backoff: Backoff,
}

impl Handler {
    pub fn new(client: Client, ledger: Ledger, backoff: Backoff) -> Self {
        Self { client, ledger, backoff }
    }

    /// `retries`: how often this message was already retried (0 on its first delivery).
    pub async fn handle(&self, body: &[u8], retries: u32, redelivered: bool) -> Fate {
        let event = match OrderPlaced::parse(body) {
            Ok(event) => event,
            Err(error) => {
                tracing::warn!(%error, "not an order-placed event: dead-lettered");
                return Fate::DeadLetter { reason: error.to_string() };
            }
        };
        if redelivered {
            let _ = self.ledger.count("broker_redelivered").await;
        }
        match self.ledger.note_delivery(&event.order_id).await {
            Ok(Some(status)) => {
                tracing::debug!(order_id = %event.order_id, status = status.as_str(), "already decided: acked");
                let _ = self.ledger.count("already_decided").await;
                return Fate::Ack;
            }
            Ok(None) => {}
            Err(error) => return self.database_unavailable(&event, &error, retries),
        }
        let answer = self.client.charge(event.charge_request()).await;
        let disposition = decision::decide(answer, retries, &self.backoff, &mut rand::thread_rng());
        match disposition {
            Disposition::Record(decided) => match self.ledger.record(&event, &decided).await {
                Ok(()) => {
                    tracing::info!(order_id = %event.order_id, status = decided.status.as_str(), outcome = decided.outcome, "order decided");
                    Fate::Ack
                }
                Err(error) => self.database_unavailable(&event, &error, retries),
            },
            Disposition::Retry { after, class } => {
                tracing::info!(order_id = %event.order_id, %class, after_ms = after.as_millis() as u64, "retry later");
                let _ = self.ledger.count(&format!("retry.{class}")).await;
                Fate::Retry { after }
            }
            Disposition::DeadLetter { code, message } => match self.ledger.record_rejected(&event, &code, &message).await {
                Ok(()) => {
                    tracing::warn!(order_id = %event.order_id, %code, %message, "refused: dead-lettered");
                    Fate::DeadLetter { reason: format!("{code}: {message}") }
                }
                Err(error) => self.database_unavailable(&event, &error, retries),
            },
        }
    }

    /// The consumer's own database is down: nothing was recorded, so the delivery must come
    /// back; chargeguard answers the repeated charge with the stored outcome.
    fn database_unavailable(&self, event: &OrderPlaced, error: &crate::ledger::LedgerError, retries: u32) -> Fate {
        tracing::warn!(order_id = %event.order_id, %error, "consumer database unavailable: retry later");
        Fate::Retry { after: self.backoff.delay(retries, &mut rand::thread_rng()) }
    }
}
