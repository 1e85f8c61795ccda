//! Refunds (issue 15) through the real gRPC server, a real database and the simulator, counted
//! at the provider (its ledger and request log): at most one provider refund per refund
//! operation, and a charge's refunds never add up to more than was charged. Every test runs on
//! both stores: `refunds::postgres::…` and `refunds::sqlite::…`.

use chargeguard::grpc::proto::{self, AttemptKind, AttemptStatus, ChargeOutcome, GetAttemptRequest, ListAttemptsRequest, get_attempt_request::Selector};
use tonic::Code;

use crate::support::{BILLING_TOKEN, Backend, ORDERS_TOKEN, TestApp, authed, charge_request, error_code, on_both_backends, refund_request};

fn outcome(response: &proto::RefundResponse) -> ChargeOutcome {
    ChargeOutcome::try_from(response.outcome).unwrap()
}

fn status(response: &proto::RefundResponse) -> AttemptStatus {
    AttemptStatus::try_from(response.attempt.as_ref().unwrap().status).unwrap()
}

/// A succeeded charge of 1000 usd minor units for `operation_key`.
async fn charged(app: &TestApp, operation_key: &str) -> proto::Attempt {
    let response = app.charge(charge_request(operation_key)).await.unwrap();
    let attempt = response.attempt.unwrap();
    assert_eq!(AttemptStatus::try_from(attempt.status).unwrap(), AttemptStatus::Succeeded);
    attempt
}

/// What the provider holds for one payment: (refunds, sum of their amounts whatever their status).
async fn refunds_at_provider(app: &TestApp, payment_id: &str) -> (usize, i64) {
    let ledger = app.sim().ledger().await.unwrap();
    let refunds: Vec<_> = ledger.refunds_of(payment_id).collect();
    (refunds.len(), refunds.iter().map(|refund| refund.amount).sum())
}

async fn a_full_refund_is_applied_once_with_its_own_key_and_metadata(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    let charge = charged(&app, "order-1:charge").await;
    let response = app.refund(refund_request("order-1:refund-1", "order-1:charge", None)).await.unwrap();
    assert_eq!(outcome(&response), ChargeOutcome::Applied);
    assert_eq!(status(&response), AttemptStatus::Succeeded);
    let refund = response.attempt.unwrap();
    assert_eq!(AttemptKind::try_from(refund.kind).unwrap(), AttemptKind::Refund);
    assert_eq!(refund.parent_attempt_id, charge.attempt_id);
    assert_eq!(refund.amount_minor, 1_000, "no amount: the whole charge");
    assert_eq!(refund.currency, "usd");
    assert_eq!(refund.refund_reason, "requested_by_customer");
    assert!(refund.provider_payment_id.starts_with("re_"), "{}", refund.provider_payment_id);
    assert_ne!(refund.idempotency_key, charge.idempotency_key, "never the charge's key");

    let ledger = app.sim().ledger().await.unwrap();
    let at_provider: Vec<_> = ledger.refunds_of(&charge.provider_payment_id).collect();
    assert_eq!(at_provider.len(), 1);
    assert_eq!(at_provider[0].id, refund.provider_payment_id);
    assert_eq!(at_provider[0].idempotency_key.as_deref(), Some(refund.idempotency_key.as_str()));
    assert_eq!(at_provider[0].metadata.get("chargeguard_attempt_id"), Some(&refund.attempt_id));
    assert_eq!(at_provider[0].metadata.get("return_id").map(String::as_str), Some("order-1:refund-1"));
    assert_eq!(ledger.refunded_minor(&charge.provider_payment_id), 1_000);

    let again = app.refund(refund_request("order-1:refund-1", "order-1:charge", None)).await.unwrap();
    assert_eq!(outcome(&again), ChargeOutcome::Duplicate);
    assert_eq!(again.attempt.as_ref(), Some(&refund));
    assert_eq!(app.refund_creates().await.len(), 1, "a redelivery sends nothing");

    let charge_now = app.attempt_of("order-1:charge").await;
    assert_eq!((charge_now.refunded_minor, charge_now.refund_pending_minor), (1_000, 0));
}

