use std::time::Duration;

use chargeguard::simulator::{
    AuthenticationOutcome, Confirmation, ForcePaymentIntent, SeedPaymentIntent,
};
use stripe::{ApiErrorsCode, ApiErrorsType, StripeRequest as _};
use stripe_core::payment_intent::{
    CancelPaymentIntent, ConfirmPaymentIntent, CreatePaymentIntent, RetrievePaymentIntent,
};
use stripe_core::{PaymentIntent, PaymentIntentStatus};
use stripe_core::refund::{CreateRefund, ListRefund, RetrieveRefund};
use stripe_types::{Currency, Expandable};

use super::{Sim, api_error, charge, create_keyed, idempotent, refund_keyed};

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
    // 55 s, not 59: the sim clock counts whole wall seconds too, so a second boundary crossed
    // while the test runs would already settle at 59 (it did, in a slow CI run).
    sim.control
        .advance_clock(Duration::from_secs(55))
        .await
        .unwrap();
    let still = RetrievePaymentIntent::new(succeeds.id.clone())
        .send(&sim.stripe)
        .await
        .unwrap();
    assert_eq!(still.status, PaymentIntentStatus::Processing);
    sim.control
        .advance_clock(Duration::from_secs(6))
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
    let types = event_types(&sim).await;
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

/// The types of every event the simulator emitted, in order.
async fn event_types(sim: &Sim) -> Vec<String> {
    sim.control
        .events()
        .await
        .unwrap()
        .into_iter()
        .map(|event| event.event_type)
        .collect()
}

async fn confirm_keyed(
    sim: &Sim,
    request: &ConfirmPaymentIntent,
    key: &str,
) -> Result<PaymentIntent, stripe::StripeError> {
    request
        .customize()
        .request_strategy(idempotent(key))
        .send(&sim.stripe)
        .await
}

