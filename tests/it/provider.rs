//! The transport under async-stripe (`provider/transport.rs`): connections to the provider are
//! kept alive between calls, within `provider.idle_connections_max`.

use chargeguard::grpc::proto::AttemptStatus;

use crate::support::{TestApp, charge_request, status_of};

const CHARGES: u64 = 20;

/// Connections the simulator accepted while `CHARGES` charges ran one after another.
async fn connections_for_sequential_charges(app: &TestApp, prefix: &str) -> u64 {
    // One control client for both readings: its own connection is kept alive too.
    let sim = app.sim();
    // The first charge opens the connection the others may reuse.
    app.charge(charge_request(&format!("{prefix}-warm-up"))).await.unwrap();
    let before = sim.connections_accepted().await.unwrap();
    for index in 0..CHARGES {
        let response = app.charge(charge_request(&format!("{prefix}-{index}"))).await.unwrap();
        assert_eq!(status_of(&response), AttemptStatus::Succeeded);
    }
    sim.connections_accepted().await.unwrap() - before
}

#[tokio::test]
async fn sequential_charges_reuse_one_provider_connection() {
    let app = TestApp::spawn().await;
    let opened = connections_for_sequential_charges(&app, "kept-alive").await;
    // At most the control client's reconnect; a connection per call would be 20.
    assert!(opened <= 1, "{opened} connections for {CHARGES} sequential charges");
}

#[tokio::test]
async fn with_no_idle_connections_every_call_opens_its_own() {
    let app = TestApp::spawn_with(|config| config.provider.idle_connections_max = 0).await;
    let opened = connections_for_sequential_charges(&app, "no-pool").await;
    assert!(opened >= CHARGES, "{opened} connections for {CHARGES} sequential charges");
}

mod classification {
    //! The Stripe provider's reading of answers that need more than the parsed body: a replayed
    //! saved failure (`Idempotent-Replayed: true`) and a body over the limit.

    use std::collections::BTreeMap;

    use chargeguard::config::ProviderConfig;
    use chargeguard::domain::{LeaseOwner, PaymentMethodId};
    use chargeguard::provider::{
        CreatePayment, CreatedRange, METADATA_ATTEMPT_ID, PaymentProvider, ProviderError, StripeProvider,
        StripeProviderConfig,
    };
    use chargeguard::secret::Secret;
    use chargeguard::simulator::{Endpoint, FaultKind, FaultSpec, SeedPaymentIntent};
    use chargeguard::store::NewAttempt;
    use chrono::Utc;
    use uuid::Uuid;

    use crate::simulator::{API_KEY, Sim};
    use crate::support::attempts::pending_attempt;

    pub(super) fn provider(sim: &Sim, response_body_bytes_max: Option<usize>) -> StripeProvider {
        let mut config = StripeProviderConfig::from_config(&ProviderConfig {
            api_key: Some(Secret::new(API_KEY)),
            base_url: Some(sim.handle.base_url()),
            ..ProviderConfig::default()
        })
        .unwrap();
        if let Some(bytes_max) = response_body_bytes_max {
            // Below what configuration accepts: no real answer would fit otherwise.
            config.response_body_bytes_max = bytes_max;
        }
        StripeProvider::new(config).unwrap()
    }

    pub(super) fn attempt(operation: &str) -> NewAttempt {
        let time = chargeguard::store::CallerTime { now: Utc::now(), shift: chrono::Duration::zero() };
        let owner = LeaseOwner::from_uuid(Uuid::now_v7());
        pending_attempt(operation, owner, chrono::Duration::zero(), chrono::Duration::zero(), time)
    }

