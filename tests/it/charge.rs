//! The charge path (SEMANTICS.md invariants 1, 3, 4, 5, 6) through the real gRPC server, a real
//! database and the simulator, counting charges at the provider through its ledger. Every test
//! runs on both stores: `charge::postgres::…` and `charge::sqlite::…`.

use chargeguard::grpc::proto::{self, AttemptStatus, ChargeOutcome, GetAttemptRequest, ListAttemptsRequest, get_attempt_request::Selector};
use chargeguard::simulator::{Endpoint, FaultKind, FaultSpec};
use tonic::Code;

use crate::support::{BILLING_TOKEN, Backend, ORDERS_TOKEN, TestApp, on_both_backends, authed, charge_request, error_code, outcome_of, status_of};

async fn intents_at_provider(app: &TestApp) -> usize {
    app.sim().ledger().await.unwrap().payment_intents.len()
}

async fn first_charge_is_applied_once_with_the_derived_key_and_metadata(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    let response = app.charge(charge_request("order-1:charge")).await.unwrap();
    assert_eq!(outcome_of(&response), ChargeOutcome::Applied);
    assert_eq!(status_of(&response), AttemptStatus::Succeeded);
    let attempt = response.attempt.unwrap();
    assert_eq!(attempt.consumer, "orders");
    assert_eq!(attempt.provider, "stripe");
    assert_eq!(attempt.provider_calls, 1);
    assert!(attempt.provider_payment_id.starts_with("pi_"));

    let ledger = app.sim().ledger().await.unwrap();
    assert_eq!(ledger.payment_intents.len(), 1);
    let intent = &ledger.payment_intents[0];
    assert_eq!(intent.id, attempt.provider_payment_id);
    assert_eq!(intent.idempotency_key.as_deref(), Some(attempt.idempotency_key.as_str()));
    assert_eq!(intent.metadata.get("chargeguard_attempt_id"), Some(&attempt.attempt_id));
    assert_eq!(intent.metadata.get("chargeguard_operation_key").map(String::as_str), Some("order-1:charge"));
    assert_eq!(intent.metadata.get("order_id").map(String::as_str), Some("order-1:charge"));
    assert_eq!(intent.amount, 1_000);
}

async fn a_repeated_call_after_success_returns_the_stored_outcome_and_calls_nothing(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    let first = app.charge(charge_request("order-2:charge")).await.unwrap();
    let second = app.charge(charge_request("order-2:charge")).await.unwrap();
    assert_eq!(outcome_of(&second), ChargeOutcome::Duplicate);
    assert_eq!(second.attempt, first.attempt);
    assert_eq!(app.creates().await.len(), 1);
    assert_eq!(intents_at_provider(&app).await, 1);
}

async fn a_decline_is_a_stored_terminal_outcome_not_an_error(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    let mut request = charge_request("order-3:charge");
    request.payment_method = "pm_card_chargeDeclinedInsufficientFunds".into();
    let first = app.charge(request.clone()).await.unwrap();
    assert_eq!(outcome_of(&first), ChargeOutcome::Applied);
    assert_eq!(status_of(&first), AttemptStatus::Failed);
    // Stripe's error code; the issuer's decline code is kept in the message.
    assert_eq!(first.attempt.as_ref().unwrap().failure_code, "card_declined");
    assert!(first.attempt.as_ref().unwrap().failure_message.ends_with("(decline_code: insufficient_funds)"));

    let again = app.charge(request).await.unwrap();
    assert_eq!(outcome_of(&again), ChargeOutcome::Duplicate);
    assert_eq!(status_of(&again), AttemptStatus::Failed);
    assert_eq!(app.creates().await.len(), 1, "the decision is not re-run");
}

async fn same_key_with_different_parameters_is_rejected_and_nothing_changes(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    let first = app.charge(charge_request("order-4:charge")).await.unwrap();
    let mut changed = charge_request("order-4:charge");
    changed.amount_minor = 2_000;
    changed.currency = "eur".into();
    let error = app.charge(changed).await.unwrap_err();
    assert_eq!(error.code(), Code::FailedPrecondition);
    assert_eq!(error_code(&error), "operation_mismatch");
    assert!(error.message().contains("order-4:charge"), "{}", error.message());
    assert!(error.message().contains("amount_minor") && error.message().contains("currency"), "{}", error.message());

    assert_eq!(Some(app.attempt_of("order-4:charge").await), first.attempt);
    assert_eq!(app.creates().await.len(), 1);
}

