//! Refunds as Stripe runs them: partial and several per charge, Stripe's refusals, idempotency,
//! pending refunds, and refunds that fail after they succeeded.

use std::time::Duration;

use chargeguard::simulator::RefundMode;
use stripe::{ApiErrorsCode, ApiErrorsType};
use stripe_core::refund::{CreateRefund, ListRefund, RetrieveRefund};
use stripe_core::{PaymentIntent, Refund};

use super::{Sim, api_error, charge, refund_keyed};

async fn paid(sim: &Sim, amount: i64, payment_method: &str) -> PaymentIntent {
    charge(amount, payment_method, "refunds").send(&sim.stripe).await.unwrap()
}

async fn refund(sim: &Sim, intent: &PaymentIntent, amount: Option<i64>) -> Result<Refund, stripe::StripeError> {
    let mut request = CreateRefund::new().payment_intent(intent.id.as_str());
    if let Some(amount) = amount {
        request = request.amount(amount);
    }
    request.send(&sim.stripe).await
}

async fn retrieved(sim: &Sim, id: &str) -> Refund {
    RetrieveRefund::new(id).send(&sim.stripe).await.unwrap()
}

/// `amount_refunded` of the intent in the ledger.
async fn amount_refunded(sim: &Sim, intent: &PaymentIntent) -> i64 {
    let ledger = sim.control.ledger().await.unwrap();
    ledger.payment_intents.iter().find(|entry| entry.id == intent.id.as_str()).unwrap().amount_refunded
}

/// The event types emitted since `from` (an index into the event log).
async fn events_since(sim: &Sim, from: usize) -> Vec<(String, String)> {
    let events = sim.control.events().await.unwrap();
    events.into_iter().skip(from).map(|event| (event.event_type, event.object_id)).collect()
}

#[tokio::test]
async fn partial_refunds_add_up_and_an_over_refund_is_refused_in_stripes_words() {
    let sim = Sim::start().await;
    let intent = paid(&sim, 1_000, "pm_card_visa").await;
    let first = refund(&sim, &intent, Some(250)).await.unwrap();
    let second = refund(&sim, &intent, Some(49)).await.unwrap();
    assert_ne!(first.id, second.id);
    assert_eq!((first.status.as_deref(), second.status.as_deref()), (Some("succeeded"), Some("succeeded")));

    let (over, status) = api_error(refund(&sim, &intent, Some(702)).await.unwrap_err());
    assert_eq!((status, over.type_, over.param.as_deref()), (400, ApiErrorsType::InvalidRequestError, Some("amount")));
    assert_eq!(over.code, Some(ApiErrorsCode::AmountTooLarge));
    assert_eq!(
        over.message.as_deref(),
        Some("Refund amount ($7.02) is greater than unrefunded amount on charge ($7.01)")
    );
    assert_eq!(amount_refunded(&sim, &intent).await, 299, "a refused refund moves nothing");

    let rest = refund(&sim, &intent, None).await.unwrap();
    assert_eq!(rest.amount, 701, "no amount: what is left");
    let (done, status) = api_error(refund(&sim, &intent, Some(1)).await.unwrap_err());
    assert_eq!((status, done.code.clone()), (400, Some(ApiErrorsCode::ChargeAlreadyRefunded)));
    assert!(done.message.as_deref().unwrap().contains("has already been refunded"), "{done:?}");

    let ledger = sim.control.ledger().await.unwrap();
    assert_eq!(ledger.refunds_of(intent.id.as_str()).count(), 3);
    assert_eq!(ledger.refunded_minor(intent.id.as_str()), 1_000);
}

#[tokio::test]
async fn an_intent_without_a_successful_charge_cannot_be_refunded() {
    let sim = Sim::start().await;
    let (declined, _) = api_error(charge(500, "pm_card_chargeDeclined", "d").send(&sim.stripe).await.unwrap_err());
    let declined = declined.payment_intent.unwrap();
    let action = paid(&sim, 500, "pm_card_authenticationRequired").await;
    for intent in [&declined, &action] {
        let (error, status) = api_error(refund(&sim, intent, None).await.unwrap_err());
        assert_eq!((status, error.type_, error.param.as_deref()), (400, ApiErrorsType::InvalidRequestError, Some("payment_intent")));
        assert_eq!(
            error.message.as_deref().unwrap(),
            format!("This PaymentIntent ({}) does not have a successful charge to refund.", intent.id)
        );
    }
    let (missing, status) = api_error(
        CreateRefund::new().payment_intent("pi_missing").send(&sim.stripe).await.unwrap_err(),
    );
    assert_eq!((status, missing.code), (400, Some(ApiErrorsCode::ResourceMissing)));
    assert!(sim.control.ledger().await.unwrap().refunds.is_empty());
}