async fn two_partial_refunds_then_one_over_the_rest_is_refused_and_nothing_is_sent(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    let charge = charged(&app, "order-2:charge").await;
    for (key, amount) in [("order-2:refund-1", 300), ("order-2:refund-2", 500)] {
        let response = app.refund(refund_request(key, "order-2:charge", Some(amount))).await.unwrap();
        assert_eq!((outcome(&response), status(&response)), (ChargeOutcome::Applied, AttemptStatus::Succeeded));
        assert_eq!(response.attempt.unwrap().amount_minor, amount);
    }
    let rows_before = app.attempt_rows().await;
    let error = app.refund(refund_request("order-2:refund-3", "order-2:charge", Some(201))).await.unwrap_err();
    assert_eq!(error.code(), Code::FailedPrecondition);
    assert_eq!(error_code(&error), "refund_exceeds_charge");
    assert!(error.message().contains("amount_minor") && error.message().contains("200"), "{}", error.message());
    assert_eq!(app.attempt_rows().await, rows_before, "nothing written");
    assert_eq!(app.refund_creates().await.len(), 2, "nothing sent");
    assert_eq!(refunds_at_provider(&app, &charge.provider_payment_id).await, (2, 800));

    let charge_now = app.attempt_of("order-2:charge").await;
    assert_eq!((charge_now.refunded_minor, charge_now.refund_pending_minor), (800, 0));
}

async fn without_an_amount_the_rest_is_refunded_and_its_redelivery_matches(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    let charge = charged(&app, "order-3:charge").await;
    app.refund(refund_request("order-3:refund-1", "order-3:charge", Some(250))).await.unwrap();
    let rest = app.refund(refund_request("order-3:refund-2", "order-3:charge", None)).await.unwrap();
    assert_eq!(rest.attempt.as_ref().unwrap().amount_minor, 750);
    // The redelivered "refund the rest" is the same refund, though nothing is left now.
    let again = app.refund(refund_request("order-3:refund-2", "order-3:charge", None)).await.unwrap();
    assert_eq!(outcome(&again), ChargeOutcome::Duplicate);
    assert_eq!(again.attempt, rest.attempt);
    let error = app.refund(refund_request("order-3:refund-3", "order-3:charge", None)).await.unwrap_err();
    assert_eq!((error.code(), error_code(&error).as_str()), (Code::FailedPrecondition, "charge_fully_refunded"));
    assert_eq!(refunds_at_provider(&app, &charge.provider_payment_id).await, (2, 1_000));
}

async fn fifty_concurrent_refunds_of_one_charge_never_exceed_it_at_the_provider(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    let charge = charged(&app, "order-4:charge").await;
    // 50 × 30 = 1500 asked for a charge of 1000: 33 fit (990), the other 17 must be refused.
    let calls = (0..50).map(|index| {
        let app = &app;
        async move { app.refund(refund_request(&format!("order-4:refund-{index}"), "order-4:charge", Some(30))).await }
    });
    let responses = futures::future::join_all(calls).await;
    let (count, sum) = refunds_at_provider(&app, &charge.provider_payment_id).await;
    assert!(sum <= 1_000, "the provider refunded {sum} of a 1000 charge");
    assert_eq!((count, sum), (33, 990));
    let applied = responses.iter().filter(|response| response.as_ref().is_ok_and(|r| status(r) == AttemptStatus::Succeeded)).count();
    let refused: Vec<_> = responses.iter().filter_map(|response| response.as_ref().err()).collect();
    assert!(refused.iter().all(|error| error_code(error) == "refund_exceeds_charge"), "{refused:?}");
    assert_eq!((applied, refused.len()), (33, 17));
    assert_eq!(app.refund_creates().await.len(), 33, "no refused refund reached the provider");
}

async fn fifty_concurrent_duplicates_of_one_refund_make_one_provider_refund(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    let charge = charged(&app, "order-5:charge").await;
    let calls = (0..50).map(|_| {
        let app = &app;
        async move { app.refund(refund_request("order-5:refund-1", "order-5:charge", Some(400))).await }
    });
    let responses: Vec<_> = futures::future::join_all(calls).await.into_iter().map(|r| r.expect("every caller gets the outcome")).collect();
    let ids: std::collections::HashSet<_> = responses.iter().map(|r| r.attempt.as_ref().unwrap().attempt_id.clone()).collect();
    assert_eq!(ids.len(), 1, "one refund attempt");
    assert!(responses.iter().all(|r| status(r) == AttemptStatus::Succeeded));
    assert_eq!(responses.iter().filter(|r| outcome(r) == ChargeOutcome::Applied).count(), 1);
    assert_eq!(refunds_at_provider(&app, &charge.provider_payment_id).await, (1, 400));
    assert_eq!(app.refund_creates().await.len(), 1);
}

