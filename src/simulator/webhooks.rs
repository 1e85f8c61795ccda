//! Events and their delivery: signed as Stripe signs them, retried with backoff on failure (a
//! bounded number of times), with modes that make receivers face duplicates and disorder.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hmac::{Hmac, Mac};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::Sha256;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::clock::wall_clock_seconds;
use super::state::ExecContext;
use super::{SimulatorLimits, WEBHOOK_API_VERSION, WebhookTarget};

/// Deliveries attempted in one pass.
const BATCH_MAX: usize = 64;
/// How often the background worker looks for due retries.
const POLL_INTERVAL: Duration = Duration::from_millis(250);
const BACKOFF_BASE: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// In shuffle mode each delivery is held back by a random delay up to this.
const SHUFFLE_DELAY_MS_MAX: u64 = 2_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WebhookMode {
    /// Each event delivered once, in order.
    #[default]
    Normal,
    /// Each event delivered twice (same event id).
    Twice,
    /// Deliveries held back by random delays and sent in shuffled batches.
    Shuffle,
    /// Two distinct event objects (different ids) for one change.
    DistinctDuplicates,
}

/// An event the simulator generated (whether or not it was delivered).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventRecord {
    pub id: String,
    #[serde(rename = "type")]
    pub event_type: String,
    pub object_id: String,
    /// Sim clock.
    pub created: i64,
}

/// One delivery attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryRecord {
    pub event_id: String,
    pub event_type: String,
    pub attempt: u32,
    /// The receiver's status, `None` if it could not be reached.
    pub status: Option<u16>,
    pub delivered: bool,
}

/// Totals since start, and what is still queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlushReport {
    pub delivered_total: u64,
    pub given_up_total: u64,
    pub dropped_total: u64,
    pub pending: usize,
}

#[derive(Debug)]
struct Delivery {
    event_id: String,
    event_type: String,
    payload: Arc<str>,
    attempts: u32,
    due: Instant,
}

#[derive(Debug)]
struct Inner {
    target: Option<WebhookTarget>,
    mode: WebhookMode,
    queue: VecDeque<Delivery>,
    events: VecDeque<EventRecord>,
    deliveries: VecDeque<DeliveryRecord>,
    rng: ChaCha8Rng,
    delivered_total: u64,
    given_up_total: u64,
    dropped_total: u64,
}

#[derive(Debug)]
pub struct Webhooks {
    inner: Mutex<Inner>,
    wake: tokio::sync::Notify,
    /// One delivery pass at a time (worker or flush), so no delivery is sent twice by us.
    pass: tokio::sync::Mutex<()>,
    http: reqwest::Client,
    limits: SimulatorLimits,
}

