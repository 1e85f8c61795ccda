use std::time::Duration;

use chargeguard::simulator::{AuthenticationOutcome, ForcePaymentIntent, SeedPaymentIntent};
use stripe::ApiErrorsCode;
use stripe_core::PaymentIntentStatus;
use stripe_core::payment_intent::{
    CancelPaymentIntent, CreatePaymentIntent, RetrievePaymentIntent,
};
use stripe_core::refund::{CreateRefund, ListRefund, RetrieveRefund};
use stripe_types::{Currency, Expandable};

use super::{Sim, api_error, charge, create_keyed, refund_keyed};

#[tokio::test]
async fn test_cards_behave_as_documented() {
    let sim = Sim::start().await;
    let visa = charge(1_234, "pm_card_mastercard", "t1")
        .send(&sim.stripe)
        .await
        .unwrap();
    assert_eq!(visa.status, PaymentIntentStatus::Succeeded);
    assert_eq!(visa.amount_received, 1_234);
    assert!(matches!(visa.latest_charge, Some(Expandable::Id(_))));
    assert!(
        visa.client_secret
            .as_deref()
            .unwrap()
            .starts_with(visa.id.as_str())
    );

    let (declined, status) = api_error(
        charge(1_234, "pm_card_chargeDeclined", "t2")
            .send(&sim.stripe)
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (status, declined.code),
        (402, Some(ApiErrorsCode::CardDeclined))
    );
    assert_eq!(declined.decline_code.as_deref(), Some("generic_decline"));

    let (unknown, status) = api_error(
        charge(1_234, "pm_card_bogus", "t3")
            .send(&sim.stripe)
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (status, unknown.code, unknown.param.as_deref()),
        (
            400,
            Some(ApiErrorsCode::ResourceMissing),
            Some("payment_method")
        )
    );

    let action = charge(1_234, "pm_card_authenticationRequired", "t4")
        .send(&sim.stripe)
        .await
        .unwrap();
    assert_eq!(action.status, PaymentIntentStatus::RequiresAction);
    let next = action.next_action.as_ref().unwrap();
    assert_eq!(next.type_, "redirect_to_url");
    assert!(
        next.redirect_to_url
            .as_ref()
            .unwrap()
            .url
            .as_deref()
            .unwrap()
            .contains(action.id.as_str())
    );
    sim.control
        .authenticate(action.id.as_str(), AuthenticationOutcome::Succeed)
        .await
        .unwrap();
    let done = RetrievePaymentIntent::new(action.id.clone())
        .send(&sim.stripe)
        .await
        .unwrap();
    assert_eq!(done.status, PaymentIntentStatus::Succeeded);
    assert!(done.next_action.is_none());

    let failing = charge(1_234, "pm_card_authenticationRequired", "t5")
        .send(&sim.stripe)
        .await
        .unwrap();
    sim.control
        .authenticate(failing.id.as_str(), AuthenticationOutcome::Fail)
        .await
        .unwrap();
    let failed = RetrievePaymentIntent::new(failing.id.clone())
        .send(&sim.stripe)
        .await
        .unwrap();
    assert_eq!(failed.status, PaymentIntentStatus::RequiresPaymentMethod);
    assert!(failed.last_payment_error.is_some());
}

#[tokio::test]
async fn processing_payments_settle_by_the_sim_clock() {
    let sim = Sim::start().await;
    let succeeds = charge(500, "pm_sim_processing_succeeds", "s1")
        .send(&sim.stripe)
        .await
        .unwrap();
    let fails = charge(500, "pm_sim_processing_fails", "s2")
        .send(&sim.stripe)
        .await
        .unwrap();
    assert_eq!(succeeds.status, PaymentIntentStatus::Processing);
    assert_eq!(fails.status, PaymentIntentStatus::Processing);
    sim.control
        .advance_clock(Duration::from_secs(59))
        .await
        .unwrap();
    let still = RetrievePaymentIntent::new(succeeds.id.clone())
        .send(&sim.stripe)
        .await
        .unwrap();
    assert_eq!(still.status, PaymentIntentStatus::Processing);
    sim.control
        .advance_clock(Duration::from_secs(2))
        .await
        .unwrap();
    let settled = RetrievePaymentIntent::new(succeeds.id.clone())
        .send(&sim.stripe)
        .await
        .unwrap();
    assert_eq!(
        (settled.status, settled.amount_received),
        (PaymentIntentStatus::Succeeded, 500)
    );
    let failed = RetrievePaymentIntent::new(fails.id.clone())
        .send(&sim.stripe)
        .await
        .unwrap();
    assert_eq!(failed.status, PaymentIntentStatus::RequiresPaymentMethod);
    let types: Vec<String> = sim
        .control
        .events()
        .await
        .unwrap()
        .into_iter()
        .map(|event| event.event_type)
        .collect();
    assert_eq!(
        types,
        [
            "payment_intent.processing",
            "payment_intent.processing",
            "payment_intent.succeeded",
            "payment_intent.payment_failed"
        ]
    );
}

