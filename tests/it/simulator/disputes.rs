//! Disputes opened and closed by control calls: the charge shows `disputed`, the ledger holds
//! the dispute, and a disputed charge refuses refunds as Stripe does.

use chargeguard::simulator::{DisputeStatus, OpenDispute};
use stripe::ApiErrorsCode;
use stripe_core::refund::CreateRefund;

use super::{Sim, api_error, charge};

#[tokio::test]
async fn a_dispute_marks_the_charge_blocks_refunds_and_closes_once() {
    let sim = Sim::start().await;
    let intent = charge(2_500, "pm_card_visa", "disputed").send(&sim.stripe).await.unwrap();
    let opened = sim
        .control
        .open_dispute(intent.id.as_str(), OpenDispute { amount: None, reason: Some("fraudulent".into()) })
        .await
        .unwrap();
    let dispute_id = opened["id"].as_str().unwrap().to_owned();
    assert!(dispute_id.starts_with("dp_"), "{dispute_id}");
    assert_eq!(opened["object"], "dispute");
    assert_eq!((opened["amount"].as_i64(), opened["status"].as_str()), (Some(2_500), Some("needs_response")));
    assert_eq!((opened["payment_intent"].as_str(), opened["reason"].as_str()), (Some(intent.id.as_str()), Some("fraudulent")));
    let charge_id = opened["charge"].as_str().unwrap();
    assert!(charge_id.starts_with("ch_"));

    let (refused, status) = api_error(
        CreateRefund::new().payment_intent(intent.id.as_str()).send(&sim.stripe).await.unwrap_err(),
    );
    assert_eq!((status, refused.code), (400, Some(ApiErrorsCode::ChargeDisputed)));

    let closed = sim.control.close_dispute(&dispute_id, DisputeStatus::Lost).await.unwrap();
    assert_eq!(closed["status"], "lost");
    assert!(sim.control.close_dispute(&dispute_id, DisputeStatus::Won).await.unwrap_err().to_string().contains("already lost"));

    let ledger = sim.control.ledger().await.unwrap();
    assert_eq!(ledger.disputes.len(), 1);
    let entry = &ledger.disputes[0];
    assert_eq!((entry.id.as_str(), entry.payment_intent.as_str(), entry.charge.as_str()), (dispute_id.as_str(), intent.id.as_str(), charge_id));
    assert_eq!((entry.amount, entry.status.as_str(), entry.reason.as_str()), (2_500, "lost", "fraudulent"));
    let events: Vec<(String, String)> =
        sim.control.events().await.unwrap().into_iter().map(|event| (event.event_type, event.object_id)).collect();
    assert_eq!(
        events[1..],
        [("charge.dispute.created".to_owned(), dispute_id.clone()), ("charge.dispute.closed".to_owned(), dispute_id.clone())]
    );
}

#[tokio::test]
async fn a_won_dispute_lets_the_charge_be_refunded_and_bad_controls_are_refused() {
    let sim = Sim::start().await;
    let intent = charge(1_000, "pm_card_visa", "won").send(&sim.stripe).await.unwrap();
    let partial = sim
        .control
        .open_dispute(intent.id.as_str(), OpenDispute { amount: Some(400), reason: None })
        .await
        .unwrap();
    assert_eq!((partial["amount"].as_i64(), partial["reason"].as_str()), (Some(400), Some("general")));
    sim.control.close_dispute(partial["id"].as_str().unwrap(), DisputeStatus::Won).await.unwrap();
    let refunded = CreateRefund::new().payment_intent(intent.id.as_str()).send(&sim.stripe).await.unwrap();
    assert_eq!(refunded.amount, 1_000);

    let open = |amount: Option<i64>, reason: Option<&str>| OpenDispute { amount, reason: reason.map(str::to_owned) };
    let too_much = sim.control.open_dispute(intent.id.as_str(), open(Some(1_001), None)).await.unwrap_err();
    assert!(too_much.to_string().contains("amount must be 1 to 1000"), "{too_much}");
    let reason = sim.control.open_dispute(intent.id.as_str(), open(None, Some("bored"))).await.unwrap_err();
    assert!(reason.to_string().contains("unknown dispute reason"), "{reason}");
    let (declined, _) = api_error(charge(500, "pm_card_chargeDeclined", "d").send(&sim.stripe).await.unwrap_err());
    let declined = declined.payment_intent.unwrap();
    let unpaid = sim.control.open_dispute(declined.id.as_str(), open(None, None)).await.unwrap_err();
    assert!(unpaid.to_string().contains("no successful charge to dispute"), "{unpaid}");
    assert!(sim.control.close_dispute("dp_missing", DisputeStatus::Won).await.is_err());
    assert_eq!(sim.control.ledger().await.unwrap().disputes.len(), 1);
}
