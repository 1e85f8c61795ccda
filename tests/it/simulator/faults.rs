use chargeguard::simulator::{Endpoint, FaultKind, FaultSpec, FaultTarget, SimulatorConfig};
use stripe::StripeError;
use stripe_core::payment_intent::ListPaymentIntent;

use super::{Sim, charge, create_keyed, status_of};

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
