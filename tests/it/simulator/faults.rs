use std::time::Duration;

use chargeguard::simulator::{Endpoint, FaultKind, FaultSpec, FaultTarget, SimulatorConfig};
use stripe::StripeError;
use stripe_core::payment_intent::ListPaymentIntent;

use super::{API_KEY, Sim, charge, create_keyed, status_of};

/// One answer to a create sent by hand, so that its headers and exact bytes can be compared.
#[derive(Debug, PartialEq)]
struct RawAnswer {
    status: u16,
    /// The `Idempotent-Replayed` header, if any.
    replayed: Option<String>,
    body: bytes::Bytes,
}

const RAW_CREATE: &str =
    "amount=1000&currency=usd&confirm=true&payment_method=pm_card_visa&metadata%5Battempt%5D=s1";

async fn raw_create(sim: &Sim, key: &str) -> RawAnswer {
    let answer = reqwest::Client::new()
        .post(format!("{}v1/payment_intents", sim.handle.base_url()))
        .bearer_auth(API_KEY)
        .header("Idempotency-Key", key)
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(RAW_CREATE)
        .send()
        .await
        .unwrap();
    RawAnswer {
        status: answer.status().as_u16(),
        replayed: answer
            .headers()
            .get("idempotent-replayed")
            .map(|value| value.to_str().unwrap().to_owned()),
        body: answer.bytes().await.unwrap(),
    }
}

/// Sends the create twice with one key: the first answer is a 500 without the replay header,
/// the second the identical 500 with it (and so is a third, through async-stripe). Returns the
/// request log's (fault, replayed, status) of the three.
async fn first_500_is_saved_and_replayed(
    sim: &Sim,
    fault: FaultKind,
    key: &str,
) -> Vec<(Option<String>, bool, Option<u16>)> {
    sim.control
        .set_fault(Endpoint::CreatePaymentIntent, FaultSpec::next(fault, 1))
        .await
        .unwrap();
    let first = raw_create(sim, key).await;
    assert_eq!(first.status, 500, "{first:?}");
    assert_eq!(first.replayed, None, "a first answer is not a replay");
    let second = raw_create(sim, key).await;
    assert_eq!(
        second,
        RawAnswer {
            replayed: Some("true".to_owned()),
            ..first
        }
    );
    let request = charge(1_000, "pm_card_visa", "s1");
    assert_eq!(
        status_of(&create_keyed(&sim.stripe, &request, key).await.unwrap_err()),
        500
    );
    sim.control
        .requests()
        .await
        .unwrap()
        .into_iter()
        .map(|entry| (entry.fault, entry.replayed, entry.status))
        .collect()
}