#[tokio::test]
async fn a_declined_intent_is_confirmed_again_with_another_card_and_succeeds_once() {
    let sim = Sim::start().await;
    let (declined, status) = api_error(
        charge(2_000, "pm_card_chargeDeclined", "c1")
            .send(&sim.stripe)
            .await
            .unwrap_err(),
    );
    assert_eq!(status, 402);
    let intent = declined.payment_intent.expect("a decline carries its intent").id;

    // Declined again: the intent goes back to requires_payment_method with the new error.
    let (again, status) = api_error(
        confirm_keyed(
            &sim,
            &ConfirmPaymentIntent::new(intent.clone())
                .payment_method("pm_card_chargeDeclinedInsufficientFunds"),
            "confirm-1",
        )
        .await
        .unwrap_err(),
    );
    assert_eq!((status, again.type_), (402, ApiErrorsType::CardError));
    assert_eq!(again.decline_code.as_deref(), Some("insufficient_funds"));
    let waiting = RetrievePaymentIntent::new(intent.clone())
        .send(&sim.stripe)
        .await
        .unwrap();
    assert_eq!(waiting.status, PaymentIntentStatus::RequiresPaymentMethod);
    assert_eq!(
        waiting.last_payment_error.unwrap().decline_code.as_deref(),
        Some("insufficient_funds")
    );

    let visa = ConfirmPaymentIntent::new(intent.clone()).payment_method("pm_card_visa");
    let paid = confirm_keyed(&sim, &visa, "confirm-2").await.unwrap();
    assert_eq!(
        (paid.status.clone(), paid.amount_received),
        (PaymentIntentStatus::Succeeded, 2_000)
    );
    assert!(paid.last_payment_error.is_none());

    // Replays by key: the success, and the earlier decline exactly as it was answered.
    let replayed = confirm_keyed(&sim, &visa, "confirm-2").await.unwrap();
    assert_eq!(format!("{replayed:?}"), format!("{paid:?}"));
    let (old_decline, status) = api_error(
        confirm_keyed(
            &sim,
            &ConfirmPaymentIntent::new(intent.clone())
                .payment_method("pm_card_chargeDeclinedInsufficientFunds"),
            "confirm-1",
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(
        (status, old_decline.decline_code.as_deref()),
        (402, Some("insufficient_funds"))
    );
    let (mismatch, status) = api_error(
        confirm_keyed(
            &sim,
            &ConfirmPaymentIntent::new(intent.clone()).payment_method("pm_card_mastercard"),
            "confirm-2",
        )
        .await
        .unwrap_err(),
    );
    assert_eq!((status, mismatch.type_), (400, ApiErrorsType::IdempotencyError));

    // A PaymentIntent succeeds at most once.
    let (refused, status) = api_error(
        ConfirmPaymentIntent::new(intent.clone())
            .payment_method("pm_card_visa")
            .send(&sim.stripe)
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (status, refused.type_, refused.code),
        (
            400,
            ApiErrorsType::InvalidRequestError,
            Some(ApiErrorsCode::PaymentIntentUnexpectedState)
        )
    );
    assert!(refused.message.as_deref().unwrap().contains("status of succeeded"));

    let ledger = sim.control.ledger().await.unwrap();
    assert_eq!(ledger.payment_intents.len(), 1, "confirms create nothing");
    let entry = &ledger.payment_intents[0];
    assert_eq!((entry.status.as_str(), entry.amount_received), ("succeeded", 2_000));
    let confirmations: Vec<(Option<&str>, &str, &str)> = entry
        .confirmations
        .iter()
        .map(|Confirmation { idempotency_key, payment_method, status, .. }| {
            (idempotency_key.as_deref(), payment_method.as_str(), status.as_str())
        })
        .collect();
    assert_eq!(
        confirmations,
        [
            (None, "pm_card_chargeDeclined", "requires_payment_method"),
            (
                Some("confirm-1"),
                "pm_card_chargeDeclinedInsufficientFunds",
                "requires_payment_method"
            ),
            (Some("confirm-2"), "pm_card_visa", "succeeded"),
        ]
    );
    assert_eq!(entry.confirmations_total, 3);

    let confirms: Vec<(Option<String>, bool, Option<u16>)> = sim
        .control
        .requests()
        .await
        .unwrap()
        .into_iter()
        .filter(|request| request.endpoint.as_deref() == Some("confirm_payment_intent"))
        .map(|request| (request.idempotency_key, request.replayed, request.status))
        .collect();
    let key = |key: &str| Some(key.to_owned());
    assert_eq!(
        confirms,
        [
            (key("confirm-1"), false, Some(402)),
            (key("confirm-2"), false, Some(200)),
            (key("confirm-2"), true, Some(200)),
            (key("confirm-1"), true, Some(402)),
            (key("confirm-2"), false, Some(400)),
            (None, false, Some(400)),
        ]
    );
    let events = event_types(&sim).await;
    assert_eq!(
        events,
        [
            "payment_intent.payment_failed",
            "payment_intent.payment_failed",
            "payment_intent.succeeded"
        ],
        "one event per confirmation that ran, none for replays or refusals"
    );
}

#[tokio::test]
async fn confirm_follows_the_payment_method_and_refuses_what_stripe_refuses() {
    let sim = Sim::start().await;
    // Created with a payment method and not confirmed: confirm uses the intent's own.
    let unconfirmed = CreatePaymentIntent::new(700, Currency::USD)
        .payment_method("pm_card_visa")
        .send(&sim.stripe)
        .await
        .unwrap();
    assert_eq!(unconfirmed.status, PaymentIntentStatus::RequiresConfirmation);
    let paid = ConfirmPaymentIntent::new(unconfirmed.id.clone())
        .send(&sim.stripe)
        .await
        .unwrap();
    assert_eq!(paid.status, PaymentIntentStatus::Succeeded);

    // A 3-D Secure card asks for the customer, with the return_url of the confirm.
    let bare = CreatePaymentIntent::new(700, Currency::USD)
        .send(&sim.stripe)
        .await
        .unwrap();
    let (missing, status) = api_error(
        ConfirmPaymentIntent::new(bare.id.clone())
            .send(&sim.stripe)
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (status, missing.code, missing.param.as_deref()),
        (400, Some(ApiErrorsCode::ParameterMissing), Some("payment_method"))
    );
    let (unknown, status) = api_error(
        ConfirmPaymentIntent::new(bare.id.clone())
            .payment_method("pm_card_bogus")
            .send(&sim.stripe)
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (status, unknown.code),
        (400, Some(ApiErrorsCode::ResourceMissing))
    );
    let action = ConfirmPaymentIntent::new(bare.id.clone())
        .payment_method("pm_card_threeDSecure2Required")
        .return_url("https://shop.example/back")
        .send(&sim.stripe)
        .await
        .unwrap();
    assert_eq!(action.status, PaymentIntentStatus::RequiresAction);
    let redirect = action.next_action.unwrap().redirect_to_url.unwrap();
    assert_eq!(redirect.return_url.as_deref(), Some("https://shop.example/back"));
    let (busy, status) = api_error(
        ConfirmPaymentIntent::new(bare.id.clone())
            .payment_method("pm_card_visa")
            .send(&sim.stripe)
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (status, busy.code),
        (400, Some(ApiErrorsCode::PaymentIntentUnexpectedState))
    );
    assert!(busy.message.as_deref().unwrap().contains("status of requires_action"));

    let canceled = CreatePaymentIntent::new(700, Currency::USD)
        .send(&sim.stripe)
        .await
        .unwrap();
    CancelPaymentIntent::new(canceled.id.clone())
        .send(&sim.stripe)
        .await
        .unwrap();
    let (refused, _) = api_error(
        ConfirmPaymentIntent::new(canceled.id.clone())
            .payment_method("pm_card_visa")
            .send(&sim.stripe)
            .await
            .unwrap_err(),
    );
    assert!(refused.message.as_deref().unwrap().contains("status of canceled"));

    let (absent, status) = api_error(
        ConfirmPaymentIntent::new("pi_missing")
            .payment_method("pm_card_visa")
            .send(&sim.stripe)
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (status, absent.code),
        (404, Some(ApiErrorsCode::ResourceMissing))
    );
    let events = event_types(&sim).await;
    assert_eq!(
        events,
        [
            "payment_intent.succeeded",
            "payment_intent.requires_action",
            "payment_intent.canceled"
        ]
    );
}
