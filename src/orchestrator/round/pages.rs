//! The resumable listing both lookups past the key window share (a charge's payments in its
//! created range, a refund's charge's refunds): from the row's saved position, at most
//! `lookup_pages_per_round` pages, renewing the lease and saving the position between pages.

use std::future::Future;

use super::RoundObservation;
use crate::domain::{Attempt, LeaseOwner, ListProgress};
use crate::orchestrator::{Orchestrator, OrchestratorError, chrono_duration};
use crate::provider::ProviderError;

/// How a listing ended.
pub(super) enum Listed<T> {
    /// Objects carrying the attempt's id (at least one).
    Found(Vec<T>),
    /// Every page was read; none carried the attempt's id.
    Complete,
    /// The round ends here, unfinished: a page failed, the lease ran out, or the page bound was
    /// reached (then the next round follows at once, from the saved position).
    Stopped(RoundObservation),
}

impl Orchestrator {
    /// Lists with `fetch(cursor) -> (objects, next cursor)`, keeping the objects `belongs`
    /// accepts; `calls_made` counts the round's calls so far and is returned with the end.
    pub(super) async fn list_pages<T, F, Fut>(
        &self,
        attempt: &Attempt,
        owner: LeaseOwner,
        mut calls_made: u32,
        mut fetch: F,
        belongs: impl Fn(&T) -> bool,
    ) -> Result<(Listed<T>, u32), OrchestratorError>
    where
        F: FnMut(Option<String>) -> Fut,
        Fut: Future<Output = Result<(Vec<T>, Option<String>), ProviderError>>,
    {
        let stopped = |calls_made, progress, error| {
            Listed::Stopped(RoundObservation {
                calls_made,
                lookup_progress: Some(progress),
                ..RoundObservation::of_call(Err(error))
            })
        };
        let mut progress = match &attempt.lookup_progress {
            ListProgress::Complete => ListProgress::NotStarted,
            other => other.clone(),
        };
        for page_index in 0..self.settings.lookup_pages_per_round {
            if page_index > 0 {
                let lease = chrono_duration(self.settings.lease_duration);
                let renewed =
                    self.store.renew_lease(attempt.id, owner, lease, &progress, self.caller_time()).await?;
                if !renewed {
                    let error = ProviderError::OutcomeUnknown("the lease ran out during the lookup".to_owned());
                    return Ok((stopped(calls_made, progress, error), calls_made));
                }
            }
            calls_made += 1;
            let (objects, next_cursor) = match fetch(progress.cursor().map(str::to_owned)).await {
                Ok(page) => page,
                Err(error) => return Ok((stopped(calls_made, progress, error), calls_made)),
            };
            let found: Vec<T> = objects.into_iter().filter(|object| belongs(object)).collect();
            if !found.is_empty() {
                return Ok((Listed::Found(found), calls_made));
            }
            progress = match next_cursor {
                Some(cursor) => ListProgress::After(cursor),
                None => return Ok((Listed::Complete, calls_made)),
            };
        }
        metrics::counter!("chargeguard_lookup_rounds_continued_total").increment(1);
        let error = ProviderError::OutcomeUnknown(format!(
            "lookup by metadata continues: {} list pages read this round",
            self.settings.lookup_pages_per_round
        ));
        let mut observation = match stopped(calls_made, progress, error) {
            Listed::Stopped(observation) => observation,
            _ => unreachable!("stopped builds a stopped listing"),
        };
        observation.lookup_unfinished = true;
        Ok((Listed::Stopped(observation), calls_made))
    }
}
