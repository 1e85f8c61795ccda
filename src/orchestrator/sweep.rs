//! The pending sweep: finishes attempts whose caller never came back (the process died, the
//! message went to a dead-letter queue). One pass claims due rows, runs one provider round for
//! each (`round.rs` picks the step from the row: re-send inside the key window, look up by
//! metadata past it, retrieve, cancel), and stops after `batch_max` rows.
//!
//! Each row is claimed on its own, just before its round, with a lease as long as a live call's.
//! A row therefore never waits for a free slot while leased, so no lease can run out under a
//! round that has not started, and a sweeper that dies holds at most `concurrency_max` rows,
//! which become claimable again when their leases end.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::{Orchestrator, OrchestratorError, chrono_duration};
use crate::domain::{Attempt, AttemptStatus, LeaseOwner};
use crate::store::{Leased, RoundResult};

/// Bounds of one sweep pass.
#[derive(Debug, Clone)]
pub struct SweepSettings {
    /// Rows one pass reconciles at most.
    pub batch_max: u32,
    /// Rows in flight at once.
    pub concurrency_max: u32,
    /// How long a flagged row rests before the sweep looks at it (and logs it) again.
    pub review_reminder: Duration,
}

/// What one pass did. `claimed` = `succeeded` + `failed` + `unfinished` + `errors`; `flagged`
/// counts, among those, the rows that need a person after this pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepOutcome {
    pub claimed: u32,
    pub succeeded: u32,
    pub failed: u32,
    /// Still pending or requires_action: backing off until their next check.
    pub unfinished: u32,
    pub flagged: u32,
    /// Rows whose result could not be written (database errors); their leases run out.
    pub errors: u32,
}

impl std::ops::AddAssign for SweepOutcome {
    fn add_assign(&mut self, other: Self) {
        self.claimed += other.claimed;
        self.succeeded += other.succeeded;
        self.failed += other.failed;
        self.unfinished += other.unfinished;
        self.flagged += other.flagged;
        self.errors += other.errors;
    }
}

impl std::fmt::Display for SweepOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "claimed={} succeeded={} failed={} unfinished={} flagged={} errors={}",
            self.claimed, self.succeeded, self.failed, self.unfinished, self.flagged, self.errors
        )
    }
}

/// What the sweep does with a claimed row, decided from the row alone.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Visit {
    /// One provider round; `round.rs` chooses which.
    Round,
    /// No provider call: leave the row to a person and rest it until the next reminder.
    Park { reason: String },
}

/// However many rounds a row has had, it gets another: an outage of any length ends with the
/// row completed by the machine (SEMANTICS.md invariant 11), and the key window, not a round
/// count, decides when a re-send stops. Only a row flagged with no known provider object (a
/// key conflict) is left to a person — until `attempt recheck` clears it.
fn plan_visit(attempt: &Attempt) -> Visit {
    match (&attempt.review_reason, &attempt.provider_payment_id) {
        (Some(reason), None) => Visit::Park { reason: reason.clone() },
        _ => Visit::Round,
    }
}

/// How the sweep left one row.
enum RowEnd {
    Status { status: AttemptStatus, flagged: bool },
    Parked,
}

impl Orchestrator {
    /// One sweep pass, to completion. Tests and `chargeguard sweep --once` call this.
    pub async fn try_sweep_once(&self) -> Result<SweepOutcome, OrchestratorError> {
        self.sweep_once(&CancellationToken::new()).await
    }