async fn fifty_concurrent_identical_calls_make_one_provider_object(backend: Backend) {
    // Every waiter hears the first round's outcome however slow the machine: this test counts
    // provider objects, not waits that give up.
    let app = TestApp::spawn_backend_with(backend, |config| config.charge.concurrent_wait_ms = 30_000).await;
    // Slow creates keep the first call in flight while the others arrive.
    app.sim().set_fault(Endpoint::CreatePaymentIntent, FaultSpec::next(FaultKind::Latency(300), 1)).await.unwrap();
    let calls = (0..50).map(|_| {
        let app = &app;
        async move { app.charge(charge_request("order-5:charge")).await }
    });
    let responses = futures::future::join_all(calls).await;
    let responses: Vec<_> = responses.into_iter().map(|r| r.expect("every caller gets the outcome")).collect();
    let ids: std::collections::HashSet<_> = responses.iter().map(|r| r.attempt.as_ref().unwrap().attempt_id.clone()).collect();
    assert_eq!(ids.len(), 1, "all callers see one attempt");
    assert!(responses.iter().all(|r| status_of(r) == AttemptStatus::Succeeded));
    assert_eq!(responses.iter().filter(|r| outcome_of(r) == ChargeOutcome::Applied).count(), 1);
    assert_eq!(intents_at_provider(&app).await, 1);
    assert_eq!(app.creates().await.len(), 1);
}

async fn a_500_before_apply_leaves_the_attempt_pending_and_the_retry_applies_once(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    app.sim().set_fault(Endpoint::CreatePaymentIntent, FaultSpec::next(FaultKind::FailBeforeApply, 1)).await.unwrap();
    let error = app.charge(charge_request("order-6:charge")).await.unwrap_err();
    assert_eq!(error.code(), Code::Unavailable);
    assert_eq!(error_code(&error), "outcome_unknown");
    assert!(error.message().contains("safe to retry"), "{}", error.message());
    assert_eq!(intents_at_provider(&app).await, 0);

    let retry = app.charge(charge_request("order-6:charge")).await.unwrap();
    assert_eq!(outcome_of(&retry), ChargeOutcome::Reconciled);
    assert_eq!(status_of(&retry), AttemptStatus::Succeeded);
    assert_eq!(intents_at_provider(&app).await, 1);
}

async fn applied_then_lost_is_adopted_on_retry(backend: Backend, kind: FaultKind, operation: &str) {
    let app = TestApp::spawn_backend(backend).await;
    app.sim().set_fault(Endpoint::CreatePaymentIntent, FaultSpec::next(kind, 1)).await.unwrap();
    let error = app.charge(charge_request(operation)).await.unwrap_err();
    assert_eq!(error.code(), Code::Unavailable, "{error:?}");
    assert_eq!(intents_at_provider(&app).await, 1, "the provider applied it");

    let retry = app.charge(charge_request(operation)).await.unwrap();
    assert_eq!(outcome_of(&retry), ChargeOutcome::Reconciled);
    assert_eq!(status_of(&retry), AttemptStatus::Succeeded);
    let ledger = app.sim().ledger().await.unwrap();
    assert_eq!(ledger.payment_intents.len(), 1, "the retry adopted the existing charge");
    assert_eq!(retry.attempt.unwrap().provider_payment_id, ledger.payment_intents[0].id);
    let replayed = app.sim().requests().await.unwrap().iter().filter(|r| r.path == "/v1/payment_intents" && r.replayed).count();
    assert_eq!(replayed, 1, "the retry was answered from the provider's idempotency store");
}

async fn apply_then_500_is_adopted_on_retry(backend: Backend) {
    applied_then_lost_is_adopted_on_retry(backend, FaultKind::ApplyThenFail, "order-7:charge").await;
}

async fn apply_then_dropped_connection_is_adopted_on_retry(backend: Backend) {
    applied_then_lost_is_adopted_on_retry(backend, FaultKind::ApplyThenDrop, "order-8:charge").await;
}

async fn a_provider_timeout_is_an_unknown_outcome(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    app.sim().set_fault(Endpoint::CreatePaymentIntent, FaultSpec::next(FaultKind::Latency(1_500), 1)).await.unwrap();
    let error = app.charge(charge_request("order-9:charge")).await.unwrap_err();
    assert_eq!(error.code(), Code::Unavailable);
    let stored = app.attempt_of("order-9:charge").await;
    assert_eq!(AttemptStatus::try_from(stored.status).unwrap(), AttemptStatus::Pending);
    // The slow create completes at the provider meanwhile; the retry, sent once it has (sent
    // earlier it would find the key in use, an unknown outcome again), adopts it.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while intents_at_provider(&app).await == 0 {
        assert!(tokio::time::Instant::now() < deadline, "the slow create never completed");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let retry = app.charge(charge_request("order-9:charge")).await.unwrap();
    assert_eq!(status_of(&retry), AttemptStatus::Succeeded);
    assert_eq!(intents_at_provider(&app).await, 1);
}

