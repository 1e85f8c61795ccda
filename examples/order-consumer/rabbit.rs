//! RabbitMQ: manual acks, a prefetch bound, delayed retries through TTL queues, and a
//! dead-letter queue. A lost connection is reopened; what was delivered and not acked comes
//! back from the broker, and the consumer's table makes that harmless.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    BasicRejectOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::publisher_confirm::Confirmation;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::event::OrderPlaced;
use crate::handler::{Fate, Handler};
use crate::produce::body_placed_now;

/// Delayed retries wait in one of these queues (a message expires only at a queue's head, so
/// each queue holds one delay): the smallest at least as long as asked, else the longest.
pub const RETRY_DELAYS: [Duration; 5] = [
    Duration::from_millis(200),
    Duration::from_secs(1),
    Duration::from_secs(5),
    Duration::from_secs(30),
    Duration::from_secs(120),
];

const RETRIES_HEADER: &str = "chargeguard-retries";
/// A connection that lasted this long counts as healthy: its loss is a first failure.
const CONNECTION_HEALTHY_AFTER: Duration = Duration::from_secs(10);
/// Waits between reconnections, doubling up to the last.
const RECONNECT_DELAYS_MS: [u64; 6] = [100, 250, 500, 1_000, 2_000, 5_000];

#[derive(Debug, Clone)]
pub struct Topology {
    pub queue: String,
}

impl Topology {
    pub fn dead_letter_queue(&self) -> String {
        format!("{}.dead", self.queue)
    }

    pub fn retry_queue(&self, delay: Duration) -> String {
        format!("{}.retry.{}ms", self.queue, delay.as_millis())
    }

    /// Declares every queue (idempotent): the work queue dead-letters into `<queue>.dead`, and
    /// each retry queue dead-letters expired messages back into the work queue.
    pub async fn declare(&self, channel: &Channel) -> lapin::Result<()> {
        let durable = QueueDeclareOptions { durable: true, ..QueueDeclareOptions::default() };
        channel.queue_declare(&self.dead_letter_queue(), durable, FieldTable::default()).await?;
        let mut work = FieldTable::default();
        work.insert("x-dead-letter-exchange".into(), AMQPValue::LongString("".into()));
        work.insert("x-dead-letter-routing-key".into(), AMQPValue::LongString(self.dead_letter_queue().into()));
        channel.queue_declare(&self.queue, durable, work).await?;
        for delay in RETRY_DELAYS {
            let mut retry = FieldTable::default();
            retry.insert("x-message-ttl".into(), AMQPValue::LongLongInt(delay.as_millis() as i64));
            retry.insert("x-dead-letter-exchange".into(), AMQPValue::LongString("".into()));
            retry.insert("x-dead-letter-routing-key".into(), AMQPValue::LongString(self.queue.clone().into()));
            channel.queue_declare(&self.retry_queue(delay), durable, retry).await?;
        }
        Ok(())
    }
}

pub fn retry_delay_tier(after: Duration) -> Duration {
    RETRY_DELAYS.into_iter().find(|delay| *delay >= after).unwrap_or(RETRY_DELAYS[RETRY_DELAYS.len() - 1])
}

pub async fn connect(url: &str, name: &str) -> lapin::Result<Connection> {
    let properties = ConnectionProperties::default()
        .with_connection_name(LongString::from(name.to_owned()))
        .with_executor(tokio_executor_trait::Tokio::current())
        .with_reactor(tokio_reactor_trait::Tokio);
    Connection::connect(url, properties).await
}

/// Consumes until `stop` turns true, reconnecting after any broker or connection failure.
pub async fn run(url: &str, topology: Topology, prefetch: u16, handler: Handler, mut stop: watch::Receiver<bool>) {
    let mut failures = 0usize;
    while !*stop.borrow() {
        let attempt_started = std::time::Instant::now();
        match consume(url, &topology, prefetch, &handler, &mut stop).await {
            Ok(()) => return,
            Err(error) => {
                // A connection that served a while starts the backoff over.
                if attempt_started.elapsed() > CONNECTION_HEALTHY_AFTER {
                    failures = 0;
                }
                let delay = Duration::from_millis(RECONNECT_DELAYS_MS[failures.min(RECONNECT_DELAYS_MS.len() - 1)]);
                failures += 1;
                tracing::warn!(%error, retry_in_ms = delay.as_millis() as u64, "broker connection lost; reconnecting");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = stop.changed() => {}
                }
            }
        }
    }
}

async fn consume(url: &str, topology: &Topology, prefetch: u16, handler: &Handler, stop: &mut watch::Receiver<bool>) -> lapin::Result<()> {
    let connection = connect(url, "order-consumer").await?;
    let channel = connection.create_channel().await?;
    topology.declare(&channel).await?;
    channel.basic_qos(prefetch, BasicQosOptions::default()).await?;
    // Retries are published on their own channel with confirms: the original is acked only
    // once the broker holds its delayed copy.
    let publisher = Arc::new(connection.create_channel().await?);
    publisher.confirm_select(ConfirmSelectOptions::default()).await?;
    let mut deliveries = channel
        .basic_consume(&topology.queue, "order-consumer", BasicConsumeOptions::default(), FieldTable::default())
        .await?;
    tracing::info!(queue = %topology.queue, prefetch, "consuming");
    let mut in_flight = JoinSet::new();
    let result = loop {
        tokio::select! {
            delivery = deliveries.next() => match delivery {
                Some(Ok(delivery)) => {
                    let handler = handler.clone();
                    let publisher = Arc::clone(&publisher);
                    let topology = topology.clone();
                    in_flight.spawn(async move { settle(delivery, &handler, &publisher, &topology).await });
                }
                Some(Err(error)) => break Err(error),
                None => break Err(lapin::Error::InvalidChannelState(lapin::ChannelState::Closed)),
            },
            Some(_) = in_flight.join_next(), if !in_flight.is_empty() => {}
            _ = stop.changed() => break Ok(()),
        }
    };
    // Deliveries already being handled finish (their answers are recorded); the rest are
    // redelivered by the broker once the connection closes.
    while in_flight.join_next().await.is_some() {}
    let _ = connection.close(200, "consumer stopping").await;
    result
}