async fn the_same_refund_key_with_other_parameters_is_a_mismatch(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    charged(&app, "order-6:charge").await;
    let first = app.refund(refund_request("order-6:refund-1", "order-6:charge", Some(100))).await.unwrap();
    let error = app.refund(refund_request("order-6:refund-1", "order-6:charge", Some(200))).await.unwrap_err();
    assert_eq!((error.code(), error_code(&error).as_str()), (Code::FailedPrecondition, "operation_mismatch"));
    assert!(error.message().contains("order-6:refund-1") && error.message().contains("amount_minor"), "{}", error.message());
    // A refund key that names a charge is a mismatch too, never a refund of it.
    let error = app.refund(refund_request("order-6:charge", "order-6:charge", None)).await.unwrap_err();
    assert_eq!(error_code(&error), "operation_mismatch");
    // And a charge under a refund's key is a mismatch, never a charge.
    let error = app.charge(charge_request("order-6:refund-1")).await.unwrap_err();
    assert_eq!(error_code(&error), "operation_mismatch");
    assert_eq!(app.creates().await.len(), 1, "only the first charge was sent");
    assert_eq!(Some(app.attempt_of("order-6:refund-1").await.attempt_id), first.attempt.map(|a| a.attempt_id));
    assert_eq!(app.refund_creates().await.len(), 1);
}

async fn a_declined_charge_cannot_be_refunded(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    let mut declined = charge_request("order-7:charge");
    declined.payment_method = "pm_card_chargeDeclined".into();
    let charge = app.charge(declined).await.unwrap().attempt.unwrap();
    let rows_before = app.attempt_rows().await;
    let error = app.refund(refund_request("order-7:refund-1", "order-7:charge", None)).await.unwrap_err();
    assert_eq!((error.code(), error_code(&error).as_str()), (Code::FailedPrecondition, "charge_not_succeeded"));
    assert!(error.message().contains(&charge.attempt_id) && error.message().contains("failed"), "{}", error.message());
    assert_eq!(app.attempt_rows().await, rows_before);
    assert!(app.refund_creates().await.is_empty());
}

async fn another_consumers_charge_is_not_found_and_nothing_is_written(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    let charge = charged(&app, "order-8:charge").await;
    let rows_before = app.attempt_rows().await;
    let by_key = app.refund_as(BILLING_TOKEN, refund_request("order-8:refund-1", "order-8:charge", None)).await.unwrap_err();
    let mut by_id = refund_request("order-8:refund-1", "unused", None);
    by_id.charge = Some(proto::refund_request::Charge::ChargeAttemptId(charge.attempt_id.clone()));
    let by_id = app.refund_as(BILLING_TOKEN, by_id).await.unwrap_err();
    for error in [by_key, by_id] {
        assert_eq!((error.code(), error_code(&error).as_str()), (Code::NotFound, "not_found"));
        assert!(!error.message().contains(&charge.attempt_id), "nothing about the other consumer's charge leaks");
    }
    assert_eq!(app.attempt_rows().await, rows_before);
    assert!(app.refund_creates().await.is_empty());
}

async fn bad_refund_requests_name_their_field(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    charged(&app, "order-9:charge").await;
    let rows_before = app.attempt_rows().await;
    let check = |request: proto::RefundRequest, field: &'static str| {
        let app = &app;
        async move {
            let error = app.refund(request).await.unwrap_err();
            assert_eq!(error.code(), Code::InvalidArgument, "{field}: {error:?}");
            assert!(error.message().contains(field), "{field}: {}", error.message());
        }
    };
    check(refund_request("order-9:refund-1", "order-9:charge", Some(0)), "amount_minor").await;
    check(refund_request("order-9:refund-1", "order-9:charge", Some(-5)), "amount_minor").await;
    let mut reason = refund_request("order-9:refund-1", "order-9:charge", None);
    reason.reason = Some("because".into());
    check(reason, "reason").await;
    let mut no_charge = refund_request("order-9:refund-1", "order-9:charge", None);
    no_charge.charge = None;
    check(no_charge, "charge").await;
    let mut bad_id = refund_request("order-9:refund-1", "order-9:charge", None);
    bad_id.charge = Some(proto::refund_request::Charge::ChargeAttemptId("nope".into()));
    check(bad_id, "charge_attempt_id").await;
    assert_eq!(app.attempt_rows().await, rows_before);
    assert!(app.refund_creates().await.is_empty());
}

