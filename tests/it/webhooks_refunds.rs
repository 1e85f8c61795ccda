//! Refund and dispute webhooks (issue 15, SEMANTICS.md invariant 8 and its one exception)
//! through the real HTTP server, real PostgreSQL and the simulator's webhook sender; the test
//! drives the inbox worker itself (`Hooked`, from `webhooks.rs`).

use chargeguard::grpc::proto::AttemptStatus;
use chargeguard::simulator::{DisputeStatus, OpenDispute, WebhookMode};
use chargeguard::store::inbox::InboxOutcome;

use crate::support::{charge_request, status_of};
use crate::webhooks::{Hooked, attempt_record, counter, outcomes, status};

/// A succeeded charge through chargeguard, its webhooks already settled; (attempt id, intent).
async fn paid_charge(hooked: &Hooked, operation_key: &str) -> (String, String) {
    let response = hooked.app.charge(charge_request(operation_key)).await.unwrap();
    assert_eq!(status_of(&response), AttemptStatus::Succeeded);
    hooked.deliver().await;
    let attempt = response.attempt.unwrap();
    (attempt.attempt_id, attempt.provider_payment_id)
}

#[tokio::test]
async fn a_dispute_flags_the_charge_naming_it_and_its_close_adds_won_or_lost() {
    let hooked = Hooked::spawn().await;
    hooked.app.sim().set_webhook_mode(WebhookMode::Twice).await.unwrap();
    let (attempt_id, intent) = paid_charge(&hooked, "order-dispute-1").await;
    let (_, other_intent) = paid_charge(&hooked, "order-dispute-2").await;
    let disputes_before = counter(&hooked.app, "chargeguard_disputes_total{event_type=\"charge.dispute.created\"}").await;

    let dispute = hooked
        .app
        .sim()
        .open_dispute(&intent, OpenDispute { amount: Some(600), reason: Some("fraudulent".into()) })
        .await
        .unwrap();
    let dispute_id = dispute["id"].as_str().unwrap().to_owned();
    let settled = hooked.deliver().await;
    assert_eq!(
        outcomes(&settled, "charge.dispute.created"),
        [InboxOutcome::Disputed],
        "delivered twice, stored and settled once"
    );
    let attempt = hooked.app.attempt_of("order-dispute-1").await;
    assert_eq!(status(&attempt), AttemptStatus::Succeeded, "a dispute changes no state");
    assert!(attempt.needs_review);
    let record = attempt_record(&hooked, &attempt_id).await;
    let reason = record.review_reason.clone().unwrap();
    assert!(
        reason.starts_with(&format!("dispute: {dispute_id} on charge ch_"))
            && reason.ends_with("is needs_response: reason fraudulent, 6.00 usd"),
        "{reason}"
    );
    assert!(
        !hooked.app.attempt_of("order-dispute-2").await.needs_review,
        "only the disputed charge is flagged ({other_intent})"
    );
    assert_eq!(
        counter(&hooked.app, "chargeguard_disputes_total{event_type=\"charge.dispute.created\"}").await,
        disputes_before + 1.0
    );

    hooked.app.sim().close_dispute(&dispute_id, DisputeStatus::Lost).await.unwrap();
    let settled = hooked.deliver().await;
    assert_eq!(outcomes(&settled, "charge.dispute.closed"), [InboxOutcome::Disputed]);
    let reason = attempt_record(&hooked, &attempt_id).await.review_reason.unwrap();
    assert!(reason.contains("is needs_response") && reason.contains(&format!("{dispute_id} on charge")), "{reason}");
    assert!(reason.ends_with("is lost: reason fraudulent, 6.00 usd"), "the close adds its outcome: {reason}");
    assert_eq!(reason.matches("dispute: ").count(), 2, "each change once: {reason}");
}

#[tokio::test]
async fn distinct_events_for_one_dispute_change_flag_once_and_unknown_disputes_are_kept() {
    let hooked = Hooked::spawn().await;
    hooked.app.sim().set_webhook_mode(WebhookMode::DistinctDuplicates).await.unwrap();
    let (attempt_id, intent) = paid_charge(&hooked, "order-dispute-3").await;
    hooked.app.sim().open_dispute(&intent, OpenDispute::default()).await.unwrap();
    let settled = hooked.deliver().await;
    let mut created = outcomes(&settled, "charge.dispute.created");
    created.sort_by_key(|outcome| outcome.as_str());
    assert_eq!(created, [InboxOutcome::Disputed, InboxOutcome::Duplicate]);
    let reason = attempt_record(&hooked, &attempt_id).await.review_reason.unwrap();
    assert_eq!(reason.matches("dispute: ").count(), 1, "{reason}");
    assert!(reason.ends_with("reason general, 10.00 usd"), "{reason}");

    // A dispute of a payment chargeguard never made is kept, not applied to anything.
    hooked.app.sim().set_webhook_mode(WebhookMode::Normal).await.unwrap();
    let foreign = hooked
        .app
        .sim()
        .seed_payment_intent(chargeguard::simulator::SeedPaymentIntent {
            amount: 500,
            currency: "usd".into(),
            status: "succeeded".into(),
            metadata: Default::default(),
            created: None,
        })
        .await
        .unwrap();
    hooked.app.sim().open_dispute(&foreign.id, OpenDispute::default()).await.unwrap();
    let settled = hooked.deliver().await;
    assert_eq!(outcomes(&settled, "charge.dispute.created"), [InboxOutcome::UnknownObject]);
}
