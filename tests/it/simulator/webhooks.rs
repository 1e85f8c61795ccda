use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use chargeguard::simulator::{DisputeStatus, OpenDispute, WebhookMode};
use stripe_core::refund::CreateRefund;
use stripe_webhook::{EventObject, Webhook};

use super::{Sim, charge};

const SECRET: &str = "whsec_simulator_test";

/// A webhook endpoint that records what it receives and fails the first `failures` posts.
#[derive(Clone, Default)]
struct Receiver {
    received: Arc<Mutex<Vec<(String, String)>>>,
    failures: Arc<Mutex<u32>>,
}

impl Receiver {
    async fn start(failures: u32) -> (Self, String) {
        let receiver = Self {
            failures: Arc::new(Mutex::new(failures)),
            ..Self::default()
        };
        let app = axum::Router::new()
            .route("/hook", axum::routing::post(receive))
            .with_state(receiver.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (receiver, url)
    }

    fn received(&self) -> Vec<(String, String)> {
        self.received.lock().unwrap().clone()
    }

    /// Every received event verified and parsed, in arrival order.
    fn events(&self) -> Vec<stripe_webhook::Event> {
        self.received()
            .iter()
            .map(|(signature, body)| {
                Webhook::construct_event(body, signature, SECRET).expect("verifies and parses")
            })
            .collect()
    }
}

async fn receive(State(receiver): State<Receiver>, headers: HeaderMap, body: String) -> StatusCode {
    let signature = headers
        .get("stripe-signature")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default();
    receiver
        .received
        .lock()
        .unwrap()
        .push((signature.to_owned(), body));
    let mut failures = receiver.failures.lock().unwrap();
    if *failures > 0 {
        *failures -= 1;
        return StatusCode::INTERNAL_SERVER_ERROR;
    }
    StatusCode::OK
}

#[tokio::test]
async fn events_are_signed_as_stripe_signs_them_and_parse() {
    let sim = Sim::start().await;
    let (receiver, url) = Receiver::start(0).await;
    sim.control.set_webhook_target(&url, SECRET).await.unwrap();
    let paid = charge(800, "pm_card_visa", "w1")
        .send(&sim.stripe)
        .await
        .unwrap();
    CreateRefund::new()
        .payment_intent(paid.id.as_str())
        .send(&sim.stripe)
        .await
        .unwrap();
    let report = sim.control.flush_webhooks().await.unwrap();
    assert_eq!((report.delivered_total, report.pending), (3, 0));

    let events = receiver.events();
    match &events[0].data.object {
        EventObject::PaymentIntentSucceeded(intent) => assert_eq!(intent.id, paid.id),
        other => panic!("expected payment_intent.succeeded, got {other:?}"),
    }
    assert!(matches!(
        events[1].data.object,
        EventObject::RefundCreated(_)
    ));
    match &events[2].data.object {
        EventObject::ChargeRefunded(charge) => assert!(charge.refunded),
        other => panic!("expected charge.refunded, got {other:?}"),
    }
    let (signature, body) = &receiver.received()[0];
    assert!(Webhook::construct_event(body, signature, "whsec_wrong").is_err());
}

#[tokio::test]
async fn refund_failures_and_disputes_are_delivered_and_parse() {
    let sim = Sim::start().await;
    let (receiver, url) = Receiver::start(0).await;
    sim.control.set_webhook_target(&url, SECRET).await.unwrap();
    let paid = charge(800, "pm_card_visa", "w-fail").send(&sim.stripe).await.unwrap();
    let refund = CreateRefund::new().payment_intent(paid.id.as_str()).amount(300).send(&sim.stripe).await.unwrap();
    sim.control.fail_refund(refund.id.as_str(), None).await.unwrap();
    let dispute = sim.control.open_dispute(paid.id.as_str(), OpenDispute::default()).await.unwrap();
    sim.control.close_dispute(dispute["id"].as_str().unwrap(), DisputeStatus::Won).await.unwrap();
    let report = sim.control.flush_webhooks().await.unwrap();
    assert_eq!((report.delivered_total, report.pending), (8, 0));

    let events = receiver.events();
    let refund_of = |object: &EventObject| match object {
        EventObject::RefundUpdated(refund) | EventObject::RefundFailed(refund) | EventObject::ChargeRefundUpdated(refund) => {
            (refund.id.clone(), refund.status.clone(), refund.failure_reason.clone())
        }
        other => panic!("expected a refund event, got {other:?}"),
    };
    let failed = (refund.id.clone(), Some("failed".to_owned()), Some("expired_or_canceled_card".to_owned()));
    assert!(matches!(events[3].data.object, EventObject::RefundUpdated(_)));
    assert!(matches!(events[4].data.object, EventObject::RefundFailed(_)));
    assert!(matches!(events[5].data.object, EventObject::ChargeRefundUpdated(_)));
    for event in &events[3..6] {
        assert_eq!(refund_of(&event.data.object), failed);
    }
    match (&events[6].data.object, &events[7].data.object) {
        (EventObject::ChargeDisputeCreated(created), EventObject::ChargeDisputeClosed(closed)) => {
            assert_eq!(created.id.as_str(), dispute["id"].as_str().unwrap());
            assert_eq!((created.amount, created.status.as_str()), (800, "needs_response"));
            assert_eq!(closed.status.as_str(), "won");
        }
        other => panic!("expected charge.dispute.created then closed, got {other:?}"),
    }
}

#[tokio::test]
async fn failed_deliveries_are_retried_then_given_up() {
    let sim = Sim::start().await;
    let (receiver, url) = Receiver::start(2).await;
    sim.control.set_webhook_target(&url, SECRET).await.unwrap();
    charge(800, "pm_card_visa", "w2")
        .send(&sim.stripe)
        .await
        .unwrap();
    let report = sim.control.flush_webhooks().await.unwrap();
    assert_eq!((report.delivered_total, report.given_up_total), (1, 0));
    let attempts: Vec<(u32, bool)> = sim
        .control
        .deliveries()
        .await
        .unwrap()
        .iter()
        .map(|delivery| (delivery.attempt, delivery.delivered))
        .collect();
    assert_eq!(attempts, [(1, false), (2, false), (3, true)]);
    let ids: Vec<String> = receiver
        .events()
        .iter()
        .map(|event| event.id.as_str().to_owned())
        .collect();
    assert!(ids.iter().all(|id| id == &ids[0]) && ids.len() == 3);

    let (_, refusing) = Receiver::start(u32::MAX).await;
    sim.control
        .set_webhook_target(&refusing, SECRET)
        .await
        .unwrap();
    charge(800, "pm_card_visa", "w3")
        .send(&sim.stripe)
        .await
        .unwrap();
    let report = sim.control.flush_webhooks().await.unwrap();
    assert_eq!((report.given_up_total, report.pending), (1, 0));
}

#[tokio::test]
async fn modes_duplicate_and_reorder_events() {
    let sim = Sim::start().await;
    let (receiver, url) = Receiver::start(0).await;
    sim.control.set_webhook_target(&url, SECRET).await.unwrap();

    sim.control
        .set_webhook_mode(WebhookMode::Twice)
        .await
        .unwrap();
    charge(100, "pm_card_visa", "twice")
        .send(&sim.stripe)
        .await
        .unwrap();
    sim.control.flush_webhooks().await.unwrap();
    let twice = receiver.events();
    assert_eq!(twice.len(), 2);
    assert_eq!(twice[0].id, twice[1].id);

    sim.control
        .set_webhook_mode(WebhookMode::DistinctDuplicates)
        .await
        .unwrap();
    let paid = charge(100, "pm_card_visa", "distinct")
        .send(&sim.stripe)
        .await
        .unwrap();
    sim.control.flush_webhooks().await.unwrap();
    let distinct = &receiver.events()[2..];
    assert_eq!(distinct.len(), 2);
    assert_ne!(distinct[0].id, distinct[1].id);
    for event in distinct {
        assert!(
            matches!(&event.data.object, EventObject::PaymentIntentSucceeded(intent) if intent.id == paid.id)
        );
    }

    sim.control
        .set_webhook_mode(WebhookMode::Shuffle)
        .await
        .unwrap();
    for index in 0..12 {
        charge(100, "pm_card_visa", &format!("shuffle{index}"))
            .send(&sim.stripe)
            .await
            .unwrap();
    }
    sim.control.flush_webhooks().await.unwrap();
    // Three events so far (one delivered twice), four deliveries.
    let emitted: Vec<String> = sim.control.events().await.unwrap()[3..]
        .iter()
        .map(|event| event.id.clone())
        .collect();
    let delivered: Vec<String> = receiver.events()[4..]
        .iter()
        .map(|event| event.id.as_str().to_owned())
        .collect();
    let mut sorted_emitted = emitted.clone();
    let mut sorted_delivered = delivered.clone();
    sorted_emitted.sort();
    sorted_delivered.sort();
    assert_eq!(sorted_emitted, sorted_delivered);
    assert_ne!(
        emitted, delivered,
        "shuffle mode delivered in creation order"
    );
}
