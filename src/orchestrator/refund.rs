//! The refund flow: the same machinery as a charge (pending row first, derived key, one round
//! under the lease, duplicates answered from the row or the outcome cache, concurrent calls
//! waited for), with a refund's own inserting statement, which finds the charge and keeps the
//! sum of its refunds within what was charged.

use uuid::Uuid;

use super::{ChargeReply, Orchestrator, OrchestratorError, chrono_duration};
use std::collections::HashMap;

use crate::domain::{Attempt, AttemptId, AttemptKind, ConsumerName, RefundRequest, derive_idempotency_key};
use crate::store::{NewRefund, REFUND_TOTALS_PARENTS_MAX, RefundInsertOutcome, RefundRefusal, RefundTotals};

/// A refund operation has one attempt: its key is generation 0 of the refund's own operation.
const REFUND_GENERATION: u32 = 0;

/// The caller-facing words for a refusal; each names the request field it is about.
pub(super) fn refusal_message(refusal: &RefundRefusal) -> String {
    match refusal {
        RefundRefusal::ChargeNotFound => "charge: no such charge of this caller; nothing was written or sent".to_owned(),
        RefundRefusal::ChargeNotSucceeded { charge_attempt_id, status } => format!(
            "charge: attempt {charge_attempt_id} is {}, only a succeeded charge can be refunded; \
             nothing was written or sent",
            status.as_str()
        ),
        RefundRefusal::ChargeFullyRefunded { charge_attempt_id, charged_minor } => format!(
            "charge: attempt {charge_attempt_id} is already fully refunded or has refunds pending \
             for all of its {charged_minor}; nothing was written or sent"
        ),
        RefundRefusal::ExceedsCharge { charge_attempt_id, requested_minor, refundable_minor } => format!(
            "amount_minor: {requested_minor} is more than the {refundable_minor} left to refund on \
             attempt {charge_attempt_id} (its pending and succeeded refunds count); nothing was \
             written or sent"
        ),
    }
}

impl Orchestrator {
    #[tracing::instrument(name = "refund", skip_all,
        fields(consumer = %consumer, operation_key = %request.operation_key, attempt_id))]
    pub async fn refund(
        &self,
        consumer: &ConsumerName,
        request: RefundRequest,
    ) -> Result<ChargeReply, OrchestratorError> {
        let reply = self.refund_inner(consumer, request).await;
        let label = match &reply {
            Ok(reply) => reply.outcome.as_str(),
            Err(OrchestratorError::RefundRefused(_)) => "refused",
            Err(OrchestratorError::OutcomeUnknown { .. }) => "unknown",
            Err(OrchestratorError::InProgress { .. }) => "in_progress",
            Err(OrchestratorError::ProviderReplaysFailure { .. }) => "replayed_failure",
            Err(OrchestratorError::FingerprintMismatch { .. }) => "mismatch",
            Err(OrchestratorError::NotFound) => "not_found",
            Err(_) => "error",
        };
        metrics::counter!("chargeguard_refunds_total", "outcome" => label).increment(1);
        tracing::info!(outcome = label, "refund answered");
        reply
    }

    /// What each charge among `attempts` has refunded and has pending, summed by the database
    /// (one statement per `REFUND_TOTALS_PARENTS_MAX` charges); refunds and unrefunded charges
    /// are absent.
    pub async fn refund_totals(&self, attempts: &[Attempt]) -> Result<HashMap<AttemptId, RefundTotals>, OrchestratorError> {
        let charges: Vec<AttemptId> =
            attempts.iter().filter(|attempt| attempt.kind == AttemptKind::Charge).map(|attempt| attempt.id).collect();
        let mut totals = HashMap::new();
        for chunk in charges.chunks(REFUND_TOTALS_PARENTS_MAX) {
            totals.extend(self.store.refund_totals(chunk).await?);
        }
        Ok(totals)
    }

    async fn refund_inner(
        &self,
        consumer: &ConsumerName,
        request: RefundRequest,
    ) -> Result<ChargeReply, OrchestratorError> {
        let fingerprint = request.fingerprint();
        let differing_fields = |stored: &Attempt| request.differing_fields(stored);
        if let Some(decided) = self.outcome_cache.get(consumer, &request.operation_key) {
            tracing::Span::current().record("attempt_id", tracing::field::display(decided.id));
            return self.answer_existing(&fingerprint, decided, differing_fields).await;
        }
        let owner = self.new_lease_owner();
        let new = NewRefund {
            id: AttemptId::from_uuid(Uuid::now_v7()),
            consumer: consumer.clone(),
            operation_key: request.operation_key.clone(),
            charge: request.charge.clone(),
            amount_minor: request.amount_minor(),
            reason: request.reason,
            metadata: request.metadata.clone(),
            fingerprint: fingerprint.clone(),
            provider: self.provider.name(),
            idempotency_key: derive_idempotency_key(consumer, &request.operation_key, REFUND_GENERATION),
            lease_owner: owner,
            lease_duration: chrono_duration(self.settings.lease_duration),
            recovery_grace: chrono_duration(self.settings.recovery_grace),
            time: self.caller_time(),
        };
        crate::failpoints::crash_point("refund.before_pending_commit");
        let reply = match self.store.insert_pending_refund(&new).await? {
            RefundInsertOutcome::Inserted(attempt) => {
                tracing::Span::current().record("attempt_id", tracing::field::display(attempt.id));
                crate::failpoints::crash_point("refund.after_pending_commit");
                self.answer_inserted(attempt, owner, "refund.after_record").await
            }
            RefundInsertOutcome::Existing(attempt) => {
                tracing::Span::current().record("attempt_id", tracing::field::display(attempt.id));
                self.answer_existing(&fingerprint, attempt, differing_fields).await
            }
            RefundInsertOutcome::Refused(refusal) => Err(OrchestratorError::RefundRefused(refusal)),
        };
        if let Ok(reply) = &reply {
            self.outcome_cache.remember(&reply.attempt);
        }
        reply
    }
}
