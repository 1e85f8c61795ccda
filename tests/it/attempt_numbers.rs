//! Charging again on purpose (issue 16): attempt n + 1 of an operation after attempt n failed,
//! through the real gRPC server, a real database and the simulator. Charges are counted at the
//! simulator: its request log (what was sent, under which key) and its ledger (what exists).
//! Every test runs on both stores: `attempt_numbers::postgres::…` and `…::sqlite::…`.

use std::collections::{BTreeMap, BTreeSet};

use chargeguard::grpc::ATTEMPT_ID_METADATA;
use chargeguard::grpc::proto::{
    self, AttemptKind, AttemptStatus, ChargeOutcome, GetAttemptRequest, ListAttemptsRequest,
    get_attempt_request::Selector,
};
use chargeguard::simulator::{Endpoint, FaultKind, FaultSpec, LedgerPaymentIntent, RequestLogEntry};
use tonic::{Code, Status};

use crate::recovery::{advance, hours, leave_pending, sweep_until_idle};
use crate::reports::run_json;
use crate::support::{
    Backend, ORDERS_TOKEN, SIM_API_KEY, TestApp, attempt_request as attempt, authed, error_code, on_both_backends, outcome_of, status_of,
};

const DECLINING_CARD: &str = "pm_card_chargeDeclined";
const ANOTHER_CARD: &str = "pm_card_mastercard";

/// Attempt 1 of `operation`, declined and recorded as failed.
async fn declined_first_attempt(app: &TestApp, operation: &str) -> proto::Attempt {
    let first = app.charge(attempt(operation, 1, DECLINING_CARD)).await.unwrap();
    assert_eq!(status_of(&first), AttemptStatus::Failed);
    let first = first.attempt.unwrap();
    assert_eq!(first.failure_code, "card_declined");
    first
}

/// Payment writes the simulator received: creates and confirms of intents.
async fn payment_writes(app: &TestApp) -> Vec<RequestLogEntry> {
    let log = app.sim().requests().await.unwrap();
    log.into_iter()
        .filter(|r| r.method == "POST" && (r.path == "/v1/payment_intents" || r.path.ends_with("/confirm")))
        .collect()
}

async fn confirms(app: &TestApp) -> Vec<RequestLogEntry> {
    payment_writes(app).await.into_iter().filter(|r| r.path.ends_with("/confirm")).collect()
}

async fn intents(app: &TestApp) -> Vec<LedgerPaymentIntent> {
    app.sim().ledger().await.unwrap().payment_intents
}

async fn succeeded_intents(app: &TestApp) -> usize {
    intents(app).await.iter().filter(|intent| intent.status == "succeeded").count()
}

async fn requests_sent(app: &TestApp) -> usize {
    app.sim().requests().await.unwrap().len()
}

/// Every attempt of `operation`, through ListAttempts' operation filter, oldest first.
async fn attempts_of(app: &TestApp, operation: &str) -> Vec<proto::Attempt> {
    let mut client = app.client().await;
    let request = ListAttemptsRequest { operation_key: operation.to_owned(), ..Default::default() };
    let mut attempts = client.list_attempts(authed(ORDERS_TOKEN, request)).await.unwrap().into_inner().attempts;
    attempts.sort_by_key(|attempt| attempt.attempt_number);
    attempts
}

fn attempt_id_of(status: &Status) -> String {
    status.metadata().get(ATTEMPT_ID_METADATA).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned()
}

