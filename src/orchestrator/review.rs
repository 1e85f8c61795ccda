//! An operator's way back for a row the machine left to a person: `chargeguard attempt recheck
//! ID` clears the review flag (the reason stays in the row's history) and runs one round at
//! once, under a lease like any other, so the row completes as soon as the cause is gone.

use super::{Orchestrator, OrchestratorError, RoundEnd};
use crate::domain::AttemptId;

impl Orchestrator {
    pub async fn recheck(&self, id: AttemptId) -> Result<RoundEnd, OrchestratorError> {
        let cleared = self
            .store
            .clear_review(id, self.caller_time())
            .await?
            .ok_or(OrchestratorError::NotFlagged { attempt_id: id })?;
        tracing::warn!(attempt_id = %id, operation_key = %cleared.operation_key,
            history = cleared.review_history.as_deref().unwrap_or(""),
            "review flag cleared by an operator; re-checking with the provider");
        self.outcome_cache.forget(&cleared.consumer, &cleared.operation_key);
        let owner = self.new_lease_owner();
        match self.store.acquire_lease(id, self.lease_request(owner)).await? {
            Some(leased) => self.run_round(leased, owner).await,
            // Someone holds it right now (a sweep that found it due): their round runs it.
            None => Err(OrchestratorError::InProgress { attempt_id: id }),
        }
    }
}