    pub(super) fn create_request(new: &NewAttempt) -> CreatePayment<'_> {
        CreatePayment {
            attempt_id: new.id,
            consumer: &new.consumer,
            operation_key: &new.operation_key,
            params: &new.params,
            idempotency_key: &new.idempotency_key,
            return_url: None,
        }
    }

    async fn create(provider: &StripeProvider, new: &NewAttempt) -> Result<(), ProviderError> {
        provider.create_payment(create_request(new)).await.map(drop)
    }

    /// The first answer is a 500 (outcome unknown, as any 5xx); every later one is its replay.
    async fn check_saved_500(kind: FaultKind, intents_created: usize) {
        let sim = Sim::start().await;
        let provider = provider(&sim, None);
        sim.control.set_fault(Endpoint::CreatePaymentIntent, FaultSpec::next(kind, 1)).await.unwrap();
        let new = attempt(&format!("saved-500-{kind:?}"));
        let first = create(&provider, &new).await.unwrap_err();
        assert!(matches!(first, ProviderError::OutcomeUnknown(_)), "{first:?}");
        for _ in 0..2 {
            let again = create(&provider, &new).await.unwrap_err();
            assert!(
                matches!(&again, ProviderError::ReplayedFailure(message) if message.contains("500")),
                "{again:?}"
            );
        }
        let ledger = sim.control.ledger().await.unwrap();
        let attempt_id = new.id.to_string();
        assert_eq!(ledger.payment_intents_with_metadata(METADATA_ATTEMPT_ID, &attempt_id).count(), intents_created);
        assert_eq!(ledger.payment_intents.len(), intents_created);
    }

    #[tokio::test]
    async fn a_replayed_500_without_the_object_is_a_replayed_failure() {
        check_saved_500(FaultKind::FailSaved, 0).await;
    }

    #[tokio::test]
    async fn a_replayed_500_with_the_object_created_is_a_replayed_failure() {
        check_saved_500(FaultKind::ApplyThenFailSaved, 1).await;
    }

    #[tokio::test]
    async fn a_replayed_decline_is_still_a_decline() {
        let sim = Sim::start().await;
        let provider = provider(&sim, None);
        let mut new = attempt("replayed-decline");
        new.params.payment_method = PaymentMethodId::parse("pm_card_chargeDeclined").unwrap();
        for _ in 0..2 {
            match provider.create_payment(create_request(&new)).await.unwrap() {
                chargeguard::provider::CreateOutcome::Declined { failure, .. } => {
                    assert_eq!(failure.code, "card_declined");
                    assert!(failure.message.ends_with("(decline_code: generic_decline)"), "{failure:?}");
                }
                other => panic!("expected a decline, got {other:?}"),
            }
        }
        assert!(sim.control.requests().await.unwrap()[1].replayed);
    }

    #[tokio::test]
    async fn an_answer_over_the_body_limit_is_refused_naming_the_limit() {
        let sim = Sim::start().await;
        let tiny = provider(&sim, Some(512));
        let new = attempt("body-limit");
        let error = create(&tiny, &new).await.unwrap_err();
        assert!(
            matches!(&error, ProviderError::OutcomeUnknown(message)
                if message.contains("provider.response_body_bytes_max (512 bytes)") && message.contains("may have executed")),
            "{error:?}"
        );
        assert_eq!(sim.control.ledger().await.unwrap().payment_intents.len(), 1, "the create did execute");

        let now = sim.control.now().await.unwrap();
        for _ in 0..20 {
            sim.control
                .seed_payment_intent(SeedPaymentIntent {
                    amount: 1_000,
                    currency: "usd".into(),
                    status: "succeeded".into(),
                    metadata: BTreeMap::new(),
                    created: Some(now),
                })
                .await
                .unwrap();
        }
        let range = CreatedRange {
            from: chrono::DateTime::from_timestamp(now - 60, 0).unwrap(),
            to: chrono::DateTime::from_timestamp(now + 60, 0).unwrap(),
        };
        // One intent fits in 8 KiB, a page of all 21 does not.
        let small = provider(&sim, Some(8 * 1024));
        assert_eq!(small.list_payments(range, None, 1).await.unwrap().payments.len(), 1);
        let error = small.list_payments(range, None, 100).await.unwrap_err();
        assert!(
            matches!(&error, ProviderError::OutcomeUnknown(message)
                if message.contains("provider.response_body_bytes_max (8192 bytes)")),
            "{error:?}"
        );
        let default = provider(&sim, None);
        assert_eq!(default.list_payments(range, None, 100).await.unwrap().payments.len(), 21);
    }
}

