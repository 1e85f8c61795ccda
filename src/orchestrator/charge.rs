//! The charge flow of SEMANTICS.md: commit the pending row, call the provider with the derived
//! key, record the result, answer. A repeated call returns the stored outcome or reconciles.

use std::time::{Duration, Instant};

use uuid::Uuid;

use super::{Orchestrator, OrchestratorError, chrono_duration};
use crate::domain::{
    Attempt, AttemptId, ChargeRequest, ConsumerName, Fingerprint, LeaseOwner, derive_idempotency_key,
};
use crate::store::{InsertOutcome, Leased, NewAttempt};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChargeOutcome {
    /// This call made the provider call that decided the attempt.
    Applied,
    /// Already decided, or decided by a concurrent call; this call called nothing.
    Duplicate,
    /// A pending attempt from an earlier call was completed by this call.
    Reconciled,
}

impl ChargeOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            ChargeOutcome::Applied => "applied",
            ChargeOutcome::Duplicate => "duplicate",
            ChargeOutcome::Reconciled => "reconciled",
        }
    }
}

#[derive(Debug)]
pub struct ChargeReply {
    pub attempt: Attempt,
    pub outcome: ChargeOutcome,
}

/// First re-read of a row another call holds; doubles up to the maximum.
const WAIT_POLL_INITIAL: Duration = Duration::from_millis(20);
const WAIT_POLL_MAX: Duration = Duration::from_millis(250);

/// Cancels of the previous attempt's intent one call makes before it inserts its own attempt:
/// one is enough (the cancel is recorded before the insert is tried again); a second refusal
/// means the row changed under the call, and the caller retries.
const CANCELS_PER_CALL_MAX: u32 = 1;

