//! One round with the provider for an attempt whose lease the caller holds: choose the step,
//! make the call, classify the answer, write it with a guarded update, release the lease.

use std::time::Instant;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{Orchestrator, OrchestratorError, chrono_duration};
use crate::domain::{
    Attempt, AttemptStatus, Lease, LeaseOwner, LookupResolution, PaymentSnapshot, RecoveryStep,
    Resolution, choose_recovery_step, resolve_lookup, resolve_snapshot,
};
use crate::provider::{CreateOutcome, CreatePayment, CreatedRange, ProviderError};
use crate::store::RoundResult;

/// What the provider told us in one round, before it is written.
struct Observation {
    provider_payment_id: Option<String>,
    provider_status: Option<String>,
    resolution: Resolution,
}

impl Observation {
    fn of_snapshot(snapshot: &PaymentSnapshot, attempt: &Attempt) -> Self {
        Self {
            provider_payment_id: Some(snapshot.id.clone()),
            provider_status: Some(snapshot.status.as_str().to_owned()),
            resolution: resolve_snapshot(snapshot, &attempt.params),
        }
    }
}

/// How a round ended, after its result was written.
#[derive(Debug)]
pub struct RoundEnd {
    /// The row as it is after the round (re-read if another writer got there first).
    pub attempt: Attempt,
    /// Set when the provider's answer could not be used; the attempt stayed unfinished.
    pub provider_error: Option<ProviderError>,
}

impl Orchestrator {
    pub(super) fn new_lease(&self, now: DateTime<Utc>) -> Lease {
        Lease {
            owner: LeaseOwner::from_uuid(Uuid::new_v4()),
            expires_at: now + chrono_duration(self.settings.lease_duration),
        }
    }

    /// Runs the round `attempt`'s state calls for. The caller holds `attempt`'s lease as `owner`.
    pub async fn run_round(&self, attempt: Attempt, owner: LeaseOwner) -> Result<RoundEnd, OrchestratorError> {
        let now = self.clock.now();
        let step = choose_recovery_step(
            &attempt,
            now,
            self.settings.key_window,
            chrono_duration(self.settings.requires_action_age_max),
        );
        let Some(step) = step else {
            return Ok(RoundEnd { attempt, provider_error: None });
        };
        let started = Instant::now();
        let observed = self.observe(&attempt, &step).await;
        metrics::histogram!("chargeguard_provider_round_seconds", "step" => step_name(&step))
            .record(started.elapsed().as_secs_f64());
        crate::failpoints::crash_point("round.after_provider_call");
        let now = self.clock.now();
        let result = self.round_result(&attempt, &observed, now);
        let written = self.store.finish_round(attempt.id, owner, &result, now).await?;
        self.notifier.round_finished(attempt.id);
        let attempt = match written {
            Some(attempt) => attempt,
            // Our lease ran out and someone else took the row: what they wrote stands.
            None => self
                .store
                .find_by_id(None, attempt.id)
                .await?
                .ok_or(OrchestratorError::NotFound)?,
        };
        if let Some(reason) = &result.review_reason {
            tracing::error!(attempt_id = %attempt.id, operation_key = %attempt.operation_key,
                reason = %reason, "attempt needs review");
            metrics::counter!("chargeguard_attempts_flagged_total").increment(1);
            if reason.starts_with("double charge") {
                metrics::counter!("chargeguard_double_charges_found_total").increment(1);
            }
        }
        Ok(RoundEnd { attempt, provider_error: observed.err() })
    }

    fn round_result(
        &self,
        attempt: &Attempt,
        observed: &Result<Observation, ProviderError>,
        now: DateTime<Utc>,
    ) -> RoundResult {
        let backoff = self.recheck_backoff(attempt.check_count);
        match observed {
            Ok(observation) => RoundResult {
                status: observation.resolution.status,
                provider_payment_id: observation.provider_payment_id.clone(),
                provider_status: observation.provider_status.clone(),
                failure: observation.resolution.failure.clone(),
                next_action: observation.resolution.next_action.clone(),
                review_reason: observation.resolution.review_reason.clone(),
                calls_made: 1,
                next_check_at: now + backoff,
                last_error: None,
            },
            Err(error) => RoundResult {
                status: attempt.status,
                provider_payment_id: None,
                provider_status: None,
                failure: None,
                next_action: None,
                review_reason: match error {
                    ProviderError::KeyConflict(message) => {
                        Some(format!("the provider reports an idempotency key conflict: {message}"))
                    }
                    _ => None,
                },
                calls_made: 1,
                next_check_at: now + backoff,
                last_error: Some(error.to_string()),
            },
        }
    }