    /// One sweep pass that stops between rows once `cancel` fires; rows already in a round
    /// finish it. Fails only when no row could be claimed because the database failed.
    #[tracing::instrument(
        name = "sweep",
        skip_all,
        fields(claimed, succeeded, failed, unfinished, flagged, errors)
    )]
    pub async fn sweep_once(
        &self,
        cancel: &CancellationToken,
    ) -> Result<SweepOutcome, OrchestratorError> {
        let settings = &self.settings.sweep;
        let started = Instant::now();
        let budget = AtomicU32::new(settings.batch_max);
        let slots = (0..settings.concurrency_max).map(|_| self.sweep_slot(&budget, cancel));
        let mut outcome = SweepOutcome::default();
        let mut claim_error = None;
        for (slot, error) in futures::future::join_all(slots).await {
            outcome += slot;
            if let Some(error) = error {
                outcome.errors += 1;
                claim_error.get_or_insert(error);
            }
        }
        metrics::histogram!("chargeguard_sweep_pass_seconds")
            .record(started.elapsed().as_secs_f64());
        self.record_oldest_unfinished_age().await;
        let span = tracing::Span::current();
        for (field, value) in [
            ("claimed", outcome.claimed),
            ("succeeded", outcome.succeeded),
            ("failed", outcome.failed),
            ("unfinished", outcome.unfinished),
            ("flagged", outcome.flagged),
            ("errors", outcome.errors),
        ] {
            span.record(field, value);
        }
        match claim_error {
            Some(error) if outcome.claimed == 0 => {
                tracing::error!(%error, "sweep pass could not claim rows");
                Err(error)
            }
            _ => {
                if outcome.claimed > 0 {
                    tracing::info!(%outcome, "sweep pass finished");
                }
                Ok(outcome)
            }
        }
    }

    /// One of the pass's concurrent workers: claims and visits one row at a time until the
    /// pass's budget is spent, nothing is due, or the pass is cancelled. Returns the claim
    /// error that stopped it, if any.
    async fn sweep_slot(
        &self,
        budget: &AtomicU32,
        cancel: &CancellationToken,
    ) -> (SweepOutcome, Option<OrchestratorError>) {
        let mut outcome = SweepOutcome::default();
        loop {
            if cancel.is_cancelled() {
                break;
            }
            if budget
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| left.checked_sub(1))
                .is_err()
            {
                break;
            }
            let owner = self.new_lease_owner();
            let leased = match self.store.claim_due(self.lease_request(owner), 1).await {
                Ok(rows) => match rows.into_iter().next() {
                    Some(leased) => leased,
                    None => break,
                },
                Err(error) => return (outcome, Some(error.into())),
            };
            let attempt = &leased.attempt;
            outcome.claimed += 1;
            metrics::counter!("chargeguard_sweep_rows_claimed_total").increment(1);
            let span = tracing::info_span!("sweep_row", attempt_id = %attempt.id,
                operation_key = %attempt.operation_key, check_count = attempt.check_count);
            let attempt_id = attempt.id;
            let result = match self.visit(leased, owner).instrument(span).await {
                Ok(RowEnd::Status { status, flagged }) => {
                    outcome.flagged += u32::from(flagged);
                    match status {
                        AttemptStatus::Succeeded => {
                            outcome.succeeded += 1;
                            "succeeded"
                        }
                        AttemptStatus::Failed => {
                            outcome.failed += 1;
                            "failed"
                        }
                        AttemptStatus::Pending | AttemptStatus::RequiresAction => {
                            outcome.unfinished += 1;
                            "unfinished"
                        }
                    }
                }
                Ok(RowEnd::Parked) => {
                    outcome.unfinished += 1;
                    outcome.flagged += 1;
                    "flagged"
                }
                Err(error) => {
                    tracing::error!(%attempt_id, %error, "sweep could not finish a row; its lease will run out");
                    outcome.errors += 1;
                    "error"
                }
            };
            metrics::counter!("chargeguard_sweep_rows_total", "result" => result).increment(1);
            crate::failpoints::crash_point("sweep.mid_batch");
        }
        (outcome, None)
    }

    async fn visit(&self, leased: Leased, owner: LeaseOwner) -> Result<RowEnd, OrchestratorError> {
        match plan_visit(&leased.attempt) {
            Visit::Round => {
                let review_before = leased.attempt.review_reason.clone();
                let end = self.run_round(leased, owner).await?;
                if let Some(error) = &end.provider_error {
                    tracing::warn!(%error, next_check_at = %end.attempt.next_check_at,
                        "provider answer unusable; the row backs off");
                }
                let flagged = end.attempt.review_reason.is_some()
                    && end.attempt.review_reason != review_before;
                Ok(RowEnd::Status { status: end.attempt.status, flagged })
            }
            Visit::Park { reason } => {
                let attempt = leased.attempt;
                let rest = chrono_duration(self.settings.sweep.review_reminder);
                tracing::error!(reason = %reason, rest_seconds = rest.num_seconds(),
                    "attempt needs review; the sweep will not send it to the provider again \
                     until an operator runs `chargeguard attempt recheck`");
                let result = RoundResult::unchanged(attempt.status, 0, rest, attempt.last_error.clone());
                self.store.finish_round(attempt.id, owner, &result, self.caller_time()).await?;
                self.notifier.round_finished(attempt.id);
                Ok(RowEnd::Parked)
            }
        }
    }

    async fn record_oldest_unfinished_age(&self) {
        match self.store.oldest_unfinished_created_at().await {
            Ok(oldest) => {
                let age = oldest.map_or(0.0, |created| {
                    (self.clock.now() - created).num_milliseconds().max(0) as f64 / 1_000.0
                });
                metrics::gauge!("chargeguard_unfinished_oldest_age_seconds").set(age);
            }
            Err(error) => tracing::warn!(%error, "cannot read the oldest unfinished attempt"),
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::{TimeZone, Utc};

    use super::*;

    fn attempt(check_count: u32) -> Attempt {
        let mut attempt =
            crate::domain::fixtures::pending_attempt(Utc.with_ymd_and_hms(2026, 12, 2, 0, 0, 0).unwrap());
        attempt.provider_calls = check_count;
        attempt.check_count = check_count;
        attempt.last_error = Some("outcome unknown: 500".into());
        attempt
    }

    #[test]
    fn a_row_gets_a_round_however_many_it_had() {
        assert_eq!(plan_visit(&attempt(0)), Visit::Round);
        assert_eq!(plan_visit(&attempt(10_000)), Visit::Round);
    }

    #[test]
    fn a_flagged_row_without_a_provider_object_is_never_sent_again() {
        let mut conflict = attempt(0);
        conflict.review_reason = Some("the provider reports an idempotency key conflict".into());
        assert!(matches!(plan_visit(&conflict), Visit::Park { .. }));
    }

    #[test]
    fn a_flagged_row_with_a_provider_object_is_still_read() {
        let mut unexpected = attempt(1);
        unexpected.review_reason = Some("provider object pi_1 is in unexpected status".into());
        unexpected.provider_payment_id = Some("pi_1".into());
        assert_eq!(plan_visit(&unexpected), Visit::Round);
    }

    #[test]
    fn outcomes_add_up() {
        let mut total = SweepOutcome { claimed: 1, succeeded: 1, ..SweepOutcome::default() };
        total += SweepOutcome {
            claimed: 2,
            failed: 1,
            unfinished: 1,
            flagged: 1,
            ..SweepOutcome::default()
        };
        assert_eq!(
            total.to_string(),
            "claimed=3 succeeded=1 failed=1 unfinished=1 flagged=1 errors=0"
        );
    }
}
