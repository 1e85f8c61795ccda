//! The Stripe simulator, driven through the real async-stripe client.

mod bad_input;
mod disputes;
mod faults;
mod idempotency;
mod listing;
mod payments;
mod refunds;
mod three_d_secure;
mod webhooks;

use std::collections::HashMap;

use chargeguard::simulator::{self, SimControl, SimulatorConfig, SimulatorHandle};
use stripe::{
    Client, ClientBuilder, IdempotencyKey, RequestStrategy, StripeError, StripeRequest as _,
};
use stripe_core::payment_intent::CreatePaymentIntent;
use stripe_core::refund::CreateRefund;
use stripe_core::{PaymentIntent, Refund};
use stripe_types::Currency;

pub const API_KEY: &str = simulator::DEFAULT_API_KEY;

pub struct Sim {
    pub handle: SimulatorHandle,
    pub control: SimControl,
    pub stripe: Client,
}

impl Sim {
    pub async fn start() -> Self {
        Self::start_with(SimulatorConfig::default()).await
    }

    pub async fn start_with(config: SimulatorConfig) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let handle = simulator::spawn(config, listener)
            .await
            .expect("spawn simulator");
        let control = handle.control();
        let stripe = client(&handle.base_url(), API_KEY);
        Self {
            handle,
            control,
            stripe,
        }
    }
}

pub fn client(base_url: &str, api_key: &str) -> Client {
    ClientBuilder::new(api_key)
        .url(base_url)
        .build()
        .expect("stripe client")
}

/// A confirmed charge of `amount` USD cents with `payment_method`, tagged `attempt=<attempt>`.
pub fn charge(amount: i64, payment_method: &str, attempt: &str) -> CreatePaymentIntent {
    CreatePaymentIntent::new(amount, Currency::USD)
        .confirm(true)
        .payment_method(payment_method)
        .metadata(HashMap::from([("attempt".to_owned(), attempt.to_owned())]))
}

pub fn idempotent(key: &str) -> RequestStrategy {
    RequestStrategy::Idempotent(IdempotencyKey::new(key).expect("valid key"))
}

pub async fn create_keyed(
    stripe: &Client,
    request: &CreatePaymentIntent,
    key: &str,
) -> Result<PaymentIntent, StripeError> {
    request
        .customize()
        .request_strategy(idempotent(key))
        .send(stripe)
        .await
}

pub async fn refund_keyed(
    stripe: &Client,
    request: &CreateRefund,
    key: &str,
) -> Result<Refund, StripeError> {
    request
        .customize()
        .request_strategy(idempotent(key))
        .send(stripe)
        .await
}

/// The HTTP status of a Stripe error (panics on anything else, with the error).
pub fn status_of(error: &StripeError) -> u16 {
    match error {
        StripeError::Stripe(_, status) => *status,
        other => panic!("expected a Stripe error, got {other:?}"),
    }
}

pub fn api_error(error: StripeError) -> (Box<stripe::ApiErrors>, u16) {
    match error {
        StripeError::Stripe(api, status) => (api, status),
        other => panic!("expected a Stripe error, got {other:?}"),
    }
}

#[tokio::test]
async fn shutdown_stops_serving() {
    let sim = Sim::start().await;
    let addr = sim.handle.local_addr();
    // The sim clock starts at real time.
    assert!((sim.control.now().await.unwrap() - chrono::Utc::now().timestamp()).abs() <= 5);
    sim.handle.shutdown().await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}