async fn after_a_decline_attempt_2_with_another_card_confirms_the_same_intent_and_succeeds(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    let first = declined_first_attempt(&app, "order-1:charge").await;

    let second = app.charge(attempt("order-1:charge", 2, ANOTHER_CARD)).await.unwrap();
    assert_eq!(outcome_of(&second), ChargeOutcome::Applied);
    assert_eq!(status_of(&second), AttemptStatus::Succeeded);
    let second = second.attempt.unwrap();
    assert_eq!(second.attempt_number, 2);
    assert_eq!(second.generation, 1);
    assert_ne!(second.attempt_id, first.attempt_id);
    assert_eq!(second.provider_payment_id, first.provider_payment_id, "the declined intent was paid");

    let writes = payment_writes(&app).await;
    assert_eq!(writes.len(), 2, "one create, one confirm: {writes:#?}");
    assert_eq!(writes[0].path, "/v1/payment_intents");
    assert_eq!(writes[1].path, format!("/v1/payment_intents/{}/confirm", first.provider_payment_id));
    let keys: Vec<_> = writes.iter().map(|w| w.idempotency_key.clone().unwrap()).collect();
    assert_eq!(keys, vec![first.idempotency_key.clone(), second.idempotency_key.clone()]);
    assert_ne!(keys[0], keys[1], "each attempt has its own derived key");

    let ledger = intents(&app).await;
    assert_eq!(ledger.len(), 1, "{ledger:#?}");
    assert_eq!(ledger[0].status, "succeeded");

    // GetAttempt by operation answers the latest attempt and counts them; the list shows both.
    let mut client = app.client().await;
    let selector = Some(Selector::OperationKey("order-1:charge".into()));
    let got = client.get_attempt(authed(ORDERS_TOKEN, GetAttemptRequest { selector })).await.unwrap().into_inner();
    assert_eq!(got.attempt.unwrap().attempt_id, second.attempt_id);
    assert_eq!(got.operation_attempts, 2);
    let listed = attempts_of(&app, "order-1:charge").await;
    let numbers: Vec<u32> = listed.iter().map(|a| a.attempt_number).collect();
    assert_eq!(numbers, vec![1, 2]);
    assert_eq!(AttemptStatus::try_from(listed[0].status).unwrap(), AttemptStatus::Failed, "attempt 1 keeps its decline");
    let request = ListAttemptsRequest { kind: AttemptKind::Refund as i32, ..Default::default() };
    let refunds = client.list_attempts(authed(ORDERS_TOKEN, request)).await.unwrap().into_inner().attempts;
    assert!(refunds.is_empty(), "the kind filter: no refunds here");
    let request = ListAttemptsRequest { kind: AttemptKind::Charge as i32, ..Default::default() };
    let charges = client.list_attempts(authed(ORDERS_TOKEN, request)).await.unwrap().into_inner().attempts;
    assert_eq!(charges.len(), 2);

    // Attempt 1 asked again is still its own stored decline.
    let again = app.charge(attempt("order-1:charge", 1, DECLINING_CARD)).await.unwrap();
    assert_eq!(outcome_of(&again), ChargeOutcome::Duplicate);
    assert_eq!(again.attempt.unwrap().attempt_id, first.attempt_id);
    assert_eq!(payment_writes(&app).await.len(), 2);
}

async fn attempt_2_redelivered_20_times_some_concurrently_calls_the_provider_once(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    declined_first_attempt(&app, "order-2:charge").await;
    // The confirm is slow, so the concurrent deliveries find it leased and wait for it.
    app.sim().set_fault(Endpoint::ConfirmPaymentIntent, FaultSpec::next(FaultKind::Latency(300), 1)).await.unwrap();
    let concurrent = (0..10).map(|_| {
        let app = &app;
        async move { app.charge(attempt("order-2:charge", 2, ANOTHER_CARD)).await }
    });
    let mut answers = futures::future::join_all(concurrent).await;
    for _ in 0..10 {
        answers.push(app.charge(attempt("order-2:charge", 2, ANOTHER_CARD)).await);
    }
    let ids: BTreeSet<String> = answers
        .into_iter()
        .map(|answer| {
            let answer = answer.expect("every delivery is answered");
            assert_eq!(status_of(&answer), AttemptStatus::Succeeded);
            answer.attempt.unwrap().attempt_id
        })
        .collect();
    assert_eq!(ids.len(), 1, "one attempt 2");
    assert_eq!(confirms(&app).await.len(), 1, "one provider call for attempt 2");
    assert_eq!(app.attempt_rows().await, 2);
    assert_eq!(succeeded_intents(&app).await, 1);
}