#[tokio::test]
async fn a_refund_key_replays_its_refund_and_refuses_other_parameters() {
    let sim = Sim::start().await;
    let intent = paid(&sim, 1_000, "pm_card_visa").await;
    let request = CreateRefund::new().payment_intent(intent.id.as_str()).amount(300);
    let first = refund_keyed(&sim.stripe, &request, "refund-key").await.unwrap();
    let replayed = refund_keyed(&sim.stripe, &request, "refund-key").await.unwrap();
    assert_eq!(format!("{replayed:?}"), format!("{first:?}"));

    let other = CreateRefund::new().payment_intent(intent.id.as_str()).amount(301);
    let (conflict, status) = api_error(refund_keyed(&sim.stripe, &other, "refund-key").await.unwrap_err());
    assert_eq!((status, conflict.type_), (400, ApiErrorsType::IdempotencyError));

    // A refusal is saved under its key too: once executed, the key answers the same forever.
    let over = CreateRefund::new().payment_intent(intent.id.as_str()).amount(800);
    for _ in 0..2 {
        let (error, _) = api_error(refund_keyed(&sim.stripe, &over, "over-key").await.unwrap_err());
        assert_eq!(error.code, Some(ApiErrorsCode::AmountTooLarge));
    }
    let requests = sim.control.requests().await.unwrap();
    let replays: Vec<(Option<&str>, bool)> = requests
        .iter()
        .filter(|request| request.endpoint.as_deref() == Some("create_refund"))
        .map(|request| (request.idempotency_key.as_deref(), request.replayed))
        .collect();
    assert_eq!(
        replays,
        [
            (Some("refund-key"), false),
            (Some("refund-key"), true),
            (Some("refund-key"), false),
            (Some("over-key"), false),
            (Some("over-key"), true),
        ]
    );
    let ledger = sim.control.ledger().await.unwrap();
    assert_eq!(ledger.refunds.len(), 1);
    assert_eq!(ledger.refunded_minor(intent.id.as_str()), 300);
}

#[tokio::test]
async fn a_refund_that_fails_after_it_succeeded_gives_the_amount_back() {
    let sim = Sim::start().await;
    let intent = paid(&sim, 1_000, "pm_card_visa").await;
    let kept = refund(&sim, &intent, Some(400)).await.unwrap();
    let failing = refund(&sim, &intent, None).await.unwrap();
    assert_eq!(amount_refunded(&sim, &intent).await, 1_000);
    let before = sim.control.events().await.unwrap().len();

    let failed = sim.control.fail_refund(failing.id.as_str(), Some("lost_or_stolen_card")).await.unwrap();
    assert_eq!((failed["status"].as_str(), failed["failure_reason"].as_str()), (Some("failed"), Some("lost_or_stolen_card")));
    let seen = retrieved(&sim, failing.id.as_str()).await;
    assert_eq!((seen.status.as_deref(), seen.failure_reason.as_deref()), (Some("failed"), Some("lost_or_stolen_card")));
    assert_eq!(amount_refunded(&sim, &intent).await, 400, "the failed amount is refundable again");
    let id = failing.id.to_string();
    assert_eq!(
        events_since(&sim, before).await,
        [
            ("refund.updated".to_owned(), id.clone()),
            ("refund.failed".to_owned(), id.clone()),
            ("charge.refund.updated".to_owned(), id.clone()),
        ]
    );
    assert!(sim.control.fail_refund(&id, None).await.unwrap_err().to_string().contains("already failed"));

    let ledger = sim.control.ledger().await.unwrap();
    let entry = ledger.refunds.iter().find(|refund| refund.id == id).unwrap();
    assert_eq!((entry.status.as_str(), entry.failure_reason.as_deref()), ("failed", Some("lost_or_stolen_card")));
    assert_eq!(ledger.refunded_minor(intent.id.as_str()), 400);

    // The money is back on the charge: it can be refunded again.
    let again = refund(&sim, &intent, None).await.unwrap();
    assert_eq!(again.amount, 600);
    let default = sim.control.fail_refund(kept.id.as_str(), None).await.unwrap();
    assert_eq!(default["failure_reason"], "expired_or_canceled_card");
    assert_eq!(sim.control.ledger().await.unwrap().refunded_minor(intent.id.as_str()), 600);
    assert!(sim.control.fail_refund("re_missing", None).await.is_err());
}