fn retries_of(properties: &BasicProperties) -> u32 {
    let value = properties.headers().as_ref().and_then(|headers| headers.inner().get(RETRIES_HEADER).cloned());
    match value {
        Some(AMQPValue::LongUInt(n)) => n,
        Some(AMQPValue::LongLongInt(n)) => u32::try_from(n).unwrap_or(u32::MAX),
        Some(AMQPValue::LongInt(n)) => u32::try_from(n).unwrap_or(0),
        _ => 0,
    }
}

async fn settle(delivery: lapin::message::Delivery, handler: &Handler, publisher: &Channel, topology: &Topology) {
    let retries = retries_of(&delivery.properties);
    let fate = handler.handle(&delivery.data, retries, delivery.redelivered).await;
    let result = match fate {
        Fate::Ack => delivery.ack(BasicAckOptions::default()).await,
        Fate::DeadLetter { .. } => delivery.reject(BasicRejectOptions { requeue: false }).await,
        Fate::Retry { after } => match publish_retry(publisher, topology, &delivery, retries + 1, after).await {
            Ok(()) => delivery.ack(BasicAckOptions::default()).await,
            // Not held by the broker: give the message back now rather than lose it.
            Err(error) => {
                tracing::warn!(%error, "delayed retry not published; requeued at once");
                delivery.nack(BasicNackOptions { requeue: true, ..BasicNackOptions::default() }).await
            }
        },
    };
    if let Err(error) = result {
        // The channel is gone: the broker redelivers the message, and the table answers it.
        tracing::debug!(%error, "settling a delivery failed");
    }
}

async fn publish_retry(publisher: &Channel, topology: &Topology, delivery: &lapin::message::Delivery, retries: u32, after: Duration) -> lapin::Result<()> {
    let mut headers = FieldTable::default();
    headers.insert(ShortString::from(RETRIES_HEADER), AMQPValue::LongUInt(retries));
    let properties = BasicProperties::default().with_delivery_mode(2).with_headers(headers);
    let queue = topology.retry_queue(retry_delay_tier(after));
    let confirmation = publisher.basic_publish("", &queue, BasicPublishOptions::default(), &delivery.data, properties).await?.await?;
    match confirmation {
        Confirmation::Ack(_) | Confirmation::NotRequested => Ok(()),
        Confirmation::Nack(_) => Err(lapin::Error::InvalidChannelState(lapin::ChannelState::Error)),
    }
}

/// Publishes the events with publisher confirms, a window of them in flight at a time, at
/// most `rate_per_second` if given. A lost connection is reopened and the unconfirmed window
/// published again: an event may then be published twice, which is what consumers are for.
pub async fn publish(url: &str, topology: &Topology, bodies: &[OrderPlaced], rate_per_second: Option<u32>) -> lapin::Result<()> {
    const FAILURES_MAX: u32 = 20;
    let mut confirmed = 0usize;
    let mut failures = 0;
    loop {
        match publish_from(url, topology, bodies, &mut confirmed, rate_per_second).await {
            Ok(()) => return Ok(()),
            Err(error) if failures < FAILURES_MAX => {
                failures += 1;
                tracing::warn!(%error, confirmed, "publishing interrupted; reconnecting");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(error) => return Err(error),
        }
    }
}

async fn publish_from(url: &str, topology: &Topology, bodies: &[OrderPlaced], confirmed: &mut usize, rate_per_second: Option<u32>) -> lapin::Result<()> {
    const CONFIRM_WINDOW: usize = 64;
    let connection = connect(url, "order-producer").await?;
    let channel = connection.create_channel().await?;
    topology.declare(&channel).await?;
    channel.confirm_select(ConfirmSelectOptions::default()).await?;
    let mut pace = rate_per_second.map(|rate| tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate.max(1)))));
    while *confirmed < bodies.len() {
        let window = &bodies[*confirmed..(*confirmed + CONFIRM_WINDOW).min(bodies.len())];
        let mut confirms = Vec::with_capacity(window.len());
        for body in window {
            if let Some(pace) = &mut pace {
                pace.tick().await;
            }
            let properties = BasicProperties::default().with_delivery_mode(2).with_content_type("application/json".into());
            let body = body_placed_now(body);
            confirms.push(channel.basic_publish("", &topology.queue, BasicPublishOptions::default(), &body, properties).await?);
        }
        for confirm in confirms {
            if let Confirmation::Nack(_) = confirm.await? {
                return Err(lapin::Error::InvalidChannelState(lapin::ChannelState::Error));
            }
        }
        *confirmed += window.len();
    }
    let _ = connection.close(200, "published").await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_waits_in_the_shortest_queue_at_least_as_long_as_asked() {
        assert_eq!(retry_delay_tier(Duration::ZERO), Duration::from_millis(200));
        assert_eq!(retry_delay_tier(Duration::from_millis(201)), Duration::from_secs(1));
        assert_eq!(retry_delay_tier(Duration::from_secs(5)), Duration::from_secs(5));
        assert_eq!(retry_delay_tier(Duration::from_secs(3600)), Duration::from_secs(120));
    }
}