async fn attempt_2_while_attempt_1_is_pending_is_refused_and_nothing_is_sent(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    let first = leave_pending(&app, "order-3:charge", FaultKind::FailBeforeApply).await;
    let sent = requests_sent(&app).await;

    let error = app.charge(attempt("order-3:charge", 2, ANOTHER_CARD)).await.unwrap_err();
    assert_eq!(error.code(), Code::Unavailable, "{error:?}");
    assert_eq!(error_code(&error), "in_progress");
    assert_eq!(attempt_id_of(&error), first.id.to_string(), "names the undecided attempt");
    assert!(error.message().contains("safe to retry"), "{}", error.message());
    assert_eq!(requests_sent(&app).await, sent, "nothing sent");
    assert_eq!(app.attempt_rows().await, 1, "nothing written");
}

async fn attempt_3_after_attempt_1_is_refused_as_out_of_order(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    declined_first_attempt(&app, "order-4:charge").await;
    let sent = requests_sent(&app).await;

    let error = app.charge(attempt("order-4:charge", 3, ANOTHER_CARD)).await.unwrap_err();
    assert_eq!(error.code(), Code::FailedPrecondition, "{error:?}");
    assert_eq!(error_code(&error), "attempt_out_of_order");
    assert!(error.message().contains("order-4:charge"), "{}", error.message());
    let never = app.charge(attempt("order-never:charge", 2, ANOTHER_CARD)).await.unwrap_err();
    assert_eq!(error_code(&never), "attempt_out_of_order", "attempt 2 of an operation with no attempt 1");
    assert_eq!(requests_sent(&app).await, sent, "nothing sent");
    assert_eq!(app.attempt_rows().await, 1, "nothing written");

    for (value, reason) in [(0, "is 1-based"), (101, "at most 100")] {
        let invalid = app.charge(attempt("order-4:charge", value, ANOTHER_CARD)).await.unwrap_err();
        assert_eq!(invalid.code(), Code::InvalidArgument);
        assert!(invalid.message().contains("attempt") && invalid.message().contains(reason), "{}", invalid.message());
    }
}

async fn attempt_2_after_success_is_refused_with_the_succeeded_attempt(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    let first = app.charge(attempt("order-5:charge", 1, "pm_card_visa")).await.unwrap().attempt.unwrap();
    let sent = requests_sent(&app).await;

    for number in [2, 3] {
        let error = app.charge(attempt("order-5:charge", number, ANOTHER_CARD)).await.unwrap_err();
        assert_eq!(error.code(), Code::FailedPrecondition, "{error:?}");
        assert_eq!(error_code(&error), "operation_already_succeeded");
        assert_eq!(attempt_id_of(&error), first.attempt_id);
    }
    assert_eq!(requests_sent(&app).await, sent, "nothing sent");
    assert_eq!(app.attempt_rows().await, 1);
    assert_eq!(succeeded_intents(&app).await, 1);
}

async fn fifty_concurrent_callers_split_between_attempts_2_and_3_create_only_attempt_2(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    declined_first_attempt(&app, "order-6:charge").await;
    app.sim().set_fault(Endpoint::ConfirmPaymentIntent, FaultSpec::next(FaultKind::Latency(300), 1)).await.unwrap();
    let calls = (0..50).map(|index| {
        let app = &app;
        let number = 2 + (index % 2);
        async move { (number, app.charge(attempt("order-6:charge", number, ANOTHER_CARD)).await) }
    });
    let answers = futures::future::join_all(calls).await;
    for (number, answer) in answers {
        match (number, answer) {
            (2, Ok(answer)) => assert_eq!(status_of(&answer), AttemptStatus::Succeeded),
            (3, Err(error)) => assert!(
                ["attempt_out_of_order", "in_progress", "operation_already_succeeded"].contains(&error_code(&error).as_str()),
                "{error:?}"
            ),
            (number, answer) => panic!("attempt {number}: {answer:?}"),
        }
    }
    let numbers: Vec<u32> = attempts_of(&app, "order-6:charge").await.iter().map(|a| a.attempt_number).collect();
    assert_eq!(numbers, vec![1, 2], "attempt 2 once, attempt 3 never");
    assert_eq!(confirms(&app).await.len(), 1);
    assert_eq!(succeeded_intents(&app).await, 1);
}