#[tokio::test]
async fn refunds_of_pm_card_refund_fail_fail_once_the_settlement_delay_passed() {
    let sim = Sim::start().await;
    let intent = paid(&sim, 900, "pm_card_refundFail").await;
    let created = refund(&sim, &intent, Some(500)).await.unwrap();
    assert_eq!(created.status.as_deref(), Some("succeeded"), "it starts succeeded, as at Stripe");
    // 55 s, not 59: the sim clock also moves with real time while the test runs.
    sim.control.advance_clock(Duration::from_secs(55)).await.unwrap();
    assert_eq!(retrieved(&sim, created.id.as_str()).await.status.as_deref(), Some("succeeded"));
    sim.control.advance_clock(Duration::from_secs(5)).await.unwrap();
    let failed = retrieved(&sim, created.id.as_str()).await;
    assert_eq!((failed.status.as_deref(), failed.failure_reason.as_deref()), (Some("failed"), Some("expired_or_canceled_card")));
    assert_eq!(amount_refunded(&sim, &intent).await, 0);
    let types: Vec<String> = events_since(&sim, 0).await.into_iter().map(|(event_type, _)| event_type).collect();
    assert_eq!(
        types,
        ["payment_intent.succeeded", "refund.created", "charge.refunded", "refund.updated", "refund.failed", "charge.refund.updated"]
    );
    // Cards that refund normally are untouched by the clock.
    let visa = paid(&sim, 900, "pm_card_visa").await;
    let kept = refund(&sim, &visa, None).await.unwrap();
    sim.control.advance_clock(Duration::from_secs(3_600)).await.unwrap();
    assert_eq!(retrieved(&sim, kept.id.as_str()).await.status.as_deref(), Some("succeeded"));
}

#[tokio::test]
async fn pending_refunds_hold_their_amount_until_they_settle() {
    let sim = Sim::start().await;
    let intent = paid(&sim, 1_000, "pm_card_visa").await;
    sim.control.set_refund_mode(RefundMode::Pending).await.unwrap();
    let pending = refund(&sim, &intent, Some(700)).await.unwrap();
    assert_eq!(pending.status.as_deref(), Some("pending"));
    let (over, _) = api_error(refund(&sim, &intent, Some(301)).await.unwrap_err());
    assert_eq!(over.code, Some(ApiErrorsCode::AmountTooLarge), "a pending refund counts against the charge");
    assert_eq!(sim.control.ledger().await.unwrap().refunded_minor(intent.id.as_str()), 0, "nothing returned yet");
    let before = sim.control.events().await.unwrap().len();

    let settled = sim.control.settle_refund(pending.id.as_str()).await.unwrap();
    assert_eq!(settled["status"], "succeeded");
    assert_eq!(retrieved(&sim, pending.id.as_str()).await.status.as_deref(), Some("succeeded"));
    let events = events_since(&sim, before).await;
    assert_eq!(events[0], ("refund.updated".to_owned(), pending.id.to_string()));
    assert_eq!(events[1].0, "charge.refunded");
    assert_eq!(events.len(), 2);
    assert!(sim.control.settle_refund(pending.id.as_str()).await.unwrap_err().to_string().contains("not pending"));
    assert_eq!(sim.control.ledger().await.unwrap().refunded_minor(intent.id.as_str()), 700);

    // A pending refund that fails instead gives its amount back, as a succeeded one does.
    let second = refund(&sim, &intent, Some(300)).await.unwrap();
    sim.control.fail_refund(second.id.as_str(), None).await.unwrap();
    assert_eq!(amount_refunded(&sim, &intent).await, 700);
    sim.control.set_refund_mode(RefundMode::Succeeded).await.unwrap();
    assert_eq!(refund(&sim, &intent, None).await.unwrap().status.as_deref(), Some("succeeded"));
}

#[tokio::test]
async fn a_payment_intents_refunds_list_newest_first_in_pages() {
    let sim = Sim::start().await;
    let intent = paid(&sim, 1_000, "pm_card_visa").await;
    let other = paid(&sim, 1_000, "pm_card_visa").await;
    let mut created = Vec::new();
    for _ in 0..5 {
        created.push(refund(&sim, &intent, Some(100)).await.unwrap().id.to_string());
        refund(&sim, &other, Some(100)).await.unwrap();
    }
    created.reverse();
    let mut listed = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut list = ListRefund::new().payment_intent(intent.id.as_str()).limit(2);
        if let Some(after) = &cursor {
            list = list.starting_after(after.as_str());
        }
        let page = list.send(&sim.stripe).await.unwrap();
        pages += 1;
        assert!(page.data.len() <= 2);
        listed.extend(page.data.iter().map(|refund| refund.id.to_string()));
        if !page.has_more {
            break;
        }
        cursor = page.data.last().map(|refund| refund.id.to_string());
        assert!(pages < 10, "paging does not end");
    }
    assert_eq!(listed, created, "only this intent's refunds, newest first");
    assert_eq!(pages, 3);
}