impl Webhooks {
    pub fn new(
        target: Option<WebhookTarget>,
        seed: u64,
        limits: SimulatorLimits,
    ) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_millis(limits.webhook_timeout_ms))
            .pool_max_idle_per_host(0)
            .build()?;
        Ok(Self {
            inner: Mutex::new(Inner {
                target,
                mode: WebhookMode::Normal,
                queue: VecDeque::new(),
                events: VecDeque::new(),
                deliveries: VecDeque::new(),
                rng: ChaCha8Rng::seed_from_u64(seed.wrapping_add(2)),
                delivered_total: 0,
                given_up_total: 0,
                dropped_total: 0,
            }),
            wake: tokio::sync::Notify::new(),
            pass: tokio::sync::Mutex::new(()),
            http,
            limits,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn set_target(&self, target: Option<WebhookTarget>) {
        self.lock().target = target;
    }

    pub fn set_mode(&self, mode: WebhookMode) {
        self.lock().mode = mode;
    }

    pub fn events(&self) -> Vec<EventRecord> {
        self.lock().events.iter().cloned().collect()
    }

    pub fn deliveries(&self) -> Vec<DeliveryRecord> {
        self.lock().deliveries.iter().cloned().collect()
    }

    fn report(&self) -> FlushReport {
        let inner = self.lock();
        FlushReport {
            delivered_total: inner.delivered_total,
            given_up_total: inner.given_up_total,
            dropped_total: inner.dropped_total,
            pending: inner.queue.len(),
        }
    }

    /// [`Self::emit`] for an object already rendered.
    pub fn emit_rendered(&self, event_type: &str, object: Value, now: i64, ctx: Option<&ExecContext>) {
        let object_id = object.get("id").and_then(Value::as_str).unwrap_or_default().to_owned();
        self.emit(event_type, object_id, || object, now, ctx);
    }

    /// Records an event of `event_type` about the object `object_id` and queues its delivery.
    /// `render` makes the object's body, and runs only when there is somewhere to deliver it:
    /// rendering an intent is a fifth of a create's work, and the benchmark's simulator has no
    /// webhook target.
    pub fn emit(
        &self,
        event_type: &str,
        object_id: String,
        render: impl FnOnce() -> Value,
        now: i64,
        ctx: Option<&ExecContext>,
    ) {
        let mut inner = self.lock();
        let object = inner.target.is_some().then(render);
        let copies = match inner.mode {
            WebhookMode::DistinctDuplicates => 2,
            _ => 1,
        };
        for _ in 0..copies {
            let id = new_event_id(&mut inner.rng);
            push_bounded(
                &mut inner.events,
                EventRecord {
                    id: id.clone(),
                    event_type: event_type.to_owned(),
                    object_id: object_id.clone(),
                    created: now,
                },
                self.limits.event_log_entries_max,
            );
            let Some(object) = &object else {
                continue;
            };
            let event = json!({
                "id": id,
                "object": "event",
                "api_version": WEBHOOK_API_VERSION,
                "created": now,
                "data": { "object": object },
                "livemode": false,
                // One endpoint, the target: only a delivered event is built.
                "pending_webhooks": 1,
                "request": {
                    "id": ctx.map(|ctx| ctx.request_id.clone()),
                    "idempotency_key": ctx.and_then(|ctx| ctx.idempotency_key.clone()),
                },
                "type": event_type,
            });
            let payload: Arc<str> = Arc::from(event.to_string());
            let sends = if inner.mode == WebhookMode::Twice {
                2
            } else {
                1
            };
            for _ in 0..sends {
                let delay = if inner.mode == WebhookMode::Shuffle {
                    Duration::from_millis(inner.rng.gen_range(0..=SHUFFLE_DELAY_MS_MAX))
                } else {
                    Duration::ZERO
                };
                if inner.queue.len() >= self.limits.webhook_queue_max {
                    inner.queue.pop_front();
                    inner.dropped_total += 1;
                }
                inner.queue.push_back(Delivery {
                    event_id: id.clone(),
                    event_type: event_type.to_owned(),
                    payload: payload.clone(),
                    attempts: 0,
                    due: Instant::now() + delay,
                });
            }
        }
        drop(inner);
        self.wake.notify_one();
    }

    /// Delivers what is due (everything when `force`); returns how many were attempted.
    async fn pass(&self, force: bool) -> usize {
        let _pass = self.pass.lock().await;
        let (batch, target) = {
            let mut inner = self.lock();
            let Some(target) = inner.target.clone() else {
                return 0;
            };
            let now = Instant::now();
            let mut batch = Vec::new();
            let mut kept = VecDeque::with_capacity(inner.queue.len());
            while let Some(delivery) = inner.queue.pop_front() {
                if batch.len() < BATCH_MAX && (force || delivery.due <= now) {
                    batch.push(delivery);
                } else {
                    kept.push_back(delivery);
                }
            }
            inner.queue = kept;
            if inner.mode == WebhookMode::Shuffle {
                batch.shuffle(&mut inner.rng);
            }
            (batch, target)
        };
        let attempted = batch.len();
        for mut delivery in batch {
            let status = self.send(&target, &delivery.payload).await;
            delivery.attempts += 1;
            let delivered = status.is_some_and(|status| (200..300).contains(&status));
            let mut inner = self.lock();
            push_bounded(
                &mut inner.deliveries,
                DeliveryRecord {
                    event_id: delivery.event_id.clone(),
                    event_type: delivery.event_type.clone(),
                    attempt: delivery.attempts,
                    status,
                    delivered,
                },
                self.limits.event_log_entries_max,
            );
            if delivered {
                inner.delivered_total += 1;
            } else if delivery.attempts >= self.limits.webhook_attempts_max {
                inner.given_up_total += 1;
                tracing::warn!(event_id = %delivery.event_id, "webhook delivery given up");
            } else {
                let exponent = delivery.attempts.saturating_sub(1).min(16);
                delivery.due =
                    Instant::now() + (BACKOFF_BASE * 2u32.pow(exponent)).min(BACKOFF_MAX);
                inner.queue.push_back(delivery);
            }
        }
        attempted
    }

    async fn send(&self, target: &WebhookTarget, payload: &str) -> Option<u16> {
        let signature = sign(&target.secret, wall_clock_seconds(), payload);
        let response = self
            .http
            .post(&target.url)
            .header("content-type", "application/json; charset=utf-8")
            .header("stripe-signature", signature)
            .header(
                "user-agent",
                "Stripe/1.0 (+https://stripe.com/docs/webhooks)",
            )
            .body(payload.to_owned())
            .send()
            .await;
        match response {
            Ok(response) => Some(response.status().as_u16()),
            Err(error) => {
                tracing::debug!(%error, "webhook delivery failed");
                None
            }
        }
    }

    /// Delivers the whole queue now, ignoring backoff, until each delivery succeeded or ran out
    /// of attempts.
    pub async fn flush(&self) -> FlushReport {
        let attempts = usize::try_from(self.limits.webhook_attempts_max).unwrap_or(usize::MAX);
        let passes_max = (self.limits.webhook_queue_max / BATCH_MAX + 1)
            .saturating_mul(attempts.saturating_add(1));
        for _ in 0..passes_max {
            let attempted = self.pass(true).await;
            if attempted == 0 || self.lock().queue.is_empty() {
                break;
            }
        }
        self.report()
    }
}

fn push_bounded<T>(ring: &mut VecDeque<T>, item: T, len_max: usize) {
    if ring.len() >= len_max {
        ring.pop_front();
    }
    ring.push_back(item);
}

fn new_event_id(rng: &mut ChaCha8Rng) -> String {
    const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let suffix: String = (0..24)
        .map(|_| char::from(ALPHABET[rng.gen_range(0..ALPHABET.len())]))
        .collect();
    format!("evt_{suffix}")
}

/// `Stripe-Signature`: `t=<unix seconds>,v1=<hex HMAC-SHA256 of "{t}.{payload}">`.
pub fn sign(secret: &str, timestamp: i64, payload: &str) -> String {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret.as_bytes())
        .expect("HMAC takes keys of any length");
    mac.update(format!("{timestamp}.{payload}").as_bytes());
    format!(
        "t={timestamp},v1={}",
        hex::encode(mac.finalize().into_bytes())
    )
}

/// The background worker: delivers due events until shutdown.
pub async fn delivery_loop(webhooks: Arc<Webhooks>, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = webhooks.wake.notified() => {}
            () = tokio::time::sleep(POLL_INTERVAL) => {}
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = webhooks.pass(false) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_matches_stripes_scheme() {
        let header = sign("whsec_test", 1_700_000_000, "{}");
        let (t, v1) = header.split_once(',').unwrap();
        assert_eq!(t, "t=1700000000");
        assert_eq!(v1.len(), "v1=".len() + 64);
        assert_eq!(
            header,
            stripe_webhook::Webhook::generate_test_header("{}", "whsec_test", Some(1_700_000_000))
        );
    }
}
