//! Per-consumer limits on the Payments service: a token bucket (`requests_per_second_max`,
//! `burst_max`) and a cap on calls in flight (`calls_in_flight_max`). A consumer over either is
//! answered RESOURCE_EXHAUSTED with a `retry-after` hint before its message is even decoded, so
//! one noisy consumer spends its own budget and not the others'.
//!
//! The layer identifies the caller itself (a SHA-256 and a constant-time scan); a caller it
//! cannot identify goes on to the handler, which refuses it and counts the failure.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::body::Body;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use super::auth::Authenticator;
use super::status;
use crate::config::ConsumerConfig;
use crate::domain::ConsumerName;

/// The calls the limits apply to: every method of `chargeguard.v1.Payments`.
const LIMITED_PATH_PREFIX: &str = "/chargeguard.v1.Payments/";
/// The hint for a consumer at its in-flight cap: calls usually finish within this.
const IN_FLIGHT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Why a call was refused before it ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitRefusal {
    Rate { consumer: ConsumerName, retry_after: Duration },
    InFlight { consumer: ConsumerName, calls_in_flight_max: u32 },
}

impl LimitRefusal {
    pub fn retry_after(&self) -> Duration {
        match self {
            LimitRefusal::Rate { retry_after, .. } => *retry_after,
            LimitRefusal::InFlight { .. } => IN_FLIGHT_RETRY_AFTER,
        }
    }
}

struct ConsumerLimit {
    bucket: DefaultDirectRateLimiter,
    in_flight: Arc<Semaphore>,
    calls_in_flight_max: u32,
}

/// Every consumer's bucket and in-flight cap, fixed at start.
#[derive(Clone, Default)]
pub struct ConsumerLimits {
    by_name: Arc<HashMap<ConsumerName, ConsumerLimit>>,
}

impl ConsumerLimits {
    pub fn from_config(consumers: &[ConsumerConfig]) -> Result<Self, crate::domain::InvalidField> {
        let mut by_name = HashMap::new();
        for consumer in consumers {
            let name = ConsumerName::parse(&consumer.name)?;
            let positive = |field: &'static str, value: u32| {
                NonZeroU32::new(value).ok_or_else(|| crate::domain::InvalidField::new(field, "must be at least 1"))
            };
            let quota = Quota::per_second(positive("requests_per_second_max", consumer.requests_per_second_max)?)
                .allow_burst(positive("burst_max", consumer.burst_max)?);
            let calls_in_flight_max = positive("calls_in_flight_max", consumer.calls_in_flight_max)?.get();
            by_name.insert(
                name,
                ConsumerLimit {
                    bucket: RateLimiter::direct(quota),
                    in_flight: Arc::new(Semaphore::new(calls_in_flight_max as usize)),
                    calls_in_flight_max,
                },
            );
        }
        Ok(Self { by_name: Arc::new(by_name) })
    }

    /// Takes one call from `consumer`'s bucket and one place among its calls in flight (held
    /// until the permit is dropped). A consumer without limits (none configured) is admitted.
    pub fn admit(&self, consumer: &ConsumerName) -> Result<Option<OwnedSemaphorePermit>, LimitRefusal> {
        let Some(limit) = self.by_name.get(consumer) else { return Ok(None) };
        // In-flight first: a call refused for being one too many does not spend the bucket.
        let permit = limit.in_flight.clone().try_acquire_owned().map_err(|_| LimitRefusal::InFlight {
            consumer: consumer.clone(),
            calls_in_flight_max: limit.calls_in_flight_max,
        })?;
        if let Err(not_until) = limit.bucket.check() {
            let retry_after = not_until.wait_time_from(DefaultClock::default().now());
            return Err(LimitRefusal::Rate { consumer: consumer.clone(), retry_after });
        }
        Ok(Some(permit))
    }
}

/// The layer for `Server::builder().layer(…)`.
#[derive(Clone)]
pub struct ConsumerLimitLayer {
    authenticator: Authenticator,
    limits: ConsumerLimits,
}