    /// Exponential: base, 2×base, 4×base, … up to the maximum; never sooner than the grace
    /// period, so recovery does not race a caller that is still retrying.
    fn recheck_backoff(&self, check_count: u32) -> chrono::Duration {
        let base = self.settings.recheck_backoff_base;
        let doubled = base.saturating_mul(1_u32 << check_count.min(20));
        chrono_duration(doubled.min(self.settings.recheck_backoff_max).max(self.settings.recovery_grace))
    }

    async fn observe(&self, attempt: &Attempt, step: &RecoveryStep) -> Result<Observation, ProviderError> {
        match step {
            RecoveryStep::ResendCreate => {
                let request = CreatePayment {
                    attempt_id: attempt.id,
                    consumer: &attempt.consumer,
                    operation_key: &attempt.operation_key,
                    params: &attempt.params,
                    idempotency_key: &attempt.idempotency_key,
                };
                match self.provider.create_payment(request).await? {
                    CreateOutcome::Payment(snapshot) => Ok(Observation::of_snapshot(&snapshot, attempt)),
                    CreateOutcome::Declined { failure, provider_payment_id } => Ok(Observation {
                        provider_status: provider_payment_id
                            .as_ref()
                            .map(|_| "requires_payment_method".to_owned()),
                        provider_payment_id,
                        resolution: failed(failure),
                    }),
                    CreateOutcome::Rejected { failure } => Ok(Observation {
                        provider_payment_id: None,
                        provider_status: None,
                        resolution: failed(failure),
                    }),
                }
            }
            RecoveryStep::Retrieve { provider_payment_id } => {
                let snapshot = self.provider.retrieve_payment(provider_payment_id).await?;
                Ok(Observation::of_snapshot(&snapshot, attempt))
            }
            RecoveryStep::Cancel { provider_payment_id } => {
                // A cancel the provider refuses (the customer acted meanwhile) is not an
                // outcome: read the object and adopt whatever it is now.
                let snapshot = match self.provider.cancel_payment(provider_payment_id).await {
                    Ok(snapshot) => snapshot,
                    Err(_) => self.provider.retrieve_payment(provider_payment_id).await?,
                };
                Ok(Observation::of_snapshot(&snapshot, attempt))
            }
            RecoveryStep::FindByMetadata => {
                let slack = chrono_duration(self.settings.lookup_slack);
                let created = CreatedRange {
                    from: attempt.key_window_started_at - slack,
                    to: attempt.key_window_started_at + self.settings.key_window.safe() + slack,
                };
                let found = self.provider.find_payments_for_attempt(attempt.id, created).await?;
                match resolve_lookup(found) {
                    LookupResolution::NothingCharged => Ok(Observation {
                        provider_payment_id: None,
                        provider_status: None,
                        resolution: failed(crate::domain::Failure::expired()),
                    }),
                    LookupResolution::Adopt { snapshot, double_charge } => {
                        let mut observation = Observation::of_snapshot(&snapshot, attempt);
                        if double_charge.is_some() {
                            observation.resolution.review_reason = double_charge;
                        }
                        Ok(observation)
                    }
                }
            }
        }
    }
}

fn failed(failure: crate::domain::Failure) -> Resolution {
    Resolution {
        status: AttemptStatus::Failed,
        failure: Some(failure),
        next_action: None,
        review_reason: None,
    }
}

fn step_name(step: &RecoveryStep) -> &'static str {
    match step {
        RecoveryStep::ResendCreate => "create",
        RecoveryStep::Retrieve { .. } => "retrieve",
        RecoveryStep::FindByMetadata => "find",
        RecoveryStep::Cancel { .. } => "cancel",
    }
}