async fn after_an_expired_attempt_attempt_2_creates_a_new_intent(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    let first = leave_pending(&app, "order-7:charge", FaultKind::FailBeforeApply).await;
    advance(&app, hours(25)).await;
    let swept = sweep_until_idle(&app).await;
    assert_eq!(swept.failed, 1, "{swept}");
    let listed = attempts_of(&app, "order-7:charge").await;
    assert_eq!(listed[0].failure_code, "expired");
    assert!(intents(&app).await.is_empty());

    let second = app.charge(attempt("order-7:charge", 2, "pm_card_visa")).await.unwrap();
    assert_eq!(status_of(&second), AttemptStatus::Succeeded);
    let second = second.attempt.unwrap();
    let writes: Vec<_> = payment_writes(&app).await.into_iter().filter(|w| w.status.is_some()).collect();
    let last = writes.last().unwrap();
    assert_eq!(last.path, "/v1/payment_intents", "a new intent: attempt 1 has none");
    assert_eq!(last.idempotency_key.as_deref(), Some(second.idempotency_key.as_str()));
    assert_ne!(second.idempotency_key, first.idempotency_key.as_str());
    assert!(confirms(&app).await.is_empty());
    let ledger = intents(&app).await;
    assert_eq!(ledger.len(), 1);
    assert_eq!(ledger[0].metadata.get("chargeguard_attempt_id"), Some(&second.attempt_id));
}

async fn an_amount_change_after_a_decline_cancels_the_declined_intent_then_creates(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    let first = declined_first_attempt(&app, "order-8:charge").await;
    let mut changed = attempt("order-8:charge", 2, ANOTHER_CARD);
    changed.amount_minor = 2_500;

    let second = app.charge(changed.clone()).await.unwrap();
    assert_eq!(status_of(&second), AttemptStatus::Succeeded);
    let second = second.attempt.unwrap();
    assert_ne!(second.provider_payment_id, first.provider_payment_id);

    let ledger = intents(&app).await;
    assert_eq!(ledger.len(), 2, "{ledger:#?}");
    let old = ledger.iter().find(|intent| intent.id == first.provider_payment_id).unwrap();
    assert_eq!(old.status, "canceled", "the declined intent can no longer be paid");
    let new = ledger.iter().find(|intent| intent.id == second.provider_payment_id).unwrap();
    assert_eq!((new.status.as_str(), new.amount), ("succeeded", 2_500));
    let cancels = app.sim().requests().await.unwrap().into_iter().filter(|r| r.path.ends_with("/cancel")).count();
    assert_eq!(cancels, 1);
    assert!(confirms(&app).await.is_empty());
    let listed = attempts_of(&app, "order-8:charge").await;
    assert_eq!(listed[0].provider_status, "canceled", "the cancel is recorded on attempt 1");
    assert_eq!(AttemptStatus::try_from(listed[0].status).unwrap(), AttemptStatus::Failed);

    let again = app.charge(changed).await.unwrap();
    assert_eq!(outcome_of(&again), ChargeOutcome::Duplicate);
    assert_eq!(succeeded_intents(&app).await, 1);
}

