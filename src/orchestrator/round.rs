//! One round with the provider for an attempt whose lease the caller holds: choose the step,
//! make the call, classify the answer, write it with a guarded update, release the lease.

mod pages;
mod refund;

use std::time::Instant;

use chrono::Duration;
use uuid::Uuid;

use super::{Orchestrator, OrchestratorError, chrono_duration};
use crate::domain::{
    Attempt, AttemptKind, AttemptStatus, ClockReadings, LeaseOwner, ListProgress, LookupResolution,
    PaymentSnapshot, RecoveryStep, Resolution, choose_recovery_step, lookup_created_range,
    resolve_confirmed, resolve_lookup, resolve_snapshot,
};
use crate::provider::{ConfirmPayment, CreateOutcome, CreatePayment, CreatedRange, METADATA_ATTEMPT_ID, ProviderError};
use crate::store::{CallerTime, LeaseRequest, Leased, RoundResult};
use crate::telemetry::alert_counters;
use crate::domain::review;

/// The provider's largest list page.
const LIST_PAGE_SIZE: u32 = 100;

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

    fn failed(failure: crate::domain::Failure, provider_payment_id: Option<String>) -> Self {
        Self {
            provider_status: provider_payment_id.as_ref().map(|_| "requires_payment_method".to_owned()),
            provider_payment_id,
            resolution: Resolution {
                status: AttemptStatus::Failed,
                failure: Some(failure),
                next_action: None,
                review_reason: None,
            },
        }
    }
}

/// Everything a round learned, including what it leaves for the next one.
struct RoundObservation {
    outcome: Result<Observation, ProviderError>,
    calls_made: u32,
    /// The provider replayed a saved failure for the key in this round.
    create_replays_failure: bool,
    /// Where a lookup's listing stands; `None` when the round listed nothing.
    lookup_progress: Option<ListProgress>,
    /// A lookup stopped at its page bound: the next round should follow at once.
    lookup_unfinished: bool,
}

impl RoundObservation {
    fn of_call(outcome: Result<Observation, ProviderError>) -> Self {
        Self { outcome, calls_made: 1, create_replays_failure: false, lookup_progress: None, lookup_unfinished: false }
    }

    /// A lookup whose listing was complete and found nothing of the attempt's: the next round
    /// lists again from the start (objects can still appear while some replica may send the key).
    fn after_complete_listing(calls_made: u32, outcome: Result<Observation, ProviderError>) -> Self {
        Self { calls_made, lookup_progress: Some(ListProgress::NotStarted), ..Self::of_call(outcome) }
    }

    /// A lookup made because the provider replayed a saved failure for the create: the create
    /// counts as a call, the key is never sent again (sticky), and when the lookup found nothing
    /// to adopt the caller hears of the replayed failure.
    fn after_replayed_failure(mut self, message: String) -> Self {
        metrics::counter!(alert_counters::REPLAYED_FAILURES).increment(1);
        self.calls_made += 1;
        self.create_replays_failure = true;
        if self.outcome.is_err() {
            self.outcome = Err(ProviderError::ReplayedFailure(message));
        }
        self
    }
}

/// How a round ended, after its result was written.
#[derive(Debug)]
pub struct RoundEnd {
    /// The row as it is after the round (re-read if another writer got there first).
    pub attempt: Attempt,
    /// Set when the provider's answer could not be used; the attempt stayed unfinished.
    pub provider_error: Option<ProviderError>,
    /// The lease ran out under the round and another holder's write stands: `attempt` is what
    /// they left, and this round's answer was not recorded.
    pub lease_lost: bool,
}

impl Orchestrator {
    pub(super) fn new_lease_owner(&self) -> LeaseOwner {
        LeaseOwner::from_uuid(Uuid::new_v4())
    }

    pub(super) fn caller_time(&self) -> CallerTime {
        CallerTime::of(self.clock.as_ref())
    }

    pub(super) fn lease_request(&self, owner: LeaseOwner) -> LeaseRequest {
        LeaseRequest {
            owner,
            duration: chrono_duration(self.settings.lease_duration),
            key_window_safe: self.settings.key_window.safe(),
            time: self.caller_time(),
        }
    }