async fn charges_show_their_refunds_and_lists_show_refund_rows(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    let charge = charged(&app, "order-10:charge").await;
    app.sim().set_refund_mode(chargeguard::simulator::RefundMode::Pending).await.unwrap();
    let pending = app.refund(refund_request("order-10:refund-1", "order-10:charge", Some(100))).await.unwrap();
    assert_eq!((outcome(&pending), status(&pending)), (ChargeOutcome::Applied, AttemptStatus::Pending));
    assert!(pending.attempt.as_ref().unwrap().provider_payment_id.starts_with("re_"), "the object is known");
    app.sim().set_refund_mode(chargeguard::simulator::RefundMode::Succeeded).await.unwrap();
    app.refund(refund_request("order-10:refund-2", "order-10:charge", Some(250))).await.unwrap();

    let mut client = app.client().await;
    let by_id = client
        .get_attempt(authed(ORDERS_TOKEN, GetAttemptRequest { selector: Some(Selector::AttemptId(charge.attempt_id.clone())) }))
        .await
        .unwrap()
        .into_inner()
        .attempt
        .unwrap();
    assert_eq!((by_id.refunded_minor, by_id.refund_pending_minor), (250, 100));
    let listed = client.list_attempts(authed(ORDERS_TOKEN, ListAttemptsRequest::default())).await.unwrap().into_inner().attempts;
    assert_eq!(listed.len(), 3);
    let refunds: Vec<_> = listed.iter().filter(|a| a.kind == AttemptKind::Refund as i32).collect();
    assert_eq!(refunds.len(), 2);
    assert!(refunds.iter().all(|refund| refund.parent_attempt_id == charge.attempt_id && refund.refunded_minor == 0));
    let listed_charge = listed.iter().find(|a| a.attempt_id == charge.attempt_id).unwrap();
    assert_eq!((listed_charge.refunded_minor, listed_charge.refund_pending_minor), (250, 100));
}

/// Refunds `amount_minor` of `payment_id` at the provider behind chargeguard's back (a person
/// in the dashboard), through the real Stripe client.
async fn refund_outside_chargeguard(app: &TestApp, payment_id: &str, amount_minor: i64) {
    use chargeguard::config::ProviderConfig;
    use chargeguard::domain::{AttemptId, ConsumerName, IdempotencyKey, Metadata, OperationKey};
    use chargeguard::provider::{CreateRefund, PaymentProvider, RefundOutcome, StripeProvider, StripeProviderConfig};
    let config = StripeProviderConfig::from_config(&ProviderConfig {
        api_key: Some(chargeguard::secret::Secret::new(crate::support::SIM_API_KEY)),
        base_url: Some(app.simulator.base_url()),
        ..ProviderConfig::default()
    })
    .unwrap();
    let provider = StripeProvider::new(config).unwrap();
    let outcome = provider
        .create_refund(CreateRefund {
            attempt_id: AttemptId::from_uuid(uuid::Uuid::new_v4()),
            consumer: &ConsumerName::parse("dashboard").unwrap(),
            operation_key: &OperationKey::parse("by-hand").unwrap(),
            payment_id,
            amount_minor,
            reason: None,
            metadata: &Metadata::default(),
            idempotency_key: &IdempotencyKey::from_stored(format!("by-hand-{}", uuid::Uuid::new_v4())),
        })
        .await
        .unwrap();
    assert!(matches!(outcome, RefundOutcome::Refund(_)), "{outcome:?}");
}

async fn a_refund_the_provider_refuses_fails_with_the_providers_code(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    let charge = charged(&app, "order-11:charge").await;
    refund_outside_chargeguard(&app, &charge.provider_payment_id, 600).await;
    // chargeguard believes 1000 are left; the provider has 400.
    let response = app.refund(refund_request("order-11:refund-1", "order-11:charge", Some(800))).await.unwrap();
    assert_eq!((outcome(&response), status(&response)), (ChargeOutcome::Applied, AttemptStatus::Failed));
    let refund = response.attempt.unwrap();
    assert_eq!(refund.failure_code, "amount_too_large", "{}", refund.failure_message);
    assert_eq!(refunds_at_provider(&app, &charge.provider_payment_id).await, (1, 600), "nothing more moved");
    // A failed refund holds nothing: the redelivery answers the failure, a new refund may use it.
    let again = app.refund(refund_request("order-11:refund-1", "order-11:charge", Some(800))).await.unwrap();
    assert_eq!((outcome(&again), status(&again)), (ChargeOutcome::Duplicate, AttemptStatus::Failed));
    let shown = app.attempt_of("order-11:charge").await;
    assert_eq!((shown.refunded_minor, shown.refund_pending_minor), (0, 0));
}

on_both_backends!(
    a_refund_the_provider_refuses_fails_with_the_providers_code,
    a_full_refund_is_applied_once_with_its_own_key_and_metadata,
    two_partial_refunds_then_one_over_the_rest_is_refused_and_nothing_is_sent,
    without_an_amount_the_rest_is_refunded_and_its_redelivery_matches,
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)] fifty_concurrent_refunds_of_one_charge_never_exceed_it_at_the_provider,
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)] fifty_concurrent_duplicates_of_one_refund_make_one_provider_refund,
    the_same_refund_key_with_other_parameters_is_a_mismatch,
    a_declined_charge_cannot_be_refunded,
    another_consumers_charge_is_not_found_and_nothing_is_written,
    bad_refund_requests_name_their_field,
    charges_show_their_refunds_and_lists_show_refund_rows,
);
