use std::time::Duration;

use chargeguard::simulator::{Endpoint, FaultKind, FaultSpec, SimulatorConfig};
use stripe::{ApiErrorsCode, ApiErrorsType};
use stripe_core::PaymentIntentStatus;
use stripe_core::payment_intent::CreatePaymentIntent;
use stripe_types::Currency;

use super::{API_KEY, Sim, api_error, charge, client, create_keyed};

#[tokio::test]
async fn replay_returns_the_identical_object_marked_replayed() {
    let sim = Sim::start().await;
    let request = charge(1_500, "pm_card_visa", "a1");
    let first = create_keyed(&sim.stripe, &request, "key-1")
        .await
        .expect("first create");
    let second = create_keyed(&sim.stripe, &request, "key-1")
        .await
        .expect("replayed create");
    assert_eq!(first.status, PaymentIntentStatus::Succeeded);
    assert_eq!(format!("{first:?}"), format!("{second:?}"));

    // The same parameters, encoded differently by hand, are the same request.
    let raw = reqwest::Client::new()
        .post(format!("{}v1/payment_intents", sim.handle.base_url()))
        .bearer_auth(API_KEY)
        .header("Idempotency-Key", "key-1")
        .body("metadata%5Battempt%5D=a1&payment_method=pm_card_visa&confirm=true&currency=usd&amount=1500")
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 200);
    assert_eq!(raw.headers().get("idempotent-replayed").unwrap(), "true");
    assert!(
        raw.headers()
            .get("request-id")
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("req_")
    );
    let body: serde_json::Value = raw.json().await.unwrap();
    assert_eq!(body["id"], first.id.as_str());

    let ledger = sim.control.ledger().await.unwrap();
    assert_eq!(ledger.payment_intents.len(), 1);
    assert_eq!(
        ledger.payment_intents[0].idempotency_key.as_deref(),
        Some("key-1")
    );
    assert_eq!(
        ledger.payment_intents[0]
            .metadata
            .get("attempt")
            .map(String::as_str),
        Some("a1")
    );
    let replayed: Vec<bool> = sim
        .control
        .requests()
        .await
        .unwrap()
        .iter()
        .map(|entry| entry.replayed)
        .collect();
    assert_eq!(replayed, [false, true, true]);
}

#[tokio::test]
async fn a_decline_is_saved_and_replayed_with_its_intent() {
    let sim = Sim::start().await;
    let request = charge(900, "pm_card_chargeDeclinedInsufficientFunds", "d1");
    let (first, status) = api_error(
        create_keyed(&sim.stripe, &request, "key-d")
            .await
            .unwrap_err(),
    );
    let (second, _) = api_error(
        create_keyed(&sim.stripe, &request, "key-d")
            .await
            .unwrap_err(),
    );
    assert_eq!(status, 402);
    assert_eq!(first.type_, ApiErrorsType::CardError);
    assert_eq!(first.code, Some(ApiErrorsCode::CardDeclined));
    assert_eq!(first.decline_code.as_deref(), Some("insufficient_funds"));
    let intent = first
        .payment_intent
        .as_ref()
        .expect("the error carries the intent");
    assert_eq!(intent.status, PaymentIntentStatus::RequiresPaymentMethod);
    assert!(intent.last_payment_error.is_some());
    assert_eq!(second.payment_intent.as_ref().unwrap().id, intent.id);
    assert_eq!(sim.control.ledger().await.unwrap().payment_intents.len(), 1);
}

#[tokio::test]
async fn a_key_reused_with_other_parameters_is_an_idempotency_error() {
    let sim = Sim::start().await;
    create_keyed(&sim.stripe, &charge(1_000, "pm_card_visa", "m1"), "key-m")
        .await
        .unwrap();
    let (error, status) = api_error(
        create_keyed(&sim.stripe, &charge(1_001, "pm_card_visa", "m1"), "key-m")
            .await
            .unwrap_err(),
    );
    assert_eq!(status, 400);
    assert_eq!(error.type_, ApiErrorsType::IdempotencyError);
    let ledger = sim.control.ledger().await.unwrap();
    assert_eq!(ledger.payment_intents.len(), 1);
    assert_eq!(ledger.payment_intents[0].amount, 1_000);
}