    /// Runs the round `leased`'s state calls for. The caller holds the lease as `owner`.
    pub async fn run_round(&self, leased: Leased, owner: LeaseOwner) -> Result<RoundEnd, OrchestratorError> {
        let Leased { attempt, database_now } = leased;
        let readings = ClockReadings { process: self.clock.now(), database: database_now };
        let step = choose_recovery_step(
            &attempt,
            readings,
            self.settings.key_window,
            chrono_duration(self.settings.requires_action_age_max),
        );
        let Some(step) = step else {
            return Ok(RoundEnd { attempt, provider_error: None, lease_lost: false });
        };
        let started = Instant::now();
        let observed = self.observe(&attempt, &step, owner).await?;
        metrics::histogram!("chargeguard_provider_round_seconds", "step" => step_name(&step))
            .record(started.elapsed().as_secs_f64());
        crate::failpoints::crash_point("round.after_provider_call");
        let result = self.round_result(&attempt, &observed);
        let written = self.store.finish_round(attempt.id, owner, &result, self.caller_time()).await?;
        self.notifier.round_finished(attempt.id);
        let lease_lost = written.is_none();
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
            crate::telemetry::count_flagged_attempt(review::ReviewKind::of(reason));
        }
        Ok(RoundEnd { attempt, provider_error: observed.outcome.err(), lease_lost })
    }

    fn round_result(&self, attempt: &Attempt, observed: &RoundObservation) -> RoundResult {
        // A lookup that stopped at its page bound goes on at once; anything else backs off.
        let next_check_in = if observed.lookup_unfinished {
            Duration::zero()
        } else {
            self.recheck_backoff(attempt.check_count)
        };
        let common = RoundResult {
            create_replays_failure: observed.create_replays_failure,
            lookup_progress: observed.lookup_progress.clone(),
            ..RoundResult::unchanged(attempt.status, observed.calls_made, next_check_in, None)
        };
        match &observed.outcome {
            Ok(observation) => RoundResult {
                status: observation.resolution.status,
                provider_payment_id: observation.provider_payment_id.clone(),
                provider_status: observation.provider_status.clone(),
                failure: observation.resolution.failure.clone(),
                next_action: observation.resolution.next_action.clone(),
                review_reason: observation.resolution.review_reason.clone(),
                ..common
            },
            Err(error) => RoundResult {
                // Only what the machine cannot decide goes to a person: the provider saying our
                // key was used with other parameters. Transient trouble (5xx, timeouts, 429,
                // resets) backs off and is tried again for as long as it lasts.
                review_reason: match error {
                    ProviderError::KeyConflict(message) => {
                        Some(format!("{}: {message}", review::KEY_CONFLICT))
                    }
                    _ => None,
                },
                last_error: Some(error.to_string()),
                ..common
            },
        }
    }

    /// Exponential: base, 2×base, 4×base, … up to the maximum; never sooner than the grace
    /// period, so recovery does not race a caller that is still retrying.
    fn recheck_backoff(&self, check_count: u32) -> Duration {
        let base = self.settings.recheck_backoff_base;
        let doubled = base.saturating_mul(1_u32 << check_count.min(20));
        chrono_duration(doubled.min(self.settings.recheck_backoff_max).max(self.settings.recovery_grace))
    }

    async fn observe(
        &self,
        attempt: &Attempt,
        step: &RecoveryStep,
        owner: LeaseOwner,
    ) -> Result<RoundObservation, OrchestratorError> {
        if attempt.kind == AttemptKind::Refund {
            return self.observe_refund(attempt, step, owner).await;
        }
        Ok(match step {
            RecoveryStep::ResendCreate => match self.send_create(attempt).await {
                // The provider will answer this key with the same failure for as long as it
                // remembers it: stop sending it and look for what the first request did.
                Err(ProviderError::ReplayedFailure(message)) => {
                    tracing::warn!(attempt_id = %attempt.id, %message,
                        "the provider replays a saved failure for this key; looking the payment up instead");
                    self.look_up(attempt, owner, false).await?.after_replayed_failure(message)
                }
                outcome => RoundObservation::of_call(outcome),
            },
            RecoveryStep::Retrieve { provider_payment_id } => RoundObservation::of_call(
                self.provider
                    .retrieve_payment(provider_payment_id)
                    .await
                    .map(|snapshot| Observation::of_snapshot(&snapshot, attempt)),
            ),
            RecoveryStep::Cancel { provider_payment_id } => {
                // A cancel the provider refuses (the customer acted meanwhile) is not an
                // outcome: read the object and adopt whatever it is now.
                let (snapshot, calls_made) = match self.provider.cancel_payment(provider_payment_id).await {
                    Ok(snapshot) => (Ok(snapshot), 1),
                    Err(_) => (self.provider.retrieve_payment(provider_payment_id).await, 2),
                };
                RoundObservation {
                    calls_made,
                    ..RoundObservation::of_call(snapshot.map(|snapshot| Observation::of_snapshot(&snapshot, attempt)))
                }
            }
            RecoveryStep::FindByMetadata { conclusive } => self.look_up(attempt, owner, *conclusive).await?,
            RecoveryStep::RetrieveConfirmed { provider_payment_id, conclusive } => {
                RoundObservation::of_call(self.read_confirmed(attempt, provider_payment_id, *conclusive).await)
            }
        })
    }

    async fn send_create(&self, attempt: &Attempt) -> Result<Observation, ProviderError> {
        if let Some(confirmed) = &attempt.confirms_payment_id {
            return self.send_confirm(attempt, confirmed).await;
        }
        let request = CreatePayment {
            attempt_id: attempt.id,
            consumer: &attempt.consumer,
            operation_key: &attempt.operation_key,
            params: &attempt.params,
            idempotency_key: &attempt.idempotency_key,
            return_url: attempt.return_url.as_deref(),
        };
        Ok(match self.provider.create_payment(request).await? {
            CreateOutcome::Payment(snapshot) => Observation::of_snapshot(&snapshot, attempt),
            CreateOutcome::Declined { failure, provider_payment_id } => {
                Observation::failed(failure, provider_payment_id)
            }
            CreateOutcome::Rejected { failure } => Observation::failed(failure, None),
        })
    }

    /// The create step of an attempt that pays an earlier attempt's intent (issue 16): confirm it
    /// with this attempt's payment method and key. The intent is this attempt's object whatever
    /// the answer, so a decline or refusal records it (the next attempt confirms it again).
    async fn send_confirm(&self, attempt: &Attempt, confirmed: &str) -> Result<Observation, ProviderError> {
        let request = ConfirmPayment {
            provider_payment_id: confirmed,
            payment_method: attempt.params.payment_method.as_str(),
            idempotency_key: &attempt.idempotency_key,
            return_url: attempt.return_url.as_deref(),
        };
        Ok(match self.provider.confirm_payment(request).await? {
            CreateOutcome::Payment(snapshot) => Observation::of_snapshot(&snapshot, attempt),
            CreateOutcome::Declined { failure, provider_payment_id } => {
                Observation::failed(failure, Some(provider_payment_id.unwrap_or_else(|| confirmed.to_owned())))
            }
            // Not payable any more (already paid, or canceled): its state is unknown here, so
            // the next attempt treats it as payable and the provider refuses it again.
            CreateOutcome::Rejected { failure } => Observation {
                provider_status: None,
                ..Observation::failed(failure, Some(confirmed.to_owned()))
            },
        })
    }

    /// A confirm attempt whose key may no longer be sent: read the intent (`resolve_confirmed`).
    async fn read_confirmed(&self, attempt: &Attempt, confirmed: &str, conclusive: bool) -> Result<Observation, ProviderError> {
        let snapshot = self.provider.retrieve_payment(confirmed).await?;
        match resolve_confirmed(&snapshot, &attempt.params, conclusive) {
            Some(resolution) => Ok(Observation {
                provider_payment_id: Some(snapshot.id.clone()),
                provider_status: Some(snapshot.status.as_str().to_owned()),
                resolution,
            }),
            None => Err(ProviderError::OutcomeUnknown(format!(
                "intent {confirmed} still waits for a payment method and this attempt's key age is \
                 unknown; the key is not sent again, and the attempt expires once its window is over"
            ))),
        }
    }

    /// Looks for the attempt's objects without its key: the provider's search first; when it
    /// finds nothing or fails, the list endpoint over the range in which the attempt's creates
    /// can have landed, from where the last round stopped, at most `lookup_pages_per_round`
    /// pages, renewing the lease (and saving the position) between pages. Nothing found ends
    /// the attempt only when `conclusive` and both search and a complete listing answered.
    async fn look_up(
        &self,
        attempt: &Attempt,
        owner: LeaseOwner,
        conclusive: bool,
    ) -> Result<RoundObservation, OrchestratorError> {
        let calls_made = 1;
        let searched = self.provider.search_payments_for_attempt(attempt.id).await;
        let found = match &searched {
            Ok(found) => found.clone(),
            Err(error) => {
                tracing::warn!(attempt_id = %attempt.id, %error, "search failed; listing instead");
                Vec::new()
            }
        };
        if !found.is_empty() {
            return Ok(adopted(found, attempt, calls_made, ListProgress::NotStarted));
        }
        let (from, to) = lookup_created_range(
            attempt,
            self.settings.key_window,
            chrono_duration(self.settings.lookup_slack),
        );
        let created = CreatedRange { from, to };
        let attempt_id = attempt.id.to_string();
        let belongs = |snapshot: &PaymentSnapshot| {
            snapshot.metadata.get(METADATA_ATTEMPT_ID).is_some_and(|id| *id == attempt_id)
        };
        let list_page = |cursor: Option<String>| async move {
            let page = self.provider.list_payments(created, cursor.as_deref(), LIST_PAGE_SIZE).await?;
            Ok((page.payments, page.next_cursor))
        };
        let calls_made = match self.list_pages(attempt, owner, calls_made, list_page, belongs).await? {
            (pages::Listed::Found(found), calls_made) => {
                return Ok(adopted(found, attempt, calls_made, ListProgress::NotStarted));
            }
            (pages::Listed::Stopped(observation), _) => return Ok(observation),
            (pages::Listed::Complete, calls_made) => calls_made,
        };
        // The listing is complete and found nothing. Objects can still appear while some
        // replica may send the key, so the next round lists again from the start.
        let outcome = match (conclusive, searched) {
            (true, Ok(_)) => Ok(Observation::failed(crate::domain::Failure::expired(), None)),
            (true, Err(error)) => Err(ProviderError::OutcomeUnknown(format!(
                "the list found nothing but search failed ({error}); both must answer before the attempt can expire"
            ))),
            (false, _) => Err(ProviderError::OutcomeUnknown(
                "no payment found by metadata yet; the key is not sent again, and the attempt \
                 expires only once its key window is over"
                    .to_owned(),
            )),
        };
        Ok(RoundObservation::after_complete_listing(calls_made, outcome))
    }
}

/// Adopts what a lookup found. More than one object for one attempt is the double charge this
/// product exists to prevent: it is adopted (the money moved) and flagged loudly.
fn adopted(
    found: Vec<PaymentSnapshot>,
    attempt: &Attempt,
    calls_made: u32,
    progress: ListProgress,
) -> RoundObservation {
    let LookupResolution::Adopt { snapshot, double_charge } = resolve_lookup(found) else {
        unreachable!("a non-empty lookup adopts an object")
    };
    let mut observation = Observation::of_snapshot(&snapshot, attempt);
    if double_charge.is_some() {
        observation.resolution.review_reason = double_charge;
    }
    RoundObservation {
        calls_made,
        lookup_progress: Some(progress),
        ..RoundObservation::of_call(Ok(observation))
    }
}

fn step_name(step: &RecoveryStep) -> &'static str {
    match step {
        RecoveryStep::ResendCreate => "create",
        RecoveryStep::Retrieve { .. } => "retrieve",
        RecoveryStep::FindByMetadata { .. } => "find",
        RecoveryStep::Cancel { .. } => "cancel",
        RecoveryStep::RetrieveConfirmed { .. } => "retrieve_confirmed",
    }
}