#[tokio::test]
async fn fail_saved_saves_a_500_under_the_key_and_creates_nothing() {
    let sim = Sim::start().await;
    let log = first_500_is_saved_and_replayed(&sim, FaultKind::FailSaved, "key-fs").await;
    assert_eq!(
        log,
        [
            (Some("fail_saved".to_owned()), false, Some(500)),
            (None, true, Some(500)),
            (None, true, Some(500)),
        ]
    );
    assert!(
        sim.control
            .ledger()
            .await
            .unwrap()
            .payment_intents
            .is_empty()
    );
    // Another key is not affected.
    create_keyed(
        &sim.stripe,
        &charge(1_000, "pm_card_visa", "s1"),
        "key-fs-2",
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn apply_then_fail_saved_creates_the_object_and_saves_a_500_under_the_key() {
    let sim = Sim::start().await;
    let log = first_500_is_saved_and_replayed(&sim, FaultKind::ApplyThenFailSaved, "key-afs").await;
    assert_eq!(
        log,
        [
            (Some("apply_then_fail_saved".to_owned()), false, Some(500)),
            (None, true, Some(500)),
            (None, true, Some(500)),
        ]
    );
    let ledger = sim.control.ledger().await.unwrap();
    assert_eq!(ledger.succeeded_payment_intents().count(), 1);
    assert_eq!(
        ledger.payment_intents[0].idempotency_key.as_deref(),
        Some("key-afs")
    );
}

#[tokio::test]
async fn a_client_that_goes_away_still_leaves_its_create_in_the_request_log() {
    let sim = Sim::start().await;
    sim.control
        .set_fault(
            Endpoint::CreatePaymentIntent,
            FaultSpec::next(FaultKind::Latency(3_000), 1),
        )
        .await
        .unwrap();
    // Gone after a second (time to connect and be admitted on a slow machine), while the create
    // is held three.
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let gone = impatient
        .post(format!("{}v1/payment_intents", sim.handle.base_url()))
        .bearer_auth(API_KEY)
        .header("Idempotency-Key", "key-gone")
        .body(RAW_CREATE)
        .send()
        .await
        .unwrap_err();
    assert!(gone.is_timeout(), "{gone:?}");
    // The execution carries on without the client; wait (bounded) for its object.
    for _ in 0..1_500 {
        if !sim
            .control
            .ledger()
            .await
            .unwrap()
            .payment_intents
            .is_empty()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ledger = sim.control.ledger().await.unwrap();
    assert_eq!(ledger.payment_intents.len(), 1, "the create executed");
    let requests = sim.control.requests().await.unwrap();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(requests[0].idempotency_key.as_deref(), Some("key-gone"));
    assert_eq!(
        requests[0].endpoint.as_deref(),
        Some("create_payment_intent")
    );
    assert_eq!(requests[0].fault.as_deref(), Some("latency"));
    assert_eq!(requests[0].status, None, "no answer was sent");
}

#[tokio::test]
async fn fail_before_apply_applies_and_saves_nothing() {
    let sim = Sim::start().await;
    sim.control
        .set_fault(
            Endpoint::CreatePaymentIntent,
            FaultSpec::next(FaultKind::FailBeforeApply, 1),
        )
        .await
        .unwrap();
    let request = charge(1_000, "pm_card_visa", "f1");
    assert_eq!(
        status_of(
            &create_keyed(&sim.stripe, &request, "key-f")
                .await
                .unwrap_err()
        ),
        500
    );
    assert!(
        sim.control
            .ledger()
            .await
            .unwrap()
            .payment_intents
            .is_empty()
    );
    // Nothing was saved under the key: the retry executes.
    create_keyed(&sim.stripe, &request, "key-f").await.unwrap();
    let requests = sim.control.requests().await.unwrap();
    assert_eq!(requests[0].fault.as_deref(), Some("fail_before_apply"));
    assert_eq!(requests[0].status, Some(500));
    assert!(!requests[1].replayed);
    assert_eq!(sim.control.ledger().await.unwrap().payment_intents.len(), 1);
}

#[tokio::test]
async fn apply_then_fail_applies_saves_and_answers_500() {
    let sim = Sim::start().await;
    sim.control
        .set_fault(
            Endpoint::CreatePaymentIntent,
            FaultSpec::next(FaultKind::ApplyThenFail, 1),
        )
        .await
        .unwrap();
    let request = charge(1_000, "pm_card_visa", "f2");
    assert_eq!(
        status_of(
            &create_keyed(&sim.stripe, &request, "key-f2")
                .await
                .unwrap_err()
        ),
        500
    );
    let ledger = sim.control.ledger().await.unwrap();
    assert_eq!(ledger.succeeded_payment_intents().count(), 1);
    let retried = create_keyed(&sim.stripe, &request, "key-f2").await.unwrap();
    assert_eq!(retried.id.as_str(), ledger.payment_intents[0].id);
    assert!(sim.control.requests().await.unwrap()[1].replayed);
    assert_eq!(sim.control.ledger().await.unwrap().payment_intents.len(), 1);
}

#[tokio::test]
async fn apply_then_drop_applies_saves_and_sends_no_response() {
    let sim = Sim::start().await;
    sim.control
        .set_fault(
            Endpoint::CreatePaymentIntent,
            FaultSpec::next(FaultKind::ApplyThenDrop, 1),
        )
        .await
        .unwrap();
    let request = charge(1_000, "pm_card_visa", "f3");
    match create_keyed(&sim.stripe, &request, "key-f3").await {
        Err(StripeError::ClientError(_)) => {}
        other => panic!("expected a connection error, got {other:?}"),
    }
    let ledger = sim.control.ledger().await.unwrap();
    assert_eq!(ledger.succeeded_payment_intents().count(), 1);
    assert_eq!(sim.control.requests().await.unwrap()[0].status, None);
    let retried = create_keyed(&sim.stripe, &request, "key-f3").await.unwrap();
    assert_eq!(retried.id.as_str(), ledger.payment_intents[0].id);
    assert_eq!(sim.control.ledger().await.unwrap().payment_intents.len(), 1);
}

#[tokio::test]
async fn wildcard_faults_hit_every_endpoint_and_expire_after_their_count() {
    let sim = Sim::start().await;
    sim.control
        .set_fault(
            FaultTarget::All,
            FaultSpec::next(FaultKind::FailBeforeApply, 2),
        )
        .await
        .unwrap();
    assert_eq!(
        status_of(
            &ListPaymentIntent::new()
                .send(&sim.stripe)
                .await
                .unwrap_err()
        ),
        500
    );
    assert_eq!(
        sim.control.faults().await.unwrap(),
        [(
            FaultTarget::All,
            FaultSpec::next(FaultKind::FailBeforeApply, 1)
        )]
    );
    assert_eq!(
        status_of(
            &create_keyed(&sim.stripe, &charge(5, "pm_card_visa", "w"), "w")
                .await
                .unwrap_err()
        ),
        500
    );
    ListPaymentIntent::new()
        .send(&sim.stripe)
        .await
        .expect("the fault is used up");
    sim.control
        .set_fault(
            FaultTarget::All,
            FaultSpec::next(FaultKind::FailBeforeApply, 9),
        )
        .await
        .unwrap();
    sim.control.clear_faults().await.unwrap();
    ListPaymentIntent::new()
        .send(&sim.stripe)
        .await
        .expect("faults cleared");
}

#[tokio::test]
async fn probabilistic_faults_repeat_exactly_with_the_seed() {
    async fn outcomes(seed: u64) -> Vec<bool> {
        let sim = Sim::start_with(SimulatorConfig {
            seed,
            ..SimulatorConfig::default()
        })
        .await;
        sim.control
            .set_fault(
                Endpoint::ListPaymentIntents,
                FaultSpec::probability(FaultKind::FailBeforeApply, 0.5),
            )
            .await
            .unwrap();
        let mut outcomes = Vec::new();
        for _ in 0..24 {
            outcomes.push(ListPaymentIntent::new().send(&sim.stripe).await.is_ok());
        }
        outcomes
    }
    let first = outcomes(42).await;
    assert_eq!(first, outcomes(42).await);
    assert!(first.contains(&true) && first.contains(&false), "{first:?}");
}