impl Orchestrator {
    #[tracing::instrument(name = "charge", skip_all,
        fields(consumer = %consumer, operation_key = %request.operation_key, attempt_id))]
    pub async fn charge(
        &self,
        consumer: &ConsumerName,
        request: ChargeRequest,
    ) -> Result<ChargeReply, OrchestratorError> {
        let reply = self.charge_inner(consumer, request).await;
        let label = match &reply {
            Ok(reply) => reply.outcome.as_str(),
            Err(OrchestratorError::OutcomeUnknown { .. }) => "unknown",
            Err(OrchestratorError::InProgress { .. }) => "in_progress",
            Err(OrchestratorError::ProviderReplaysFailure { .. }) => "replayed_failure",
            Err(OrchestratorError::FingerprintMismatch { .. }) => "mismatch",
            Err(OrchestratorError::PreviousAttemptInProgress { .. } | OrchestratorError::PreviousCancelUnfinished { .. }) => {
                "previous_in_progress"
            }
            Err(OrchestratorError::OperationAlreadySucceeded { .. }) => "already_succeeded",
            Err(OrchestratorError::AttemptOutOfOrder { .. }) => "out_of_order",
            Err(_) => "error",
        };
        metrics::counter!("chargeguard_charges_total", "outcome" => label).increment(1);
        // Inside the span: the line carries consumer, operation_key and attempt_id.
        tracing::info!(outcome = label, "charge answered");
        reply
    }

    async fn charge_inner(
        &self,
        consumer: &ConsumerName,
        request: ChargeRequest,
    ) -> Result<ChargeReply, OrchestratorError> {
        let fingerprint = request.params.fingerprint();
        // The cache holds the operation's latest decided attempt; another attempt is read.
        let cached = self.outcome_cache.get(consumer, &request.operation_key);
        if let Some(decided) = cached.filter(|decided| decided.generation == request.attempt.generation()) {
            tracing::Span::current().record("attempt_id", tracing::field::display(decided.id));
            return self.charge_existing(&request, &fingerprint, decided).await;
        }
        let reply = self.charge_from_store(consumer, &request, &fingerprint).await;
        if let Ok(reply) = &reply {
            self.outcome_cache.remember(&reply.attempt);
        }
        reply
    }

    async fn charge_from_store(
        &self,
        consumer: &ConsumerName,
        request: &ChargeRequest,
        fingerprint: &Fingerprint,
    ) -> Result<ChargeReply, OrchestratorError> {
        let owner = self.new_lease_owner();
        let generation = request.attempt.generation();
        let mut new = NewAttempt {
            id: AttemptId::from_uuid(Uuid::now_v7()),
            consumer: consumer.clone(),
            operation_key: request.operation_key.clone(),
            params: request.params.clone(),
            fingerprint: fingerprint.clone(),
            provider: self.provider.name(),
            idempotency_key: derive_idempotency_key(consumer, &request.operation_key, generation),
            generation,
            return_url: self.settings.return_url.clone(),
            lease_owner: owner,
            lease_duration: chrono_duration(self.settings.lease_duration),
            recovery_grace: chrono_duration(self.settings.recovery_grace),
            time: self.caller_time(),
        };
        crate::failpoints::crash_point("charge.before_pending_commit");
        let mut cancels_left = CANCELS_PER_CALL_MAX;
        loop {
            return match self.store.insert_pending(&new).await? {
                InsertOutcome::Inserted(attempt) => {
                    tracing::Span::current().record("attempt_id", tracing::field::display(attempt.id));
                    crate::failpoints::crash_point("charge.after_pending_commit");
                    self.answer_inserted(attempt, owner, "charge.after_record").await
                }
                InsertOutcome::Existing(attempt) => {
                    tracing::Span::current().record("attempt_id", tracing::field::display(attempt.id));
                    self.charge_existing(request, fingerprint, attempt).await
                }
                InsertOutcome::CancelPrevious { attempt_id, provider_payment_id } if cancels_left > 0 => {
                    cancels_left -= 1;
                    self.cancel_previous_intent(consumer, request, attempt_id, &provider_payment_id).await?;
                    new.time = self.caller_time();
                    continue;
                }
                refused => Err(self.refusal(request, refused)),
            };
        }
    }

    async fn charge_existing(
        &self,
        request: &ChargeRequest,
        fingerprint: &Fingerprint,
        attempt: Attempt,
    ) -> Result<ChargeReply, OrchestratorError> {
        self.answer_existing(fingerprint, attempt, |stored| stored.params.differing_fields(&request.params)).await
    }

    /// The first round of a row this call just inserted (and holds the lease of), answered as
    /// `APPLIED` when this round decided it. Charges and refunds alike; `after_record` names the
    /// crash point between the recorded result and the answer.
    pub(super) async fn answer_inserted(
        &self,
        attempt: Attempt,
        owner: LeaseOwner,
        after_record: &'static str,
    ) -> Result<ChargeReply, OrchestratorError> {
        // The row was just written on the database's clock: that write is the database's
        // reading for this round's decision.
        let database_now = attempt.updated_at;
        let end = self.run_round(Leased { attempt, database_now }, owner).await?;
        let (attempt, writer) = answered(end)?;
        crate::failpoints::crash_point(after_record);
        let outcome = match writer {
            RoundWriter::ThisRound => ChargeOutcome::Applied,
            RoundWriter::Other => ChargeOutcome::Duplicate,
        };
        Ok(ChargeReply { attempt, outcome })
    }

    /// The operation was requested before: answer from the row, reconcile it, or wait for the
    /// call that holds it. `differing_fields` names, for a mismatch error, what the request
    /// changed against the stored row (charges and refunds compare differently).
    pub(super) async fn answer_existing(
        &self,
        fingerprint: &Fingerprint,
        mut attempt: Attempt,
        differing_fields: impl FnOnce(&Attempt) -> Vec<&'static str>,
    ) -> Result<ChargeReply, OrchestratorError> {
        if attempt.fingerprint != *fingerprint {
            return Err(OrchestratorError::FingerprintMismatch {
                operation_key: attempt.operation_key.clone(),
                attempt_id: attempt.id,
                fields: differing_fields(&attempt),
            });
        }
        let deadline = Instant::now() + self.settings.concurrent_wait_max;
        let mut poll = WAIT_POLL_INITIAL;
        let mut subscription = self.notifier.subscribe();
        loop {
            if attempt.status.is_terminal() {
                return Ok(ChargeReply { attempt, outcome: ChargeOutcome::Duplicate });
            }
            // Whether the lease is free is the database's question, on its clock: this
            // process's clock may run ahead (and would steal a live lease) or behind (and
            // would never take an expired one).
            let owner = self.new_lease_owner();
            if let Some(leased) = self.store.acquire_lease(attempt.id, self.lease_request(owner)).await? {
                return self.reconcile_leased(leased, owner).await;
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(OrchestratorError::InProgress { attempt_id: attempt.id });
            }
            subscription.wait_for(attempt.id, poll.min(remaining)).await;
            poll = (poll * 2).min(WAIT_POLL_MAX);
            attempt = self
                .store
                .find_by_id(None, attempt.id)
                .await?
                .ok_or(OrchestratorError::NotFound)?;
        }
    }

    async fn reconcile_leased(&self, leased: Leased, owner: LeaseOwner) -> Result<ChargeReply, OrchestratorError> {
        let before_status = leased.attempt.status;
        let before_provider_id = leased.attempt.provider_payment_id.clone();
        if let Some(reason) = leased.attempt.review_reason.clone()
            && leased.attempt.provider_payment_id.is_none()
        {
            // A flagged row without a known object: sending again could charge twice.
            let end = self.release_unchanged(leased.attempt, owner).await?;
            return Err(OrchestratorError::NeedsReview { attempt_id: end.id, reason });
        }
        let end = self.run_round(leased, owner).await?;
        let (attempt, writer) = answered(end)?;
        let changed = attempt.status != before_status || attempt.provider_payment_id != before_provider_id;
        let outcome = if changed && writer == RoundWriter::ThisRound {
            ChargeOutcome::Reconciled
        } else {
            ChargeOutcome::Duplicate
        };
        Ok(ChargeReply { attempt, outcome })
    }

    /// Gives a lease back without a provider call.
    async fn release_unchanged(&self, attempt: Attempt, owner: LeaseOwner) -> Result<Attempt, OrchestratorError> {
        let result = crate::store::RoundResult::unchanged(
            attempt.status,
            0,
            chrono_duration(self.settings.sweep.review_reminder),
            attempt.last_error.clone(),
        );
        let written = self.store.finish_round(attempt.id, owner, &result, self.caller_time()).await?;
        self.notifier.round_finished(attempt.id);
        Ok(written.unwrap_or(attempt))
    }
}

