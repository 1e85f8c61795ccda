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

    fn provider(sim: &Sim, response_body_bytes_max: Option<usize>) -> StripeProvider {
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

    fn attempt(operation: &str) -> NewAttempt {
        let time = chargeguard::store::CallerTime { now: Utc::now(), shift: chrono::Duration::zero() };
        let owner = LeaseOwner::from_uuid(Uuid::now_v7());
        pending_attempt(operation, owner, chrono::Duration::zero(), chrono::Duration::zero(), time)
    }

    fn create_request(new: &NewAttempt) -> CreatePayment<'_> {
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