/// Every parameter counts, not only the money: a create re-sent with another `return_url` (a
/// new deployment's setting) is refused as Stripe refuses it, and the first one's stays.
#[tokio::test]
async fn a_key_reused_with_another_return_url_is_an_idempotency_error() {
    let first_url = "https://shop.example/return-a";
    let request = charge(1_000, "pm_card_visa", "r1");
    let sim = Sim::start().await;
    create_keyed(&sim.stripe, &request.clone().return_url(first_url), "key-r")
        .await
        .unwrap();
    let (error, status) = api_error(
        create_keyed(&sim.stripe, &request.return_url("https://shop.example/return-b"), "key-r")
            .await
            .unwrap_err(),
    );
    assert_eq!(status, 400);
    assert_eq!(error.type_, ApiErrorsType::IdempotencyError);
    let ledger = sim.control.ledger().await.unwrap();
    assert_eq!(ledger.payment_intents.len(), 1);
    assert_eq!(ledger.payment_intents[0].return_url.as_deref(), Some(first_url));
}

#[tokio::test]
async fn concurrent_requests_with_one_key_make_one_object_and_one_409() {
    let sim = Sim::start().await;
    // The request that takes the key holds it for a second.
    sim.control
        .set_fault(
            Endpoint::CreatePaymentIntent,
            FaultSpec::next(FaultKind::Latency(1_000), 1),
        )
        .await
        .unwrap();
    let request = charge(2_000, "pm_card_visa", "c1");
    let (a, b) = tokio::join!(
        create_keyed(&sim.stripe, &request, "key-c"),
        create_keyed(&sim.stripe, &request, "key-c")
    );
    let (created, conflict) = match (a, b) {
        (Ok(intent), Err(error)) | (Err(error), Ok(intent)) => (intent, error),
        other => panic!("expected one success and one conflict, got {other:?}"),
    };
    let (error, status) = api_error(conflict);
    assert_eq!(status, 409);
    assert_eq!(error.code, Some(ApiErrorsCode::IdempotencyKeyInUse));
    // Once the first finished, the key replays it.
    let retried = create_keyed(&sim.stripe, &request, "key-c").await.unwrap();
    assert_eq!(retried.id, created.id);
    assert_eq!(sim.control.ledger().await.unwrap().payment_intents.len(), 1);
}

#[tokio::test]
async fn keys_are_pruned_after_24_hours_of_sim_time() {
    let sim = Sim::start().await;
    let request = charge(700, "pm_card_visa", "p1");
    let first = create_keyed(&sim.stripe, &request, "key-p").await.unwrap();
    sim.control
        .advance_clock(Duration::from_secs(23 * 3600))
        .await
        .unwrap();
    assert_eq!(
        create_keyed(&sim.stripe, &request, "key-p")
            .await
            .unwrap()
            .id,
        first.id
    );
    sim.control
        .advance_clock(Duration::from_secs(2 * 3600))
        .await
        .unwrap();
    let second = create_keyed(&sim.stripe, &request, "key-p").await.unwrap();
    assert_ne!(second.id, first.id);
    assert!(second.created >= first.created + 25 * 3600);
    let ledger = sim.control.ledger().await.unwrap();
    let keys: Vec<_> = ledger
        .succeeded_payment_intents()
        .map(|intent| intent.idempotency_key.as_deref())
        .collect();
    assert_eq!(keys, [Some("key-p"), Some("key-p")]);
}

#[tokio::test]
async fn a_request_rejected_by_validation_saves_nothing_under_its_key() {
    let sim = Sim::start().await;
    let invalid = CreatePaymentIntent::new(0, Currency::USD);
    let (error, status) = api_error(
        create_keyed(&sim.stripe, &invalid, "key-v")
            .await
            .unwrap_err(),
    );
    assert_eq!((status, error.param.as_deref()), (400, Some("amount")));
    let created = create_keyed(&sim.stripe, &charge(100, "pm_card_visa", "v1"), "key-v")
        .await
        .expect("key is unused");
    assert_eq!(created.amount, 100);
}

#[tokio::test]
async fn keys_are_scoped_per_secret_key() {
    let config = SimulatorConfig {
        api_keys: vec![API_KEY.to_owned(), "sk_test_other".to_owned()],
        ..SimulatorConfig::default()
    };
    let sim = Sim::start_with(config).await;
    let other = client(&sim.handle.base_url(), "sk_test_other");
    let request = charge(100, "pm_card_visa", "s1");
    let mine = create_keyed(&sim.stripe, &request, "shared-key")
        .await
        .unwrap();
    let theirs = create_keyed(&other, &request, "shared-key").await.unwrap();
    assert_ne!(mine.id, theirs.id);
}