#[tokio::test]
async fn cancel_works_before_success_only() {
    let sim = Sim::start().await;
    let open = CreatePaymentIntent::new(300, Currency::EUR)
        .send(&sim.stripe)
        .await
        .unwrap();
    assert_eq!(open.status, PaymentIntentStatus::RequiresPaymentMethod);
    let canceled = CancelPaymentIntent::new(open.id.clone())
        .send(&sim.stripe)
        .await
        .unwrap();
    assert_eq!(canceled.status, PaymentIntentStatus::Canceled);
    assert!(canceled.canceled_at.is_some());
    let paid = charge(300, "pm_card_visa", "x")
        .send(&sim.stripe)
        .await
        .unwrap();
    let (error, status) = api_error(
        CancelPaymentIntent::new(paid.id.clone())
            .send(&sim.stripe)
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (status, error.code),
        (400, Some(ApiErrorsCode::PaymentIntentUnexpectedState))
    );
}

#[tokio::test]
async fn refunds_are_bounded_by_what_was_received() {
    let sim = Sim::start().await;
    let paid = charge(1_000, "pm_card_visa", "r1")
        .send(&sim.stripe)
        .await
        .unwrap();
    let partial = CreateRefund::new()
        .payment_intent(paid.id.as_str())
        .amount(300);
    let first = refund_keyed(&sim.stripe, &partial, "refund-1")
        .await
        .unwrap();
    assert_eq!(
        refund_keyed(&sim.stripe, &partial, "refund-1")
            .await
            .unwrap()
            .id,
        first.id
    );
    let (error, status) = api_error(
        CreateRefund::new()
            .payment_intent(paid.id.as_str())
            .amount(701)
            .send(&sim.stripe)
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (status, error.code),
        (400, Some(ApiErrorsCode::AmountTooLarge))
    );
    let rest = CreateRefund::new()
        .payment_intent(paid.id.as_str())
        .send(&sim.stripe)
        .await
        .unwrap();
    assert_eq!(rest.amount, 700);
    let (error, _) = api_error(
        CreateRefund::new()
            .payment_intent(paid.id.as_str())
            .send(&sim.stripe)
            .await
            .unwrap_err(),
    );
    assert_eq!(error.code, Some(ApiErrorsCode::ChargeAlreadyRefunded));
    assert_eq!(
        RetrieveRefund::new(first.id.clone())
            .send(&sim.stripe)
            .await
            .unwrap()
            .amount,
        300
    );
    let listed = ListRefund::new()
        .payment_intent(paid.id.as_str())
        .send(&sim.stripe)
        .await
        .unwrap();
    assert_eq!(listed.data.len(), 2);

    let ledger = sim.control.ledger().await.unwrap();
    assert_eq!(ledger.payment_intents[0].amount_refunded, 1_000);
    let keys: Vec<_> = ledger
        .refunds
        .iter()
        .map(|refund| refund.idempotency_key.as_deref())
        .collect();
    assert_eq!(keys, [Some("refund-1"), None]);
}

#[tokio::test]
async fn control_calls_seed_and_force_discrepancies() {
    let sim = Sim::start().await;
    let seeded = sim
        .control
        .seed_payment_intent(SeedPaymentIntent {
            amount: 4_200,
            currency: "usd".into(),
            status: "succeeded".into(),
            metadata: [("attempt".to_owned(), "ghost".to_owned())].into(),
            created: None,
        })
        .await
        .unwrap();
    assert_eq!(seeded.idempotency_key, None);
    let fetched = RetrievePaymentIntent::new(seeded.id.clone())
        .send(&sim.stripe)
        .await
        .unwrap();
    assert_eq!(
        (fetched.status, fetched.amount_received),
        (PaymentIntentStatus::Succeeded, 4_200)
    );

    let paid = create_keyed(&sim.stripe, &charge(100, "pm_card_visa", "f"), "force-key")
        .await
        .unwrap();
    let force = ForcePaymentIntent {
        amount: Some(999),
        status: Some("canceled".into()),
    };
    sim.control
        .force_payment_intent(paid.id.as_str(), force)
        .await
        .unwrap();
    let forced = RetrievePaymentIntent::new(paid.id.clone())
        .send(&sim.stripe)
        .await
        .unwrap();
    assert_eq!(
        (forced.status, forced.amount),
        (PaymentIntentStatus::Canceled, 999)
    );
    assert!(
        sim.control
            .force_payment_intent("pi_missing", ForcePaymentIntent::default())
            .await
            .is_err()
    );
}
