//! A next attempt of an operation (issue 16) that the store's rule did not let in as it stood:
//! the refusals a caller is told, and the cancel of the previous attempt's still-payable intent
//! when the next attempt changes what a confirm of it cannot.

use super::{Orchestrator, OrchestratorError};
use crate::domain::{AttemptId, ChargeRequest, ConsumerName, ProviderPaymentStatus};
use crate::store::InsertOutcome;

impl Orchestrator {
    /// The error for an attempt the store refused; nothing was written or sent.
    pub(super) fn refusal(&self, request: &ChargeRequest, refused: InsertOutcome) -> OrchestratorError {
        let operation_key = request.operation_key.clone();
        match refused {
            InsertOutcome::PreviousInProgress { attempt_id } => {
                OrchestratorError::PreviousAttemptInProgress { operation_key, attempt_id }
            }
            InsertOutcome::AlreadySucceeded { attempt_id } => {
                OrchestratorError::OperationAlreadySucceeded { operation_key, attempt_id }
            }
            InsertOutcome::OutOfOrder { latest_attempt } => OrchestratorError::AttemptOutOfOrder {
                operation_key,
                requested: request.attempt.get(),
                latest: latest_attempt,
            },
            // A second cancel asked for in one call: the previous attempt's row changed under
            // this call (or the cancel was not recorded); the caller retries.
            InsertOutcome::CancelPrevious { attempt_id, .. } => {
                OrchestratorError::PreviousAttemptInProgress { operation_key, attempt_id }
            }
            InsertOutcome::Inserted(attempt) | InsertOutcome::Existing(attempt) => {
                unreachable!("attempt {} was let in, not refused", attempt.id)
            }
        }
    }

    /// Cancels the previous (failed) attempt's intent at the provider and records the cancel on
    /// that attempt, before the next attempt's row is written. The order makes every crash
    /// safe: before the cancel lands nothing changed; after it lands and before it is recorded,
    /// the intent can no longer be paid and the retry cancels again (the provider refuses a
    /// second cancel, and the read shows it canceled); after it is recorded, the retry's insert
    /// sees a canceled intent and creates a new one. The next attempt's row never exists beside
    /// a payable intent of a different amount.
    pub(super) async fn cancel_previous_intent(
        &self,
        consumer: &ConsumerName,
        request: &ChargeRequest,
        attempt_id: AttemptId,
        provider_payment_id: &str,
    ) -> Result<(), OrchestratorError> {
        let unfinished = |reason: String| OrchestratorError::PreviousCancelUnfinished {
            operation_key: request.operation_key.clone(),
            attempt_id,
            reason,
        };
        let snapshot = match self.provider.cancel_payment(provider_payment_id).await {
            Ok(snapshot) => snapshot,
            // Refused (already canceled, or paid meanwhile) or unknown: read what it is now.
            Err(error) => {
                tracing::info!(%attempt_id, provider_payment_id, %error, "cancel refused; reading the intent");
                self.provider
                    .retrieve_payment(provider_payment_id)
                    .await
                    .map_err(|error| unfinished(format!("reading its intent {provider_payment_id}: {error}")))?
            }
        };
        crate::failpoints::crash_point("attempts.after_previous_cancel");
        match snapshot.status {
            ProviderPaymentStatus::Canceled => {
                self.store.record_payment_canceled(attempt_id, provider_payment_id, self.caller_time()).await?;
                // The previous attempt's row changed: a cached copy must not answer for it.
                self.outcome_cache.forget(consumer, &request.operation_key);
                tracing::info!(%attempt_id, provider_payment_id,
                    "canceled the previous attempt's intent before a new one with other terms");
                Ok(())
            }
            // Money moved on an attempt answered failed: the webhook flags it; no new attempt.
            ProviderPaymentStatus::Succeeded => Err(OrchestratorError::OperationAlreadySucceeded {
                operation_key: request.operation_key.clone(),
                attempt_id,
            }),
            other => Err(unfinished(format!("its intent {provider_payment_id} is {}", other.as_str()))),
        }
    }
}
