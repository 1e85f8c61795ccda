//! Refund and dispute webhooks (issue 15, SEMANTICS.md invariant 8 and its one exception)
//! through the real HTTP server, a real database (both stores: `webhooks_refunds::postgres::…`,
//! `webhooks_refunds::sqlite::…`) and the simulator's webhook sender; the test drives the inbox
//! worker itself (`Hooked`, from `webhooks.rs`).

use chargeguard::domain::{Attempt, AttemptId};
use chargeguard::grpc::proto::{self, AttemptStatus};
use chargeguard::secret::Secret;
use chargeguard::simulator::{DisputeStatus, OpenDispute, RefundMode, WebhookMode};
use chargeguard::store::inbox::InboxOutcome;
use chargeguard::webhook::signature::sign;
use chargeguard::webhook::worker::SettledEvent;

use crate::support::{Backend, charge_request, on_both_backends, refund_request, status_of};
use crate::webhooks::{Hooked, SECRET, attempt_record, counter, outcomes, status};

/// A succeeded charge through chargeguard, its webhooks already settled; (attempt id, intent).
async fn paid_charge(hooked: &Hooked, operation_key: &str) -> (String, String) {
    let response = hooked.app.charge(charge_request(operation_key)).await.unwrap();
    assert_eq!(status_of(&response), AttemptStatus::Succeeded);
    hooked.deliver().await;
    let attempt = response.attempt.unwrap();
    (attempt.attempt_id, attempt.provider_payment_id)
}