mod refunds {
    //! Refunds and confirmations through the Stripe provider, against the simulator: what each
    //! answer is classified as, and what the provider then holds (counted in its ledger).

    use chargeguard::domain::{IdempotencyKey, PaymentMethodId, ProviderPaymentStatus, RefundStatus};
    use chargeguard::provider::{
        ConfirmPayment, CreateOutcome, CreateRefund, METADATA_ATTEMPT_ID, METADATA_CONSUMER, METADATA_OPERATION_KEY,
        PaymentProvider, ProviderError, RefundOutcome, StripeProvider,
    };
    use chargeguard::simulator::{Endpoint, FaultKind, FaultSpec};
    use chargeguard::store::NewAttempt;

    use super::classification::{attempt, create_request, provider};
    use crate::simulator::Sim;

    /// A succeeded payment of 1 000 (usd) and its intent id.
    async fn paid(provider: &StripeProvider, operation: &str) -> String {
        match provider.create_payment(create_request(&attempt(operation))).await.unwrap() {
            CreateOutcome::Payment(payment) => {
                assert_eq!(payment.status, ProviderPaymentStatus::Succeeded);
                payment.id
            }
            other => panic!("expected a payment, got {other:?}"),
        }
    }

    /// A refund of `payment_id` for the refund attempt `refund` (its id, keys and metadata).
    fn refund_request<'a>(refund: &'a NewAttempt, payment_id: &'a str, amount_minor: i64) -> CreateRefund<'a> {
        CreateRefund {
            attempt_id: refund.id,
            consumer: &refund.consumer,
            operation_key: &refund.operation_key,
            payment_id,
            amount_minor,
            reason: Some("requested_by_customer"),
            metadata: &refund.params.metadata,
            idempotency_key: &refund.idempotency_key,
        }
    }

    fn refunded(outcome: RefundOutcome) -> chargeguard::domain::RefundSnapshot {
        match outcome {
            RefundOutcome::Refund(refund) => refund,
            RefundOutcome::Rejected { failure } => panic!("expected a refund, got the refusal {failure:?}"),
        }
    }

    fn rejected_code(outcome: RefundOutcome) -> String {
        match outcome {
            RefundOutcome::Rejected { failure } => failure.code,
            RefundOutcome::Refund(refund) => panic!("expected a refusal, got {refund:?}"),
        }
    }

    #[tokio::test]
    async fn refunds_partial_then_full_then_refused_and_tagged_with_the_refund_attempt() {
        let sim = Sim::start().await;
        let provider = provider(&sim, None);
        let payment = paid(&provider, "order-r1").await;
        let first = attempt("order-r1:refund-1");
        let partial = refunded(provider.create_refund(refund_request(&first, &payment, 300)).await.unwrap());
        assert_eq!((partial.amount_minor, partial.refund_status()), (300, RefundStatus::Succeeded));
        assert_eq!((partial.payment_id.as_deref(), partial.currency.as_str()), (Some(payment.as_str()), "usd"));
        assert_eq!(partial.metadata.get(METADATA_ATTEMPT_ID), Some(&first.id.to_string()));
        assert_eq!(partial.metadata.get(METADATA_CONSUMER).map(String::as_str), Some("orders"));
        assert_eq!(partial.metadata.get(METADATA_OPERATION_KEY).map(String::as_str), Some("order-r1:refund-1"));
        assert_eq!(partial.metadata.get("order_id").map(String::as_str), Some("order-r1:refund-1"), "the caller's metadata");

        let over = attempt("order-r1:refund-2");
        assert_eq!(rejected_code(provider.create_refund(refund_request(&over, &payment, 701)).await.unwrap()), "amount_too_large");
        let rest = attempt("order-r1:refund-3");
        assert_eq!(refunded(provider.create_refund(refund_request(&rest, &payment, 700)).await.unwrap()).amount_minor, 700);
        let late = attempt("order-r1:refund-4");
        assert_eq!(
            rejected_code(provider.create_refund(refund_request(&late, &payment, 1)).await.unwrap()),
            "charge_already_refunded"
        );
        let ledger = sim.control.ledger().await.unwrap();
        assert_eq!(ledger.refunds.len(), 2);
        assert_eq!(ledger.refunded_minor(&payment), 1_000);
        assert_eq!(ledger.refunds[0].reason.as_deref(), Some("requested_by_customer"));
    }

