//! A round for a refund attempt: the same steps as a charge's (`domain::choose_recovery_step`
//! reads only the row), made with the provider's refund calls. Stripe has no refund search, so
//! past the key window the charge's refunds are listed, paged like the charge lookup, and the
//! one whose metadata names this attempt is adopted.

use super::pages::Listed;
use super::{LIST_PAGE_SIZE, Observation, RoundObservation};
use crate::domain::{Attempt, Failure, ListProgress, RecoveryStep, RefundSnapshot, resolve_refund_snapshot};
use crate::orchestrator::{Orchestrator, OrchestratorError};
use crate::provider::{CreateRefund, METADATA_ATTEMPT_ID, ProviderError, RefundOutcome};
use crate::store::StoreError;
use crate::domain::LeaseOwner;
use crate::domain::review;

impl Observation {
    fn of_refund(snapshot: &RefundSnapshot, attempt: &Attempt) -> Self {
        Self {
            provider_payment_id: Some(snapshot.id.clone()),
            provider_status: Some(snapshot.status.clone()),
            resolution: resolve_refund_snapshot(snapshot, &attempt.params),
        }
    }
}

impl Orchestrator {
    pub(super) async fn observe_refund(
        &self,
        attempt: &Attempt,
        step: &RecoveryStep,
        owner: LeaseOwner,
    ) -> Result<RoundObservation, OrchestratorError> {
        Ok(match step {
            RecoveryStep::ResendCreate => {
                let payment_id = self.refunded_payment_id(attempt).await?;
                match self.send_refund_create(attempt, &payment_id).await {
                    // As for a charge: the saved failure is all this key will ever get; look the
                    // refund up instead (never conclusive inside the window).
                    Err(ProviderError::ReplayedFailure(message)) => {
                        tracing::warn!(attempt_id = %attempt.id, %message,
                            "the provider replays a saved failure for this refund key; listing the charge's refunds instead");
                        self.look_up_refund(attempt, &payment_id, owner, false).await?.after_replayed_failure(message)
                    }
                    outcome => RoundObservation::of_call(outcome),
                }
            }
            // Stripe cancels only refunds awaiting action and chargeguard never asks it to: a
            // refund's object is read, whatever its age.
            RecoveryStep::Retrieve { provider_payment_id } | RecoveryStep::Cancel { provider_payment_id } => {
                RoundObservation::of_call(
                    self.provider
                        .retrieve_refund(provider_payment_id)
                        .await
                        .map(|snapshot| Observation::of_refund(&snapshot, attempt)),
                )
            }
            RecoveryStep::FindByMetadata { conclusive } => {
                let payment_id = self.refunded_payment_id(attempt).await?;
                self.look_up_refund(attempt, &payment_id, owner, *conclusive).await?
            }
            // Only a charge attempt confirms an earlier attempt's intent again; a refund row never
            // carries `confirms_payment_id`.
            RecoveryStep::RetrieveConfirmed { .. } => {
                return Err(OrchestratorError::Store(StoreError::Corrupt(format!(
                    "refund {} names a payment it confirms",
                    attempt.id
                ))));
            }
        })
    }

    /// The provider payment of the refund's charge: a succeeded charge always has one.
    async fn refunded_payment_id(&self, attempt: &Attempt) -> Result<String, OrchestratorError> {
        let parent_id = attempt
            .parent_attempt_id
            .ok_or_else(|| StoreError::Corrupt(format!("refund {} has no parent charge", attempt.id)))?;
        let parent = self.store.find_by_id(None, parent_id).await?.ok_or(OrchestratorError::NotFound)?;
        parent.provider_payment_id.ok_or_else(|| {
            OrchestratorError::Store(StoreError::Corrupt(format!(
                "charge {parent_id} refunded by {} has no provider payment",
                attempt.id
            )))
        })
    }

    async fn send_refund_create(&self, attempt: &Attempt, payment_id: &str) -> Result<Observation, ProviderError> {
        let request = CreateRefund {
            attempt_id: attempt.id,
            consumer: &attempt.consumer,
            operation_key: &attempt.operation_key,
            payment_id,
            amount_minor: attempt.params.amount_minor,
            reason: attempt.refund_reason.map(|reason| reason.as_str()),
            metadata: &attempt.params.metadata,
            idempotency_key: &attempt.idempotency_key,
        };
        Ok(match self.provider.create_refund(request).await? {
            RefundOutcome::Refund(snapshot) => Observation::of_refund(&snapshot, attempt),
            // Over-refund at the provider, charge_already_refunded, disputed: nothing moved.
            RefundOutcome::Rejected { failure } => Observation::failed(failure, None),
        })
    }

    /// Lists the charge's refunds (the list does not lag) from where the last round stopped, at
    /// most `lookup_pages_per_round` pages, renewing the lease and saving the position between
    /// pages. Nothing found ends the refund `expired` only when `conclusive` (the window is over
    /// on every clock) and the listing is complete.
    async fn look_up_refund(
        &self,
        attempt: &Attempt,
        payment_id: &str,
        owner: LeaseOwner,
        conclusive: bool,
    ) -> Result<RoundObservation, OrchestratorError> {
        let attempt_id = attempt.id.to_string();
        let belongs =
            |refund: &RefundSnapshot| refund.metadata.get(METADATA_ATTEMPT_ID).is_some_and(|id| *id == attempt_id);
        let list_page = |cursor: Option<String>| async move {
            let page = self.provider.list_refunds_for_payment(payment_id, cursor.as_deref(), LIST_PAGE_SIZE).await?;
            Ok((page.refunds, page.next_cursor))
        };
        let calls_made = match self.list_pages(attempt, owner, 0, list_page, belongs).await? {
            (Listed::Found(found), calls_made) => return Ok(adopted_refund(found, attempt, calls_made)),
            (Listed::Stopped(observation), _) => return Ok(observation),
            (Listed::Complete, calls_made) => calls_made,
        };
        let outcome = if conclusive {
            Ok(Observation::failed(expired_refund(), None))
        } else {
            Err(ProviderError::OutcomeUnknown(
                "no refund found for this attempt yet; the key is not sent again, and the refund \
                 expires only once its key window is over"
                    .to_owned(),
            ))
        };
        Ok(RoundObservation::after_complete_listing(calls_made, outcome))
    }
}

fn expired_refund() -> Failure {
    Failure {
        code: "expired".to_owned(),
        message: "the provider has no refund for this attempt and its idempotency key may have \
                  expired; nothing was refunded"
            .to_owned(),
    }
}

/// Adopts the refund found for the attempt; more than one is a double refund, adopted (the
/// money moved) and flagged for a person.
fn adopted_refund(mut found: Vec<RefundSnapshot>, attempt: &Attempt, calls_made: u32) -> RoundObservation {
    found.sort_by(|a, b| a.created.cmp(&b.created).then_with(|| a.id.cmp(&b.id)));
    found.dedup_by(|a, b| a.id == b.id);
    let double_refund = (found.len() > 1).then(|| {
        let ids: Vec<&str> = found.iter().map(|refund| refund.id.as_str()).collect();
        format!("{}: {} provider refunds for one attempt: {}", review::DOUBLE_REFUND, ids.len(), ids.join(", "))
    });
    let preferred = found.iter().position(RefundSnapshot::has_returned_money).unwrap_or(0);
    let mut observation = Observation::of_refund(&found[preferred], attempt);
    if double_refund.is_some() {
        observation.resolution.review_reason = double_refund;
    }
    RoundObservation {
        calls_made,
        lookup_progress: Some(ListProgress::NotStarted),
        ..RoundObservation::of_call(Ok(observation))
    }
}
