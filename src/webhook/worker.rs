//! Drains the inbox at chargeguard's own pace: claims a bounded batch of unprocessed events
//! (`SKIP LOCKED`, with a claim that expires so a worker killed mid-batch loses nothing), decides
//! each one from its object and the attempt it names, and settles it in one transaction.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::decision;
use super::event::{RefundSubject, Subject, parse_subject};
use crate::clock::Clock;
use crate::domain::{Attempt, AttemptStatus};
use crate::orchestrator::OutcomeCache;
use crate::store::{CallerTime, StoreError};
use crate::store::inbox::{
    Claim, ClaimOwner, InboxEvent, InboxOutcome, InboxStore, SettleEvent, Settlement,
};
use crate::domain::review::ReviewKind;
use crate::telemetry::alert_counters;

/// Batches drained per tick before the worker sleeps again, so one tick is bounded even when
/// the inbox keeps filling.
pub const DRAIN_BATCHES_PER_TICK_MAX: u32 = 100;

#[derive(Debug, Clone, Copy)]
pub struct WorkerSettings {
    pub batch_max: u32,
    /// How long a claimed batch stays the worker's; after that another worker may finish it.
    pub claim_duration: Duration,
    pub interval: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettledEvent {
    pub event_id: String,
    pub event_type: String,
    pub outcome: InboxOutcome,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchReport {
    pub settled: Vec<SettledEvent>,
    /// Events whose claim another worker took meanwhile; they settled nothing here.
    pub claims_lost: usize,
    /// Events left claimed because a row they touch is corrupt (see the error log).
    pub unsettled: usize,
}

impl BatchReport {
    pub fn count(&self, outcome: InboxOutcome) -> usize {
        self.settled
            .iter()
            .filter(|settled| settled.outcome == outcome)
            .count()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrainOutcome {
    /// Nothing was claimable.
    EmptyInbox,
    Batch(BatchReport),
}

#[derive(Clone)]
pub struct InboxWorker {
    store: Arc<dyn InboxStore>,
    clock: Arc<dyn Clock>,
    settings: WorkerSettings,
    /// Forgets an attempt this worker changes, so a duplicate `Charge` in this process reads it.
    outcomes: Arc<OutcomeCache>,
}

impl InboxWorker {
    pub fn new(
        store: Arc<dyn InboxStore>,
        clock: Arc<dyn Clock>,
        settings: WorkerSettings,
        outcomes: Arc<OutcomeCache>,
    ) -> Self {
        Self {
            store,
            clock,
            settings,
            outcomes,
        }
    }

    /// Claims and settles one batch. An unavailable database stops the batch: the events it did
    /// not settle stay claimed until their claim expires, then any worker takes them again.
    pub async fn try_drain_once(&self) -> Result<DrainOutcome, StoreError> {
        let claim = Claim {
            owner: ClaimOwner::new(),
            duration: chrono::Duration::from_std(self.settings.claim_duration)
                .unwrap_or(chrono::Duration::MAX),
            time: CallerTime::of(self.clock.as_ref()),
        };
        let events = self
            .store
            .claim_events(claim, self.settings.batch_max)
            .await?;
        if events.is_empty() {
            return Ok(DrainOutcome::EmptyInbox);
        }
        let mut report = BatchReport::default();
        for event in events {
            if event.claim_count > 1 {
                tracing::warn!(event_id = %event.event_id, claims = event.claim_count,
                    "webhook event claimed again: an earlier worker stopped before settling it");
            }
            match self.settle_one(&event, claim.owner).await {
                Ok(Some(outcome)) => report.settled.push(SettledEvent {
                    event_id: event.event_id,
                    event_type: event.event_type,
                    outcome,
                }),
                Ok(None) => {
                    metrics::counter!(alert_counters::WEBHOOK_CLAIMS_LOST).increment(1);
                    report.claims_lost += 1;
                }
                // A row that breaks the schema's rules will not read better on the next try:
                // leave this event claimed (it comes back after the claim, and the age gauge,
                // `gauges.rs`, shows it) and go on with the batch rather than let it block the inbox.
                Err(StoreError::Corrupt(error)) => {
                    tracing::error!(event_id = %event.event_id, %error, "webhook event not settled");
                    metrics::counter!(alert_counters::WEBHOOK_SETTLE_ERRORS).increment(1);
                    report.unsettled += 1;
                }
                Err(error) => return Err(error),
            }
            crate::failpoints::crash_point("webhook.mid_batch");
        }
        Ok(DrainOutcome::Batch(report))
    }

    /// Decides and settles one event; `None` when another worker took its claim meanwhile.
    async fn settle_one(
        &self,
        event: &InboxEvent,
        owner: ClaimOwner,
    ) -> Result<Option<InboxOutcome>, StoreError> {
        let (settlement, attempt, change) = self.decide(event).await?;
        let settle = SettleEvent {
            event_id: event.event_id.clone(),
            owner,
            dedup_key: event
                .object_id
                .clone()
                .map(|object_id| (object_id, dedup_type(&event.event_type, change.as_deref()))),
            settlement,
            time: CallerTime::of(self.clock.as_ref()),
        };
        let outcome = self.store.settle_event(&settle).await?;
        if let Some(outcome) = outcome {
            if let Some(attempt) = attempt.as_ref().filter(|_| changes_the_attempt(outcome)) {
                self.outcomes.forget(&attempt.consumer, &attempt.operation_key);
            }
            record(event, &settle.settlement, outcome, attempt.as_ref());
        }
        Ok(outcome)
    }

    /// The settlement, the attempt it is about when there is one, and for objects that change
    /// more than once under one event type (`refund.updated`, `charge.refunded`) the change the
    /// event reports, which its de-duplication key includes.
    async fn decide(&self, event: &InboxEvent) -> Result<Decided, StoreError> {
        match parse_subject(&event.event_type, &event.payload) {
            Err(error) => Ok((decision::unreadable(&error), None, None)),
            Ok(Subject::Untracked) => Ok((decision::untracked(&event.event_type), None, None)),
            Ok(Subject::Payment {
                snapshot,
                attempt_id,
            }) => {
                let attempt = self
                    .store
                    .find_attempt_for_payment(&snapshot.id, attempt_id)
                    .await?;
                let settlement = decision::for_payment(&event.event_id, &snapshot, attempt.as_ref());
                Ok((settlement, attempt, None))
            }
            Ok(Subject::Refund(subject)) => {
                let attempt = self.refund_attempt(&subject).await?;
                let settlement = decision::for_refund(&event.event_id, &subject, attempt.as_ref());
                Ok((settlement, attempt, Some(subject.snapshot.status.clone())))
            }
            Ok(Subject::ChargeRefunded {
                charge_id,
                payment_intent,
                amount_refunded_minor,
                refunds,
            }) => {
                let mut found = Vec::with_capacity(refunds.len());
                for subject in refunds {
                    let attempt = self.refund_attempt(&subject).await?;
                    found.push((subject, attempt));
                }
                let charge_attempt = match (found.is_empty(), payment_intent.as_deref()) {
                    (true, Some(intent)) => self.store.find_attempt_for_payment(intent, None).await?,
                    _ => None,
                };
                let settlement = decision::for_charge_refunded(
                    &event.event_id,
                    &charge_id,
                    charge_attempt.as_ref(),
                    &found,
                );
                let attempt = found.into_iter().find_map(|(_, attempt)| attempt);
                Ok((settlement, attempt, Some(amount_refunded_minor.to_string())))
            }
            Ok(Subject::Dispute(dispute)) => {
                // Stripe names the PaymentIntent on every dispute of a PaymentIntent's charge;
                // chargeguard keeps no charge ids, so a dispute without one stays unknown.
                let attempt = match dispute.payment_intent.as_deref() {
                    Some(intent) => self.store.find_attempt_for_payment(intent, None).await?,
                    None => None,
                };
                let settlement = decision::for_dispute(&dispute, attempt.as_ref());
                Ok((settlement, attempt, Some(dispute.status.clone())))
            }
        }
    }

    async fn refund_attempt(&self, subject: &RefundSubject) -> Result<Option<Attempt>, StoreError> {
        self.store
            .find_attempt_for_refund(&subject.snapshot.id, subject.attempt_id)
            .await
    }

    /// Every `interval`, drains until the inbox is empty (bounded per tick). Stops between
    /// batches when `shutdown` is cancelled; a batch cut short is finished by the next worker.
    pub async fn run(self, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(self.settings.interval) => {}
            }
            for _ in 0..DRAIN_BATCHES_PER_TICK_MAX {
                if shutdown.is_cancelled() {
                    return;
                }
                match self.try_drain_once().await {
                    Ok(DrainOutcome::EmptyInbox) => break,
                    Ok(DrainOutcome::Batch(_)) => {}
                    Err(error) => {
                        tracing::warn!(%error, "webhook inbox drain failed; retrying next tick");
                        break;
                    }
                }
            }
        }
    }
}

type Decided = (Settlement, Option<Attempt>, Option<String>);

/// The de-duplication type of an event: its type, and for objects that change more than once
/// under one type the change it reports (`refund.updated:succeeded`, then
/// `refund.updated:failed`; `charge.refunded:400`, then `charge.refunded:1000`). A second
/// distinct event for the same change is still a duplicate.
fn dedup_type(event_type: &str, change: Option<&str>) -> String {
    match change {
        Some(change) => format!("{event_type}:{change}"),
        None => event_type.to_owned(),
    }
}

/// Whether settling wrote to the attempt's row: moved it, or flagged it for review.
fn changes_the_attempt(outcome: InboxOutcome) -> bool {
    matches!(
        outcome,
        InboxOutcome::Applied
            | InboxOutcome::Conflict
            | InboxOutcome::Flagged
            | InboxOutcome::FailedAfterSuccess
            | InboxOutcome::Disputed
    )
}

fn record(
    event: &InboxEvent,
    settlement: &Settlement,
    outcome: InboxOutcome,
    attempt: Option<&Attempt>,
) {
    metrics::counter!("chargeguard_webhook_events_total",
        "event_type" => event.event_type.clone(), "outcome" => outcome.as_str())
    .increment(1);
    let review_reason = match (settlement, outcome) {
        (Settlement::Apply(update), InboxOutcome::Applied) => update.review_reason.as_deref(),
        (Settlement::Flag { review_reason, .. }, InboxOutcome::Conflict) => {
            Some(review_reason.as_str())
        }
        _ => None,
    };
    if let (Settlement::Apply(update), InboxOutcome::Flagged) = (settlement, outcome) {
        // Money moved where the consumer was told it did not: a person must decide (refund, or
        // tell the consumer), so this is loud whatever else is going on.
        let reason = update.review_reason_if_failed.as_deref().unwrap_or_default();
        tracing::error!(event_id = %event.event_id, attempt_id = %update.attempt_id,
            operation_key = attempt.map(|attempt| attempt.operation_key.as_str()).unwrap_or_default(),
            consumer = attempt.map(|attempt| attempt.consumer.as_str()).unwrap_or_default(),
            provider_payment_id = %update.provider_payment_id, reason = %reason,
            "provider reports money moved for an attempt answered failed; attempt needs review");
        metrics::counter!(alert_counters::SUCCEEDED_AFTER_FAILURE).increment(1);
        crate::telemetry::count_flagged_attempt(ReviewKind::SucceededAfterFailure);
    }
    if outcome == InboxOutcome::FailedAfterSuccess
        && let Settlement::Refunds(updates) = settlement
    {
        // The money came back to the merchant after the consumer was told it reached the
        // customer: the consumer must know (the refund attempt reads failed from now on).
        for update in updates.iter().filter(|update| update.status == AttemptStatus::Failed) {
            tracing::warn!(event_id = %event.event_id, attempt_id = %update.attempt_id,
                operation_key = attempt.map(|attempt| attempt.operation_key.as_str()).unwrap_or_default(),
                provider_refund_id = %update.provider_refund_id,
                failure_reason = update.failure.as_ref().map(|failure| failure.code.as_str()).unwrap_or_default(),
                "provider reports a succeeded refund failed; the refund attempt is now failed");
        }
        metrics::counter!(alert_counters::REFUNDS_FAILED_AFTER_SUCCESS).increment(1);
    }
    if let (Settlement::Dispute { attempt_id, review_reason }, InboxOutcome::Disputed) =
        (settlement, outcome)
    {
        tracing::warn!(event_id = %event.event_id, attempt_id = %attempt_id,
            operation_key = attempt.map(|attempt| attempt.operation_key.as_str()).unwrap_or_default(),
            reason = %review_reason, "charge disputed; attempt needs review");
        metrics::counter!(alert_counters::DISPUTES, "event_type" => event.event_type.clone())
            .increment(1);
        crate::telemetry::count_flagged_attempt(ReviewKind::Dispute);
    }
    if let Some(reason) = review_reason {
        tracing::error!(event_id = %event.event_id, reason = %reason, "attempt needs review");
        crate::telemetry::count_flagged_attempt(ReviewKind::of(reason));
    }
    match outcome {
        InboxOutcome::UnknownObject | InboxOutcome::Unreadable => {
            tracing::info!(event_id = %event.event_id, event_type = %event.event_type,
                outcome = outcome.as_str(), "webhook event kept without an attempt to apply it to");
        }
        _ => tracing::debug!(event_id = %event.event_id, event_type = %event.event_type,
            outcome = outcome.as_str(), "webhook event settled"),
    }
}
