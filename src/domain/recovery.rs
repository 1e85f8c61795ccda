use chrono::{DateTime, Duration, Utc};

use super::{Attempt, AttemptStatus, PaymentSnapshot};

/// How long after a key's first use chargeguard may still send it. Stripe may forget a key 24
/// hours after its first use, and a forgotten key makes a *new* charge; the safe window stays
/// well inside that, leaving room for clock skew and for the call itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyWindow {
    safe: Duration,
}

/// How far behind a recorded instant the clock may read (skew between replicas) before the
/// key window is treated as closed.
pub const CLOCK_SKEW_TOLERANCE: Duration = Duration::minutes(5);

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

    /// Open while the key is younger than the safe window. A clock that reads earlier than an
    /// instant already written on the row has jumped backwards (or another replica's runs
    /// ahead): the key's age is then unknown, and an unknown age counts as expired.
    pub fn is_open(self, attempt: &Attempt, now: DateTime<Utc>) -> bool {
        let clock_went_back = now + CLOCK_SKEW_TOLERANCE < attempt.updated_at
            || now + CLOCK_SKEW_TOLERANCE < attempt.key_window_started_at;
        !clock_went_back && now - attempt.key_window_started_at < self.safe
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
// Built once per lookup and consumed at once, never stored: boxing the snapshot buys nothing.
#[allow(clippy::large_enum_variant)]
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ProviderPaymentStatus;
    use chrono::TimeZone;

    fn at(hours: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap() + Duration::hours(hours)
    }

    fn pending_attempt() -> Attempt {
        crate::domain::fixtures::pending_attempt(at(0))
    }

    fn window() -> KeyWindow {
        KeyWindow::new(Duration::hours(23)).unwrap()
    }

    #[test]
    fn the_safe_window_stays_inside_the_provider_retention() {
        assert!(KeyWindow::new(Duration::hours(24)).is_none());
        assert!(KeyWindow::new(Duration::zero()).is_none());
    }

    #[test]
    fn resends_only_inside_the_window() {
        let attempt = pending_attempt();
        let step = |now| choose_recovery_step(&attempt, now, window(), Duration::hours(24));
        assert_eq!(step(at(1)), Some(RecoveryStep::ResendCreate));
        assert_eq!(step(at(22)), Some(RecoveryStep::ResendCreate));
        assert_eq!(step(at(23)), Some(RecoveryStep::FindByMetadata));
        assert_eq!(step(at(25)), Some(RecoveryStep::FindByMetadata));
    }

    #[test]
    fn a_clock_that_went_backwards_closes_the_window() {
        let mut attempt = pending_attempt();
        attempt.updated_at = at(10);
        assert!(!window().is_open(&attempt, at(9)));
        assert!(window().is_open(&attempt, at(10)));
    }

    #[test]
    fn known_objects_are_read_and_abandoned_actions_cancelled() {
        let mut attempt = pending_attempt();
        attempt.provider_payment_id = Some("pi_1".into());
        let step = choose_recovery_step(&attempt, at(30), window(), Duration::hours(24));
        assert_eq!(step, Some(RecoveryStep::Retrieve { provider_payment_id: "pi_1".into() }));
        attempt.status = AttemptStatus::RequiresAction;
        let step = choose_recovery_step(&attempt, at(30), window(), Duration::hours(24));
        assert_eq!(step, Some(RecoveryStep::Cancel { provider_payment_id: "pi_1".into() }));
        attempt.status = AttemptStatus::Succeeded;
        assert_eq!(choose_recovery_step(&attempt, at(30), window(), Duration::hours(24)), None);
    }

    fn snapshot(id: &str, status: ProviderPaymentStatus, created_hour: i64) -> PaymentSnapshot {
        crate::domain::fixtures::snapshot(id, status, at(created_hour))
    }

    #[test]
    fn lookup_adopts_one_object_and_flags_two() {
        assert_eq!(resolve_lookup(vec![]), LookupResolution::NothingCharged);
        let one = resolve_lookup(vec![snapshot("pi_1", ProviderPaymentStatus::Succeeded, 0)]);
        assert!(matches!(one, LookupResolution::Adopt { double_charge: None, .. }));
        let two = resolve_lookup(vec![
            snapshot("pi_1", ProviderPaymentStatus::RequiresPaymentMethod, 0),
            snapshot("pi_2", ProviderPaymentStatus::Succeeded, 1),
            snapshot("pi_2", ProviderPaymentStatus::Succeeded, 1),
        ]);
        let LookupResolution::Adopt { snapshot, double_charge } = two else {
            panic!("two objects must be adopted, not ignored")
        };
        assert_eq!(snapshot.id, "pi_2", "the succeeded one is adopted");
        let reason = double_charge.expect("flagged");
        assert!(reason.contains("pi_1") && reason.contains("pi_2"), "{reason}");
        assert!(!reason.contains("3 provider objects"), "duplicates from search and list count once");
    }
}