async fn a_dispute_flags_the_charge_naming_it_and_its_close_adds_won_or_lost(backend: Backend) {
    let hooked = Hooked::spawn_on(backend).await;
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

async fn distinct_events_for_one_dispute_change_flag_once_and_unknown_disputes_are_kept(backend: Backend) {
    let hooked = Hooked::spawn_on(backend).await;
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

/// A refund of `amount` (all that is left when `None`) of the charge `charge_key`, through the
/// real Refund RPC; the refund attempt.
async fn refunded(hooked: &Hooked, refund_key: &str, charge_key: &str, amount: Option<i64>) -> proto::Attempt {
    hooked
        .app
        .refund(refund_request(refund_key, charge_key, amount))
        .await
        .unwrap()
        .attempt
        .unwrap()
}

/// The refund attempt as the store reads it.
async fn refund_record(hooked: &Hooked, attempt_id: &str) -> Attempt {
    let id = AttemptId::from_uuid(attempt_id.parse().unwrap());
    hooked.store.find_attempt_for_refund("re_none", Some(id)).await.unwrap().unwrap()
}

fn refund_outcomes(settled: &[SettledEvent]) -> Vec<(String, InboxOutcome)> {
    settled
        .iter()
        .filter(|s| s.event_type.starts_with("refund.") || s.event_type.starts_with("charge.refund"))
        .map(|s| (s.event_type.clone(), s.outcome))
        .collect()
}

async fn a_pending_refund_settled_by_duplicated_or_distinct_events_moves_once(backend: Backend) {
    for (index, mode) in [WebhookMode::Twice, WebhookMode::DistinctDuplicates].into_iter().enumerate() {
        let hooked = Hooked::spawn_on(backend).await;
        let charge_key = format!("order-rw-{index}:charge");
        let (_, intent) = paid_charge(&hooked, &charge_key).await;
        hooked.app.sim().set_webhook_mode(mode).await.unwrap();
        hooked.app.sim().set_refund_mode(RefundMode::Pending).await.unwrap();
        let refund = refunded(&hooked, &format!("order-rw-{index}:refund-1"), &charge_key, Some(400)).await;
        assert_eq!(status(&refund), AttemptStatus::Pending, "{mode:?}: the provider holds it pending");
        let settled = hooked.deliver().await;
        assert!(
            refund_outcomes(&settled).iter().all(|(_, outcome)| matches!(outcome, InboxOutcome::Stale | InboxOutcome::Duplicate)),
            "{mode:?}: pending moves nothing: {settled:?}"
        );

        hooked.app.sim().settle_refund(&refund.provider_payment_id).await.unwrap();
        let settled = hooked.deliver().await;
        let mut updated = outcomes(&settled, "refund.updated");
        updated.sort_by_key(|outcome| outcome.as_str());
        let expected = match mode {
            // Same event id twice: stored once.
            WebhookMode::Twice => vec![InboxOutcome::Applied],
            _ => vec![InboxOutcome::Applied, InboxOutcome::Duplicate],
        };
        assert_eq!(updated, expected, "{mode:?}");
        let record = refund_record(&hooked, &refund.attempt_id).await;
        assert_eq!(record.status, chargeguard::domain::AttemptStatus::Succeeded, "{mode:?}");
        assert_eq!(record.failed_after_success_at, None);
        let charge = hooked.app.attempt_of(&charge_key).await;
        let ledger = hooked.app.sim().ledger().await.unwrap();
        assert_eq!((charge.refunded_minor, charge.refund_pending_minor), (400, 0), "{mode:?}");
        assert_eq!(ledger.refunded_minor(&intent), 400);
        // charge.refunded lists no refunds in this API version: recorded, nothing to apply.
        assert!(outcomes(&settled, "charge.refunded").iter().all(|o| matches!(o, InboxOutcome::Stale | InboxOutcome::Duplicate)));
    }
}

async fn shuffled_refund_events_leave_each_refund_where_the_provider_has_it(backend: Backend) {
    let hooked = Hooked::spawn_on(backend).await;
    let (_, intent) = paid_charge(&hooked, "order-rs:charge").await;
    hooked.app.sim().set_webhook_mode(WebhookMode::Shuffle).await.unwrap();
    hooked.app.sim().set_refund_mode(RefundMode::Pending).await.unwrap();
    let kept = refunded(&hooked, "order-rs:refund-1", "order-rs:charge", Some(300)).await;
    let lost = refunded(&hooked, "order-rs:refund-2", "order-rs:charge", Some(500)).await;
    hooked.app.sim().settle_refund(&kept.provider_payment_id).await.unwrap();
    hooked.app.sim().fail_refund(&lost.provider_payment_id, Some("lost_or_stolen_card")).await.unwrap();
    hooked.deliver().await;

    let kept = refund_record(&hooked, &kept.attempt_id).await;
    assert_eq!(kept.status, chargeguard::domain::AttemptStatus::Succeeded);
    let lost = refund_record(&hooked, &lost.attempt_id).await;
    assert_eq!(lost.status, chargeguard::domain::AttemptStatus::Failed);
    assert_eq!(lost.failure.as_ref().map(|f| f.code.as_str()), Some("lost_or_stolen_card"));
    assert_eq!(lost.failed_after_success_at, None, "it never succeeded");
    let charge = hooked.app.attempt_of("order-rs:charge").await;
    assert_eq!((charge.refunded_minor, charge.refund_pending_minor), (300, 0));
    assert_eq!(hooked.app.sim().ledger().await.unwrap().refunded_minor(&intent), 300);
}

async fn a_refund_the_provider_fails_after_success_becomes_failed_counted_and_the_charge_refunded_goes_down(backend: Backend) {
    let hooked = Hooked::spawn_on(backend).await;
    let (_, intent) = paid_charge(&hooked, "order-rf:charge").await;
    let refund = refunded(&hooked, "order-rf:refund-1", "order-rf:charge", Some(400)).await;
    assert_eq!(status(&refund), AttemptStatus::Succeeded);
    let settled = hooked.deliver().await;
    assert_eq!(outcomes(&settled, "refund.created"), [InboxOutcome::Stale], "the call recorded it");
    assert_eq!(hooked.app.attempt_of("order-rf:charge").await.refunded_minor, 400);
    let metric = "chargeguard_refunds_failed_after_success_total";
    let failed_before = counter(&hooked.app, metric).await;

    hooked.app.sim().fail_refund(&refund.provider_payment_id, Some("expired_or_canceled_card")).await.unwrap();
    let settled = hooked.deliver().await;
    let failures = refund_outcomes(&settled);
    assert_eq!(
        failures.iter().filter(|(_, outcome)| *outcome == InboxOutcome::FailedAfterSuccess).count(),
        1,
        "the first failure event moves it, the others find it failed: {failures:?}"
    );
    assert_eq!(failures.len(), 3, "refund.updated, refund.failed, charge.refund.updated: {failures:?}");
    let record = refund_record(&hooked, &refund.attempt_id).await;
    assert_eq!(record.status, chargeguard::domain::AttemptStatus::Failed);
    assert!(record.failed_after_success_at.is_some());
    assert_eq!(record.failure.as_ref().map(|f| f.code.as_str()), Some("expired_or_canceled_card"));
    assert_eq!(counter(&hooked.app, metric).await, failed_before + 1.0);
    let charge = hooked.app.attempt_of("order-rf:charge").await;
    assert_eq!(charge.refunded_minor, 0, "the money went back to the merchant");
    assert_eq!(hooked.app.sim().ledger().await.unwrap().refunded_minor(&intent), 0);
    let shown = hooked.app.attempt_of("order-rf:refund-1").await;
    assert!(shown.refund_failed_after_success, "the consumer sees it");

    // A later (or replayed) report of success never moves it back.
    let body = serde_json::json!({
        "id": "evt_replayed_success", "object": "event", "type": "refund.updated",
        "created": chrono::Utc::now().timestamp(), "api_version": "2026-09-30.endive", "livemode": false,
        "data": {"object": {
            "id": refund.provider_payment_id, "object": "refund", "status": "succeeded", "amount": 400,
            "currency": "usd", "created": chrono::Utc::now().timestamp(), "payment_intent": intent,
            "metadata": {"chargeguard_attempt_id": refund.attempt_id}, "failure_reason": null,
        }},
    })
    .to_string();
    let signature = sign(&Secret::new(SECRET), chrono::Utc::now().timestamp(), body.as_bytes());
    assert_eq!(hooked.post(&body, Some(signature)).await, reqwest::StatusCode::OK);
    let settled = hooked.drain().await;
    assert!(
        matches!(outcomes(&settled, "refund.updated")[..], [InboxOutcome::Stale | InboxOutcome::Duplicate]),
        "{settled:?}"
    );
    let record = refund_record(&hooked, &refund.attempt_id).await;
    assert_eq!(record.status, chargeguard::domain::AttemptStatus::Failed, "never back to succeeded");
    assert_eq!(hooked.app.attempt_of("order-rf:charge").await.refunded_minor, 0);
}

on_both_backends!(
    a_dispute_flags_the_charge_naming_it_and_its_close_adds_won_or_lost,
    distinct_events_for_one_dispute_change_flag_once_and_unknown_disputes_are_kept,
    a_pending_refund_settled_by_duplicated_or_distinct_events_moves_once,
    shuffled_refund_events_leave_each_refund_where_the_provider_has_it,
    a_refund_the_provider_fails_after_success_becomes_failed_counted_and_the_charge_refunded_goes_down,
);