async fn authentication_required_leaves_the_attempt_waiting_for_the_customer(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    let mut request = charge_request("order-10:charge");
    request.payment_method = "pm_card_authenticationRequired".into();
    let response = app.charge(request).await.unwrap();
    assert_eq!(status_of(&response), AttemptStatus::RequiresAction);
    let attempt = response.attempt.unwrap();
    let action = attempt.next_action.expect("the customer is told what to do");
    assert!(!action.r#type.is_empty());
    assert!(attempt.provider_payment_id.starts_with("pi_"));
}

async fn callers_must_authenticate_and_see_only_their_own_attempts(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    let mut client = app.client().await;
    let missing = client.charge(tonic::Request::new(charge_request("order-11:charge"))).await.unwrap_err();
    assert_eq!(missing.code(), Code::Unauthenticated);
    let wrong = client.charge(authed("not-a-token", charge_request("order-11:charge"))).await.unwrap_err();
    assert_eq!(wrong.code(), Code::Unauthenticated);
    assert!(!wrong.message().contains("not-a-token"), "the token is never echoed");
    assert_eq!(app.attempt_rows().await, 0);

    let orders = app.charge(charge_request("order-11:charge")).await.unwrap().attempt.unwrap();
    let by_id = client
        .get_attempt(authed(BILLING_TOKEN, GetAttemptRequest { selector: Some(Selector::AttemptId(orders.attempt_id.clone())) }))
        .await
        .unwrap_err();
    assert_eq!(by_id.code(), Code::NotFound);
    let listed = client.list_attempts(authed(BILLING_TOKEN, ListAttemptsRequest::default())).await.unwrap().into_inner();
    assert!(listed.attempts.is_empty());

    // The same operation key of another consumer is another operation, with another key.
    let billing = app.charge_as(BILLING_TOKEN, charge_request("order-11:charge")).await.unwrap();
    assert_eq!(outcome_of(&billing), ChargeOutcome::Applied);
    let billing = billing.attempt.unwrap();
    assert_eq!(billing.consumer, "billing");
    assert_ne!(billing.idempotency_key, orders.idempotency_key);
    assert_eq!(app.sim().ledger().await.unwrap().payment_intents.len(), 2);
}

async fn each_invalid_field_is_named_and_nothing_is_written_or_charged(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    type Edit = fn(&mut proto::ChargeRequest);
    let cases: Vec<(&str, Edit)> = vec![
        ("operation_key", |r| r.operation_key = String::new()),
        ("operation_key", |r| r.operation_key = "k".repeat(201)),
        ("operation_key", |r| r.operation_key = "line\nbreak".into()),
        ("amount_minor", |r| r.amount_minor = 0),
        ("amount_minor", |r| r.amount_minor = -5),
        ("amount_minor", |r| r.amount_minor = 100_000_000),
        ("currency", |r| r.currency = String::new()),
        ("currency", |r| r.currency = "usdollars".into()),
        ("currency", |r| r.currency = "xyz".into()),
        ("payment_method", |r| r.payment_method = String::new()),
        ("payment_method", |r| r.payment_method = "pm card".into()),
        ("customer", |r| r.customer = Some(String::new())),
        ("customer", |r| r.customer = Some("cus/../x".into())),
        ("description", |r| r.description = Some("d".repeat(1001))),
        ("metadata", |r| { r.metadata.insert("chargeguard_attempt_id".into(), "x".into()); }),
        ("metadata", |r| { r.metadata.insert("k".repeat(41), "x".into()); }),
        ("metadata", |r| { r.metadata.insert("big".into(), "v".repeat(501)); }),
        ("metadata", |r| { for i in 0..60 { r.metadata.insert(format!("k{i}"), "v".into()); } }),
    ];
    for (field, edit) in cases {
        let mut request = charge_request("order-12:charge");
        edit(&mut request);
        let error = app.charge(request).await.unwrap_err();
        assert_eq!(error.code(), Code::InvalidArgument, "{field}: {error:?}");
        assert!(error.message().contains(field), "message {:?} names {field}", error.message());
    }
    assert_eq!(app.attempt_rows().await, 0, "nothing written");
    assert!(app.sim().requests().await.unwrap().is_empty(), "nothing sent to the provider");
}

/// The decode limit is refused with chargeguard's own code, naming the option, its value and the
/// request's size, before any handler runs; a request under it reaches the handler.
async fn a_request_over_the_size_limit_is_refused_by_name_and_nothing_is_written_or_charged(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    let mut huge = charge_request("order-huge:charge");
    huge.description = Some("d".repeat(5_000_000));
    let error = app.charge(huge).await.unwrap_err();
    assert_eq!((error.code(), error_code(&error).as_str()), (Code::ResourceExhausted, "request_too_large"), "{error:?}");
    assert!(
        error.message().starts_with("the request message is 50000")
            && error.message().contains("over the limit of 4194304 bytes (server.grpc_request_bytes_max); nothing was written or charged"),
        "{}",
        error.message()
    );
    let mut large = charge_request("order-large:charge");
    large.description = Some("d".repeat(1_000_000));
    let under_the_limit = app.charge(large).await.unwrap_err();
    assert_eq!(error_code(&under_the_limit), "invalid_argument", "read and validated: {under_the_limit:?}");
    assert_eq!(app.attempt_rows().await, 0, "nothing written");
    assert!(app.creates().await.is_empty(), "nothing sent to the provider");

    let small_limit = TestApp::spawn_backend_with(backend, |config| config.server.grpc_request_bytes_max = 65_536).await;
    let mut large = charge_request("order-large:charge");
    large.description = Some("d".repeat(100_000));
    let error = small_limit.charge(large).await.unwrap_err();
    assert_eq!(error_code(&error), "request_too_large", "{error:?}");
    assert!(error.message().contains("over the limit of 65536 bytes"), "{}", error.message());
    assert_eq!(small_limit.attempt_rows().await, 0);
    small_limit.charge(charge_request("order-small:charge")).await.expect("a normal request still passes");
}

async fn attempts_are_listed_newest_first_in_bounded_pages(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    for index in 0..5 {
        let mut request = charge_request(&format!("order-list-{index}"));
        if index == 2 {
            request.payment_method = "pm_card_chargeDeclined".into();
        }
        app.charge(request).await.unwrap();
    }
    let mut client = app.client().await;
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = client
            .list_attempts(authed(ORDERS_TOKEN, ListAttemptsRequest { page_size: 2, page_token: token.clone(), ..Default::default() }))
            .await
            .unwrap()
            .into_inner();
        assert!(page.attempts.len() <= 2);
        seen.extend(page.attempts.into_iter().map(|a| a.operation_key));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    let expected: Vec<String> = (0..5).rev().map(|i| format!("order-list-{i}")).collect();
    assert_eq!(seen, expected);

    let failed = client
        .list_attempts(authed(ORDERS_TOKEN, ListAttemptsRequest { status: AttemptStatus::Failed as i32, ..Default::default() }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(failed.attempts.len(), 1);
    assert_eq!(failed.attempts[0].operation_key, "order-list-2");

    let too_big = client
        .list_attempts(authed(ORDERS_TOKEN, ListAttemptsRequest { page_size: 100_000, ..Default::default() }))
        .await
        .unwrap_err();
    assert_eq!(too_big.code(), Code::InvalidArgument);
    assert!(too_big.message().contains("page_size"));
    let bad_token = client
        .list_attempts(authed(ORDERS_TOKEN, ListAttemptsRequest { page_token: "garbage".into(), ..Default::default() }))
        .await
        .unwrap_err();
    assert!(bad_token.message().contains("page_token"));
}

on_both_backends!(
    first_charge_is_applied_once_with_the_derived_key_and_metadata,
    a_repeated_call_after_success_returns_the_stored_outcome_and_calls_nothing,
    a_decline_is_a_stored_terminal_outcome_not_an_error,
    same_key_with_different_parameters_is_rejected_and_nothing_changes,
    fifty_concurrent_identical_calls_make_one_provider_object,
    a_500_before_apply_leaves_the_attempt_pending_and_the_retry_applies_once,
    apply_then_500_is_adopted_on_retry,
    apply_then_dropped_connection_is_adopted_on_retry,
    a_provider_timeout_is_an_unknown_outcome,
    authentication_required_leaves_the_attempt_waiting_for_the_customer,
    callers_must_authenticate_and_see_only_their_own_attempts,
    each_invalid_field_is_named_and_nothing_is_written_or_charged,
    a_request_over_the_size_limit_is_refused_by_name_and_nothing_is_written_or_charged,
    attempts_are_listed_newest_first_in_bounded_pages,
);
