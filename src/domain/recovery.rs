use chrono::{DateTime, Duration, Utc};

use super::{Attempt, AttemptStatus, PaymentSnapshot};

/// How long after a key's first use chargeguard may still send it. Stripe may forget a key 24
/// hours after its first use, and a forgotten key makes a *new* charge; the safe window stays
/// well inside that, leaving room for clock skew and for the call itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyWindow {
    safe: Duration,
}

/// The provider's own retention of idempotency keys.
pub const PROVIDER_KEY_RETENTION: Duration = Duration::hours(24);

impl KeyWindow {
    /// `safe` must be shorter than the provider's retention, or re-sends could create charges.
    pub fn new(safe: Duration) -> Option<Self> {
        (safe > Duration::zero() && safe < PROVIDER_KEY_RETENTION).then_some(Self { safe })
    }

    pub fn safe(self) -> Duration {
        self.safe
    }

    pub fn is_open(self, attempt: &Attempt, now: DateTime<Utc>) -> bool {
        now - attempt.key_window_started_at < self.safe
    }
}

/// The one provider call that moves an unfinished attempt towards a terminal state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecoveryStep {
    /// Inside the key window: send the create again with the stored key. The provider either
    /// replays the first answer or performs the charge once.
    ResendCreate,
    /// The provider object is known: read it.
    Retrieve { provider_payment_id: String },
    /// Past the key window with no known object: never send the key again; look for objects
    /// carrying the attempt's metadata instead.
    FindByMetadata,
    /// The customer never acted within the allowed time: cancel at the provider.
    Cancel { provider_payment_id: String },
}

/// Chooses the next step for an unfinished attempt, or `None` for a terminal one.
pub fn choose_recovery_step(
    attempt: &Attempt,
    now: DateTime<Utc>,
    window: KeyWindow,
    requires_action_age_max: Duration,
) -> Option<RecoveryStep> {
    if attempt.status.is_terminal() {
        return None;
    }
    if let Some(provider_payment_id) = attempt.provider_payment_id.clone() {
        let action_expired = attempt.status == AttemptStatus::RequiresAction
            && now - attempt.created_at > requires_action_age_max;
        return Some(if action_expired {
            RecoveryStep::Cancel { provider_payment_id }
        } else {
            RecoveryStep::Retrieve { provider_payment_id }
        });
    }
    Some(if window.is_open(attempt, now) {
        RecoveryStep::ResendCreate
    } else {
        RecoveryStep::FindByMetadata
    })
}

/// What a metadata lookup past the key window found.
#[derive(Debug, Clone, PartialEq)]
pub enum LookupResolution {
    /// The provider confirms nothing exists for the attempt: it can fail as expired.
    NothingCharged,
    /// Adopt this object. `double_charge` names every object when there was more than one.
    Adopt { snapshot: PaymentSnapshot, double_charge: Option<String> },
}

/// Picks what to adopt from the objects found for one attempt. More than one object for one
/// attempt is the double charge this product exists to prevent: it is adopted (the money moved)
/// and reported loudly, never hidden.
pub fn resolve_lookup(mut found: Vec<PaymentSnapshot>) -> LookupResolution {
    found.sort_by(|a, b| a.created.cmp(&b.created).then_with(|| a.id.cmp(&b.id)));
    found.dedup_by(|a, b| a.id == b.id);
    let double_charge = (found.len() > 1).then(|| {
        let ids: Vec<&str> = found.iter().map(|snapshot| snapshot.id.as_str()).collect();
        format!("double charge: {} provider objects for one attempt: {}", ids.len(), ids.join(", "))
    });
    let preferred = found
        .iter()
        .position(|s| s.status == super::ProviderPaymentStatus::Succeeded)
        .or_else(|| (!found.is_empty()).then_some(0));
    match preferred {
        None => LookupResolution::NothingCharged,
        Some(index) => LookupResolution::Adopt { snapshot: found.swap_remove(index), double_charge },
    }
}