    #[tokio::test]
    async fn a_refund_resent_under_its_key_is_the_same_refund_and_other_parameters_conflict() {
        let sim = Sim::start().await;
        let provider = provider(&sim, None);
        let payment = paid(&provider, "order-r2").await;
        let refund = attempt("order-r2:refund-1");
        let first = refunded(provider.create_refund(refund_request(&refund, &payment, 400)).await.unwrap());
        let again = refunded(provider.create_refund(refund_request(&refund, &payment, 400)).await.unwrap());
        assert_eq!(again, first);
        let conflict = provider.create_refund(refund_request(&refund, &payment, 401)).await.unwrap_err();
        assert!(matches!(conflict, ProviderError::KeyConflict(_)), "{conflict:?}");
        let ledger = sim.control.ledger().await.unwrap();
        assert_eq!(ledger.refunds.len(), 1);
        assert_eq!(ledger.refunded_minor(&payment), 400);
    }

    #[tokio::test]
    async fn a_refund_answered_with_a_500_is_unknown_then_a_replayed_failure() {
        let sim = Sim::start().await;
        let provider = provider(&sim, None);
        let payment = paid(&provider, "order-r3").await;
        sim.control.set_fault(Endpoint::CreateRefund, FaultSpec::next(FaultKind::ApplyThenFailSaved, 1)).await.unwrap();
        let refund = attempt("order-r3:refund-1");
        let first = provider.create_refund(refund_request(&refund, &payment, 250)).await.unwrap_err();
        assert!(matches!(first, ProviderError::OutcomeUnknown(_)), "{first:?}");
        let replayed = provider.create_refund(refund_request(&refund, &payment, 250)).await.unwrap_err();
        assert!(matches!(&replayed, ProviderError::ReplayedFailure(message) if message.contains("500")), "{replayed:?}");
        // The refund exists although both answers were failures: only the list can tell.
        let page = provider.list_refunds_for_payment(&payment, None, 10).await.unwrap();
        assert_eq!(page.refunds.len(), 1);
        assert_eq!(page.refunds[0].metadata.get(METADATA_ATTEMPT_ID), Some(&refund.id.to_string()));

        sim.control.set_fault(Endpoint::CreateRefund, FaultSpec::next(FaultKind::FailBeforeApply, 1)).await.unwrap();
        let second = attempt("order-r3:refund-2");
        let unsaved = provider.create_refund(refund_request(&second, &payment, 250)).await.unwrap_err();
        assert!(matches!(unsaved, ProviderError::OutcomeUnknown(_)), "{unsaved:?}");
        refunded(provider.create_refund(refund_request(&second, &payment, 250)).await.unwrap());
        assert_eq!(sim.control.ledger().await.unwrap().refunded_minor(&payment), 500);
    }

    #[tokio::test]
    async fn a_payments_refunds_are_listed_in_pages_and_retrieved_with_their_failure() {
        let sim = Sim::start().await;
        let provider = provider(&sim, None);
        let payment = paid(&provider, "order-r4").await;
        let other = paid(&provider, "order-r4-other").await;
        let mut created = Vec::new();
        for index in 0..5 {
            let refund = attempt(&format!("order-r4:refund-{index}"));
            created.push(refunded(provider.create_refund(refund_request(&refund, &payment, 100)).await.unwrap()).id);
            let unrelated = attempt(&format!("order-r4-other:refund-{index}"));
            provider.create_refund(refund_request(&unrelated, &other, 100)).await.unwrap();
        }
        created.reverse();
        let mut listed = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..10 {
            let page = provider.list_refunds_for_payment(&payment, cursor.as_deref(), 2).await.unwrap();
            assert!(page.refunds.len() <= 2);
            listed.extend(page.refunds.iter().map(|refund| refund.id.clone()));
            cursor = page.next_cursor;
            if cursor.is_none() {
                break;
            }
        }
        assert_eq!(listed, created, "this payment's refunds only, newest first");

        sim.control.fail_refund(&created[0], None).await.unwrap();
        let failed = provider.retrieve_refund(&created[0]).await.unwrap();
        assert_eq!(failed.refund_status(), RefundStatus::Failed);
        assert_eq!(failed.failure_reason.as_deref(), Some("expired_or_canceled_card"));
        assert!(!failed.has_returned_money());
        let missing = provider.retrieve_refund("re_missing").await.unwrap_err();
        assert!(matches!(missing, ProviderError::NotFound(_)), "{missing:?}");
    }