async fn a_cancel_that_fails_writes_no_next_attempt_and_the_retry_cancels_then_creates(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    let first = declined_first_attempt(&app, "order-10:charge").await;
    let mut changed = attempt("order-10:charge", 2, ANOTHER_CARD);
    changed.amount_minor = 3_000;
    let outage = FaultSpec::next(FaultKind::FailBeforeApply, 1);
    app.sim().set_fault(Endpoint::CancelPaymentIntent, outage).await.unwrap();
    app.sim().set_fault(Endpoint::RetrievePaymentIntent, outage).await.unwrap();

    let error = app.charge(changed.clone()).await.unwrap_err();
    assert_eq!(error.code(), Code::Unavailable, "{error:?}");
    assert_eq!(error_code(&error), "in_progress");
    assert_eq!(attempt_id_of(&error), first.attempt_id);
    assert!(error.message().contains("could not be canceled yet"), "{}", error.message());
    assert_eq!(app.attempt_rows().await, 1, "no attempt 2 beside a payable intent");
    assert_eq!(payment_writes(&app).await.len(), 1, "no create");

    let second = app.charge(changed).await.unwrap();
    assert_eq!(status_of(&second), AttemptStatus::Succeeded);
    let ledger = intents(&app).await;
    assert_eq!(ledger.iter().map(|i| i.status.as_str()).collect::<BTreeSet<_>>(), BTreeSet::from(["canceled", "succeeded"]));
}

async fn a_confirm_never_answered_expires_past_its_window_and_attempt_3_confirms_the_intent_again(backend: Backend) {
    let app = TestApp::spawn_backend(backend).await;
    let first = declined_first_attempt(&app, "order-9:charge").await;
    // Attempt 2's confirm is refused before the provider applies it, and nobody retries.
    app.sim().set_fault(Endpoint::ConfirmPaymentIntent, FaultSpec::next(FaultKind::FailBeforeApply, 1)).await.unwrap();
    let lost = app.charge(attempt("order-9:charge", 2, ANOTHER_CARD)).await.unwrap_err();
    assert_eq!(error_code(&lost), "outcome_unknown");
    let jumped_at = advance(&app, hours(25)).await;
    let swept = sweep_until_idle(&app).await;
    assert_eq!((swept.claimed, swept.failed), (1, 1), "{swept}");
    let after_jump: Vec<_> =
        app.sim().requests().await.unwrap().into_iter().filter(|r| r.sim_time >= jumped_at).collect();
    assert!(after_jump.iter().all(|r| r.method == "GET"), "past the window nothing is sent: {after_jump:#?}");
    assert!(
        after_jump.iter().all(|r| r.endpoint.as_deref() == Some("retrieve_payment_intent")),
        "the intent is read by its id, never searched: {after_jump:#?}"
    );
    let second = attempts_of(&app, "order-9:charge").await.pop().unwrap();
    assert_eq!((second.attempt_number, second.failure_code.as_str()), (2, "expired"));
    assert_eq!(second.provider_payment_id, first.provider_payment_id, "the intent stays the operation's");

    let third = app.charge(attempt("order-9:charge", 3, "pm_card_visa")).await.unwrap();
    assert_eq!(status_of(&third), AttemptStatus::Succeeded);
    let third = third.attempt.unwrap();
    assert_eq!(third.provider_payment_id, first.provider_payment_id);
    let confirms = confirms(&app).await;
    let keys: BTreeSet<_> = confirms.iter().filter_map(|r| r.idempotency_key.clone()).collect();
    assert_eq!(keys.len(), 2, "attempts 2 and 3, each with its own key: {confirms:#?}");
    assert_eq!(intents(&app).await.len(), 1);
    assert_eq!(succeeded_intents(&app).await, 1);
}

/// The report's category of each attempt row of `operation`, by attempt id.
fn categories_of(report: &serde_json::Value, operation: &str) -> BTreeMap<String, String> {
    report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|row| row["attempt"]["operation_key"] == operation)
        .map(|row| {
            (row["attempt"]["attempt_id"].as_str().unwrap().to_owned(), row["category"].as_str().unwrap().to_owned())
        })
        .collect()
}