impl ConsumerLimitLayer {
    pub fn new(authenticator: Authenticator, limits: ConsumerLimits) -> Self {
        Self { authenticator, limits }
    }
}

impl<S> tower::Layer<S> for ConsumerLimitLayer {
    type Service = ConsumerLimitService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ConsumerLimitService { inner, authenticator: self.authenticator.clone(), limits: self.limits.clone() }
    }
}

#[derive(Clone)]
pub struct ConsumerLimitService<S> {
    inner: S,
    authenticator: Authenticator,
    limits: ConsumerLimits,
}

impl<S> ConsumerLimitService<S> {
    fn caller<B>(&self, request: &http::Request<B>) -> Option<ConsumerName> {
        if !request.uri().path().starts_with(LIMITED_PATH_PREFIX) {
            return None;
        }
        let authorization = request.headers().get(http::header::AUTHORIZATION).map(|value| value.as_bytes());
        let certificates = request
            .extensions()
            .get::<TlsConnectInfo<TcpConnectInfo>>()
            .and_then(TlsConnectInfo::peer_certs);
        let leaf = certificates.as_ref().and_then(|certificates| certificates.first());
        self.authenticator.identify(authorization, leaf).ok()
    }
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, B> tower::Service<http::Request<B>> for ConsumerLimitService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        // The clone that was polled ready serves this call (tower's usual swap).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let permit = match self.caller(&request).map(|consumer| self.limits.admit(&consumer)) {
            None | Some(Ok(None)) => None,
            Some(Ok(Some(permit))) => Some(permit),
            Some(Err(refusal)) => {
                metrics::counter!(
                    "chargeguard_calls_limited_total",
                    "consumer" => consumer_of(&refusal).to_string(),
                    "limit" => match refusal { LimitRefusal::Rate { .. } => "rate", LimitRefusal::InFlight { .. } => "in_flight" },
                )
                .increment(1);
                tracing::debug!(?refusal, "call refused: consumer over its limit");
                return Box::pin(std::future::ready(Ok(status::consumer_limited(&refusal).into_http())));
            }
        };
        Box::pin(async move {
            let response = inner.call(request).await;
            // A unary call has run when its response is ready; a stream's permit ends here too,
            // so a streaming call counts while it starts, not while it streams.
            drop(permit);
            response
        })
    }
}

fn consumer_of(refusal: &LimitRefusal) -> &ConsumerName {
    match refusal {
        LimitRefusal::Rate { consumer, .. } | LimitRefusal::InFlight { consumer, .. } => consumer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(requests_per_second_max: u32, burst_max: u32, calls_in_flight_max: u32) -> (ConsumerLimits, ConsumerName) {
        let consumer = ConsumerConfig {
            name: "orders".into(),
            token_sha256: crate::grpc::hash_token("t").into(),
            requests_per_second_max,
            burst_max,
            calls_in_flight_max,
            ..ConsumerConfig::default()
        };
        (ConsumerLimits::from_config(&[consumer]).unwrap(), ConsumerName::parse("orders").unwrap())
    }

    #[test]
    fn the_bucket_admits_its_burst_then_refuses_with_a_wait() {
        let (limits, orders) = limits(1, 3, 100);
        for _ in 0..3 {
            limits.admit(&orders).expect("within the burst");
        }
        let refusal = limits.admit(&orders).expect_err("over the burst");
        assert!(matches!(refusal, LimitRefusal::Rate { .. }), "{refusal:?}");
        assert!(refusal.retry_after() > Duration::ZERO && refusal.retry_after() <= Duration::from_secs(1), "{refusal:?}");
    }

    #[test]
    fn calls_in_flight_are_capped_until_one_finishes() {
        let (limits, orders) = limits(1_000, 1_000, 2);
        let first = limits.admit(&orders).unwrap();
        let _second = limits.admit(&orders).unwrap();
        assert!(matches!(limits.admit(&orders), Err(LimitRefusal::InFlight { calls_in_flight_max: 2, .. })));
        drop(first);
        limits.admit(&orders).expect("a place came free");
    }
}