/// What a caller is told after a round: the row as it stands, never more than it says, and
/// whether it stands as this round wrote it. A decided row is answered as decided, whoever
/// decided it (a webhook, or the holder that took over a lease that ran out under this round);
/// an undecided one is "retry".
fn answered(end: super::RoundEnd) -> Result<(Attempt, RoundWriter), OrchestratorError> {
    let writer = if end.lease_lost || end.provider_error.is_some() { RoundWriter::Other } else { RoundWriter::ThisRound };
    if end.attempt.status.is_terminal() {
        return Ok((end.attempt, writer));
    }
    if let Some(error) = end.provider_error {
        return Err(unfinished_error(&end.attempt, error));
    }
    if end.lease_lost {
        return Err(OrchestratorError::InProgress { attempt_id: end.attempt.id });
    }
    Ok((end.attempt, writer))
}

/// Who left the row as a caller is told it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RoundWriter {
    ThisRound,
    Other,
}

fn unfinished_error(attempt: &Attempt, error: crate::provider::ProviderError) -> OrchestratorError {
    match &attempt.review_reason {
        Some(review) if attempt.provider_payment_id.is_none() => {
            OrchestratorError::NeedsReview { attempt_id: attempt.id, reason: review.clone() }
        }
        _ if attempt.create_replays_failure => OrchestratorError::ProviderReplaysFailure { attempt_id: attempt.id },
        _ => OrchestratorError::OutcomeUnknown { attempt_id: attempt.id, reason: error.to_string() },
    }
}