/// Reports: attempts of one operation are one business operation. On PostgreSQL only because
/// the test seeds with PostgreSQL's SQL; the report itself runs on both stores (`reports`).
#[tokio::test]
async fn reports_count_attempts_of_one_operation_as_one_and_flag_a_second_charge_as_double() {
    let app = TestApp::spawn().await;
    // Attempt 2 paid attempt 1's declined intent: one object, the latest attempt's.
    let first = declined_first_attempt(&app, "report-again-1").await;
    let second = app.charge(attempt("report-again-1", 2, ANOTHER_CARD)).await.unwrap().attempt.unwrap();
    // Attempt 1's intent recorded canceled though it is not (a hand edit, a lost cancel): attempt
    // 2 creates a new intent beside one that can still be paid, and then is.
    let lost = declined_first_attempt(&app, "report-again-2").await;
    let pool = sqlx::PgPool::connect(&app.database.url).await.unwrap();
    sqlx::query("UPDATE payment_attempts SET provider_status = 'canceled' WHERE id = $1::uuid")
        .bind(&lost.attempt_id)
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    let beside = app.charge(attempt("report-again-2", 2, ANOTHER_CARD)).await.unwrap().attempt.unwrap();
    assert_ne!(beside.provider_payment_id, lost.provider_payment_id);

    let (_, report) = run_json(&app, &[]).await;
    assert_eq!(
        categories_of(&report, "report-again-1"),
        BTreeMap::from([(first.attempt_id.clone(), "matched".into()), (second.attempt_id.clone(), "matched".into())]),
        "a re-confirmed intent is the latest attempt's: {report:#}"
    );
    let double = categories_of(&report, "report-again-2");
    assert_eq!(double.get(&beside.attempt_id).map(String::as_str), Some("double_charge"), "{report:#}");
    assert_eq!(double.get(&lost.attempt_id).map(String::as_str), Some("matched"), "attempt 1 keeps its decline");

    // Someone pays the forgotten intent: both attempts of the operation now hold money.
    let confirmed = reqwest::Client::new()
        .post(format!("{}v1/payment_intents/{}/confirm", app.simulator.base_url(), lost.provider_payment_id))
        .bearer_auth(SIM_API_KEY)
        .form(&[("payment_method", "pm_card_visa")])
        .send()
        .await
        .unwrap();
    assert!(confirmed.status().is_success());
    let (code, report) = run_json(&app, &[]).await;
    assert_eq!(code, 1);
    let double = categories_of(&report, "report-again-2");
    assert_eq!(double.get(&beside.attempt_id).map(String::as_str), Some("double_charge"), "{report:#}");
    assert_eq!(double.get(&lost.attempt_id).map(String::as_str), Some("status_mismatch"));
}

on_both_backends!(
    after_a_decline_attempt_2_with_another_card_confirms_the_same_intent_and_succeeds,
    #[tokio::test(flavor = "multi_thread")] attempt_2_redelivered_20_times_some_concurrently_calls_the_provider_once,
    attempt_2_while_attempt_1_is_pending_is_refused_and_nothing_is_sent,
    attempt_3_after_attempt_1_is_refused_as_out_of_order,
    attempt_2_after_success_is_refused_with_the_succeeded_attempt,
    #[tokio::test(flavor = "multi_thread")] fifty_concurrent_callers_split_between_attempts_2_and_3_create_only_attempt_2,
    after_an_expired_attempt_attempt_2_creates_a_new_intent,
    an_amount_change_after_a_decline_cancels_the_declined_intent_then_creates,
    a_confirm_never_answered_expires_past_its_window_and_attempt_3_confirms_the_intent_again,
    a_cancel_that_fails_writes_no_next_attempt_and_the_retry_cancels_then_creates,
);
