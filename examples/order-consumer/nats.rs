//! NATS JetStream: a durable pull consumer with explicit acks, `AckWait` and a bound on
//! deliveries; a retry is a negative ack with a delay, a refusal a terminating ack after the
//! message is copied to the dead-letter subject.

use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer::{AckPolicy, pull}};
use futures::StreamExt;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::event::OrderPlaced;
use crate::handler::{Fate, Handler};
use crate::produce::body_placed_now;

const CONSUMER: &str = "order-consumer";
/// A delivery not acked within this is delivered again (the consumer died holding it).
const ACK_WAIT: Duration = Duration::from_secs(30);
/// Deliveries of one message before JetStream stops (it is then dead-lettered by an advisory a
/// person watches); far above the consumer's own retry bound.
const MAX_DELIVER: i64 = 500;

#[derive(Debug, Clone)]
pub struct Subjects {
    pub subject: String,
}

impl Subjects {
    pub fn dead_letter(&self) -> String {
        format!("{}.dead", self.subject)
    }

    /// The stream holding both subjects, named after them (stream names have no dots).
    pub fn stream(&self) -> String {
        self.subject.replace(['.', '*', '>'], "_").to_uppercase()
    }
}

async fn context(url: &str) -> anyhow::Result<jetstream::Context> {
    let client = async_nats::connect(url).await?;
    Ok(jetstream::new(client))
}

async fn stream(context: &jetstream::Context, subjects: &Subjects) -> anyhow::Result<jetstream::stream::Stream> {
    let config = jetstream::stream::Config {
        name: subjects.stream(),
        subjects: vec![subjects.subject.clone(), subjects.dead_letter()],
        ..Default::default()
    };
    Ok(context.get_or_create_stream(config).await?)
}

pub async fn run(url: &str, subjects: Subjects, prefetch: u16, handler: Handler, mut stop: watch::Receiver<bool>) -> anyhow::Result<()> {
    let context = context(url).await?;
    let stream = stream(&context, &subjects).await?;
    let config = pull::Config {
        durable_name: Some(CONSUMER.to_owned()),
        filter_subject: subjects.subject.clone(),
        ack_policy: AckPolicy::Explicit,
        ack_wait: ACK_WAIT,
        max_deliver: MAX_DELIVER,
        max_ack_pending: i64::from(prefetch),
        ..Default::default()
    };
    let consumer = stream.get_or_create_consumer(CONSUMER, config).await?;
    let mut messages = consumer.messages().await?;
    tracing::info!(subject = %subjects.subject, prefetch, "consuming");
    let mut in_flight = JoinSet::new();
    loop {
        tokio::select! {
            message = messages.next() => match message {
                Some(Ok(message)) => {
                    let handler = handler.clone();
                    let context = context.clone();
                    let subjects = subjects.clone();
                    in_flight.spawn(async move { settle(message, &handler, &context, &subjects).await });
                }
                // async-nats reconnects by itself; a failed pull is logged and the stream goes on.
                Some(Err(error)) => tracing::warn!(%error, "pulling messages failed"),
                None => break,
            },
            Some(_) = in_flight.join_next(), if !in_flight.is_empty() => {}
            _ = stop.changed() => break,
        }
    }
    while in_flight.join_next().await.is_some() {}
    Ok(())
}

async fn settle(message: jetstream::Message, handler: &Handler, context: &jetstream::Context, subjects: &Subjects) {
    let delivered = message.info().map(|info| info.delivered).unwrap_or(1);
    let retries = u32::try_from(delivered.saturating_sub(1)).unwrap_or(u32::MAX);
    let fate = handler.handle(&message.payload, retries, delivered > 1).await;
    let result = match fate {
        Fate::Ack => message.ack().await,
        Fate::Retry { after } => message.ack_with(AckKind::Nak(Some(after))).await,
        Fate::DeadLetter { reason } => {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Chargeguard-Dead-Letter-Reason", reason.chars().take(200).collect::<String>().as_str());
            match context.publish_with_headers(subjects.dead_letter(), headers, message.payload.clone()).await {
                Ok(ack) => match ack.await {
                    Ok(_) => message.ack_with(AckKind::Term).await,
                    Err(error) => message.ack_with(AckKind::Nak(Some(Duration::from_secs(1)))).await.and(Err(error.into())),
                },
                Err(error) => Err(error.into()),
            }
        }
    };
    if let Err(error) = result {
        // Not acked: JetStream delivers it again after AckWait, and the table answers it.
        tracing::debug!(%error, "settling a message failed");
    }
}

pub async fn publish(url: &str, subjects: &Subjects, events: &[OrderPlaced]) -> anyhow::Result<()> {
    let context = context(url).await?;
    stream(&context, subjects).await?;
    for event in events {
        context.publish(subjects.subject.clone(), body_placed_now(event).into()).await?.await?;
    }
    Ok(())
}
