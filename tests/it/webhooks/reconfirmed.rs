//! Webhooks for an operation with several attempts (issue 16): an event for an intent moves the
//! attempt that last sent it — for a re-confirmed intent the latest attempt naming it — and an
//! earlier attempt keeps its decline; an event for an earlier attempt's canceled intent never
//! moves a later attempt, and one that shows it succeeded is flagged on the earlier attempt.

use chargeguard::grpc::proto::{self, AttemptStatus};
use chargeguard::secret::Secret;
use chargeguard::simulator::{Endpoint, FaultKind, FaultSpec};
use chargeguard::store::inbox::InboxOutcome;
use chargeguard::webhook::signature::sign;

use super::{Hooked, SECRET, attempt_record, intent_event, outcomes, status, wall_now};
use crate::support::attempt_request as attempt;
use crate::support::{Backend, on_both_backends};

async fn declined_first_attempt(hooked: &Hooked, operation: &str) -> proto::Attempt {
    let first = hooked.app.charge(attempt(operation, 1, "pm_card_chargeDeclined")).await.unwrap().attempt.unwrap();
    assert_eq!(status(&first), AttemptStatus::Failed);
    first
}

/// The gRPC view of one attempt, by id.
async fn attempt_by_id(hooked: &Hooked, attempt_id: &str) -> chargeguard::domain::Attempt {
    attempt_record(hooked, attempt_id).await
}

async fn a_reconfirmed_intent_moves_the_attempt_that_confirmed_it_and_the_earlier_keeps_its_decline(backend: Backend) {
    let hooked = Hooked::spawn_on(backend).await;
    let first = declined_first_attempt(&hooked, "hooked-again-1").await;
    // Attempt 2's confirm is applied (paid) and its answer lost: only the webhook can tell.
    let lost = FaultSpec::next(FaultKind::ApplyThenDrop, 1);
    hooked.app.sim().set_fault(Endpoint::ConfirmPaymentIntent, lost).await.unwrap();
    let error = hooked.app.charge(attempt("hooked-again-1", 2, "pm_card_visa")).await.unwrap_err();
    assert_eq!(error.code(), tonic::Code::Unavailable, "{error:?}");
    let second = hooked.app.attempt_of("hooked-again-1").await;
    assert_eq!((second.attempt_number, status(&second)), (2, AttemptStatus::Pending));
    assert!(second.provider_payment_id.is_empty(), "the confirm's answer was lost");

    // Attempt 1's decline arrives late, beside the success of attempt 2's confirm.
    let settled = hooked.deliver().await;
    assert_eq!(outcomes(&settled, "payment_intent.payment_failed"), vec![InboxOutcome::Stale], "{settled:?}");
    assert_eq!(outcomes(&settled, "payment_intent.succeeded"), vec![InboxOutcome::Applied], "{settled:?}");

    let second = attempt_by_id(&hooked, &second.attempt_id).await;
    assert_eq!(second.status, chargeguard::domain::AttemptStatus::Succeeded);
    assert_eq!(second.provider_payment_id.as_deref(), Some(first.provider_payment_id.as_str()));
    let first = attempt_by_id(&hooked, &first.attempt_id).await;
    assert_eq!(first.status, chargeguard::domain::AttemptStatus::Failed, "attempt 1 keeps its decline");
    assert_eq!(first.review_reason, None, "the success was attempt 2's: nothing to flag on attempt 1");
    let intents = hooked.app.sim().ledger().await.unwrap().payment_intents;
    assert_eq!(intents.iter().filter(|intent| intent.status == "succeeded").count(), 1);
}

async fn an_event_for_an_earlier_attempts_canceled_intent_never_moves_a_later_attempt(backend: Backend) {
    let hooked = Hooked::spawn_on(backend).await;
    let first = declined_first_attempt(&hooked, "hooked-again-2").await;
    // Attempt 2 changes the amount: attempt 1's intent is canceled, attempt 2 creates its own,
    // whose answer is lost.
    hooked.lose_create_answers(1).await;
    let mut changed = attempt("hooked-again-2", 2, "pm_card_visa");
    changed.amount_minor = 2_000;
    hooked.app.charge(changed).await.unwrap_err();
    let second = hooked.app.attempt_of("hooked-again-2").await;
    assert_eq!((second.attempt_number, status(&second)), (2, AttemptStatus::Pending));

    // A success reported for attempt 1's canceled intent (hand-signed: the simulator cannot pay
    // a canceled intent) is attempt 1's news: flagged there, never attempt 2's.
    let forged = intent_event(
        "evt_canceled_paid",
        "payment_intent.succeeded",
        &first.provider_payment_id,
        "succeeded",
        &first.attempt_id,
    );
    let signature = sign(&Secret::new(SECRET), wall_now(), forged.as_bytes());
    assert_eq!(hooked.post(&forged, Some(signature)).await, reqwest::StatusCode::OK);
    // With it, the simulator's own events: attempt 1's decline and cancel (no move), and the
    // success of attempt 2's own intent.
    hooked.flush().await;
    let settled = hooked.drain().await;
    let forged = settled.iter().find(|s| s.event_id == "evt_canceled_paid").expect("settled");
    assert_eq!(forged.outcome, InboxOutcome::Flagged, "{settled:?}");
    assert_eq!(outcomes(&settled, "payment_intent.canceled"), vec![InboxOutcome::Stale], "{settled:?}");
    let own_success: Vec<_> = settled
        .iter()
        .filter(|s| s.event_type == "payment_intent.succeeded" && s.event_id != "evt_canceled_paid")
        .map(|s| s.outcome)
        .collect();
    assert_eq!(own_success, vec![InboxOutcome::Applied], "{settled:?}");

    let earlier = attempt_by_id(&hooked, &first.attempt_id).await;
    assert_eq!(earlier.status, chargeguard::domain::AttemptStatus::Failed);
    assert!(earlier.review_reason.unwrap_or_default().contains("succeeded_after_failure"));
    let later = attempt_by_id(&hooked, &second.attempt_id).await;
    assert_eq!(later.status, chargeguard::domain::AttemptStatus::Succeeded, "moved by its own intent only");
    assert_eq!(later.review_reason, None, "never flagged by attempt 1's news");
    assert_ne!(later.provider_payment_id.as_deref(), Some(first.provider_payment_id.as_str()));
}

on_both_backends!(
    a_reconfirmed_intent_moves_the_attempt_that_confirmed_it_and_the_earlier_keeps_its_decline,
    an_event_for_an_earlier_attempts_canceled_intent_never_moves_a_later_attempt,
);