    #[tokio::test]
    async fn a_declined_payment_confirmed_again_succeeds_once_and_replays_under_its_key() {
        let sim = Sim::start().await;
        let provider = provider(&sim, None);
        let mut first = attempt("order-c1");
        first.params.payment_method = PaymentMethodId::parse("pm_card_chargeDeclined").unwrap();
        let payment = match provider.create_payment(create_request(&first)).await.unwrap() {
            CreateOutcome::Declined { provider_payment_id: Some(id), .. } => id,
            other => panic!("expected a decline naming its intent, got {other:?}"),
        };
        let confirm = |payment_method: &'static str, key: &'static str| {
            let key = IdempotencyKey::from_stored(key.to_owned());
            let provider = &provider;
            let payment = payment.clone();
            async move {
                provider
                    .confirm_payment(ConfirmPayment {
                        provider_payment_id: &payment,
                        payment_method,
                        idempotency_key: &key,
                        return_url: None,
                    })
                    .await
            }
        };
        match confirm("pm_card_chargeDeclinedInsufficientFunds", "order-c1:confirm-1").await.unwrap() {
            CreateOutcome::Declined { failure, provider_payment_id } => {
                assert_eq!(provider_payment_id.as_deref(), Some(payment.as_str()));
                assert!(failure.message.contains("insufficient_funds"), "{failure:?}");
            }
            other => panic!("expected a decline, got {other:?}"),
        }
        let succeeded = match confirm("pm_card_visa", "order-c1:confirm-2").await.unwrap() {
            CreateOutcome::Payment(snapshot) => snapshot,
            other => panic!("expected a payment, got {other:?}"),
        };
        assert_eq!((succeeded.id.as_str(), succeeded.status.clone()), (payment.as_str(), ProviderPaymentStatus::Succeeded));
        assert_eq!(succeeded.amount_received_minor, 1_000);
        match confirm("pm_card_visa", "order-c1:confirm-2").await.unwrap() {
            CreateOutcome::Payment(replayed) => assert_eq!(replayed, succeeded),
            other => panic!("expected the replayed payment, got {other:?}"),
        }
        let conflict = confirm("pm_card_mastercard", "order-c1:confirm-2").await.unwrap_err();
        assert!(matches!(conflict, ProviderError::KeyConflict(_)), "{conflict:?}");
        match confirm("pm_card_mastercard", "order-c1:confirm-3").await.unwrap() {
            CreateOutcome::Rejected { failure } => assert_eq!(failure.code, "payment_intent_unexpected_state"),
            other => panic!("a succeeded payment is never confirmed again, got {other:?}"),
        }
        sim.control.set_fault(Endpoint::ConfirmPaymentIntent, FaultSpec::next(FaultKind::FailBeforeApply, 1)).await.unwrap();
        let unknown = confirm("pm_card_visa", "order-c1:confirm-4").await.unwrap_err();
        assert!(matches!(unknown, ProviderError::OutcomeUnknown(_)), "{unknown:?}");

        let ledger = sim.control.ledger().await.unwrap();
        assert_eq!(ledger.payment_intents.len(), 1);
        assert_eq!(ledger.succeeded_payment_intents().count(), 1);
        assert_eq!(ledger.payment_intents[0].confirmations_total, 3, "the create, two confirms that ran");
    }
}
