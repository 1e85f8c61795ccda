use chrono::{DateTime, Duration, Utc};

use super::{Attempt, AttemptStatus, PaymentSnapshot};

/// How long after a key's first use chargeguard may still send it. Stripe may forget a key 24
/// hours after its first use, and a forgotten key makes a *new* charge; the safe window stays
/// well inside that, leaving room for clock skew and for the call itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyWindow {
    safe: Duration,
}

/// How far apart the clocks the service reads may be (replicas, the database, the provider)
/// without it noticing. Every bound that involves a clock leaves this much room.
pub const CLOCK_SKEW_TOLERANCE: Duration = Duration::minutes(5);

/// The provider's own retention of idempotency keys.
pub const PROVIDER_KEY_RETENTION: Duration = Duration::hours(24);

/// What the clocks the service can read said at one decision: this process's, and the
/// database's as read by the statement that took the row's lease. Replicas' clocks differ
/// from each other and from the database's; a decision that depends on time uses whichever
/// reading makes it the safer one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockReadings {
    pub process: DateTime<Utc>,
    pub database: DateTime<Utc>,
}

impl ClockReadings {
    pub fn earliest(self) -> DateTime<Utc> {
        self.process.min(self.database)
    }

    pub fn latest(self) -> DateTime<Utc> {
        self.process.max(self.database)
    }
}

/// How old the attempt's key is, as far as the service can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyAge {
    /// Younger than the safe window on every clock: a re-send is replayed or performed once.
    Open,
    /// At least the safe window old on some clock: never send the key again.
    Expired,
    /// A clock reads earlier than an instant already on the row (the key's start, or the last
    /// write): that clock jumped back or runs behind, and the key's age is unknown. Never send
    /// the key; but nothing proves the window over either, so a lookup that finds nothing does
    /// not end the attempt.
    Unknown,
}

impl KeyWindow {
    /// `safe` must be shorter than the provider's retention, or re-sends could create charges.
    pub fn new(safe: Duration) -> Option<Self> {
        (safe > Duration::zero() && safe < PROVIDER_KEY_RETENTION).then_some(Self { safe })
    }

    pub fn safe(self) -> Duration {
        self.safe
    }

    /// Every clock may only close the window earlier, never keep it open: the start on the
    /// row is the earliest reading at insert, the age here is measured by the latest reading,
    /// and a reading before the start (or before the row's last write) means the age is
    /// unknown — beyond the tolerance that covers ordinary skew.
    pub fn age(self, attempt: &Attempt, readings: ClockReadings) -> KeyAge {
        let started_at = attempt.key_window_started_at;
        if readings.latest() - started_at >= self.safe {
            return KeyAge::Expired;
        }
        let reads_before = |instant: DateTime<Utc>| readings.earliest() + CLOCK_SKEW_TOLERANCE < instant;
        if reads_before(started_at) || reads_before(attempt.updated_at) {
            return KeyAge::Unknown;
        }
        KeyAge::Open
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
    /// Never send the key again; look for objects carrying the attempt's metadata instead.
    /// `conclusive`: finding nothing ends the attempt as expired (the window is over); else
    /// the row stays pending and is looked up again after a backoff.
    FindByMetadata { conclusive: bool },
    /// The customer never acted within the allowed time: cancel at the provider.
    Cancel { provider_payment_id: String },
    /// An attempt that confirms an earlier attempt's intent again (issue 16), with no answer
    /// recorded and its key no longer safe to send: read the intent, whose id is known. Its
    /// metadata names the earlier attempt, so a lookup by metadata would find nothing of ours.
    /// `conclusive`: the window is over, so an intent still waiting for a payment method proves
    /// nothing was charged under this attempt's key.
    RetrieveConfirmed { provider_payment_id: String, conclusive: bool },
}

/// Chooses the next step for an unfinished attempt, or `None` for a terminal one.
pub fn choose_recovery_step(
    attempt: &Attempt,
    readings: ClockReadings,
    window: KeyWindow,
    requires_action_age_max: Duration,
) -> Option<RecoveryStep> {
    if attempt.status.is_terminal() {
        return None;
    }
    if let Some(provider_payment_id) = attempt.provider_payment_id.clone() {
        // The customer's time counts from when the action was asked for; rows recorded before
        // that instant was kept count from their creation (earlier: the safer side for a cancel
        // is not to wait longer than allowed).
        let action_started_at = attempt.action_started_at.unwrap_or(attempt.created_at);
        let action_expired = attempt.status == AttemptStatus::RequiresAction
            && readings.database - action_started_at > requires_action_age_max;
        return Some(if action_expired {
            RecoveryStep::Cancel { provider_payment_id }
        } else {
            RecoveryStep::Retrieve { provider_payment_id }
        });
    }
    if let Some(confirmed) = attempt.confirms_payment_id.clone() {
        return Some(confirm_recovery_step(attempt, confirmed, window.age(attempt, readings)));
    }
    Some(match window.age(attempt, readings) {
        KeyAge::Expired => RecoveryStep::FindByMetadata { conclusive: true },
        KeyAge::Unknown => RecoveryStep::FindByMetadata { conclusive: false },
        // A key whose saved answer is a failure will be answered the same way for as long as
        // the provider remembers it: look the object up instead, until the window closes.
        KeyAge::Open if attempt.create_replays_failure => RecoveryStep::FindByMetadata { conclusive: false },
        KeyAge::Open => RecoveryStep::ResendCreate,
    })
}

/// A confirm of an earlier attempt's intent: inside the key window it is re-sent with the stored
/// key (the provider replays or performs it once); past it, or with a key that replays a saved
/// failure, never re-sent: the intent is read instead.
fn confirm_recovery_step(attempt: &Attempt, provider_payment_id: String, age: KeyAge) -> RecoveryStep {
    match age {
        KeyAge::Open if !attempt.create_replays_failure => RecoveryStep::ResendCreate,
        KeyAge::Expired => RecoveryStep::RetrieveConfirmed { provider_payment_id, conclusive: true },
        KeyAge::Open | KeyAge::Unknown => RecoveryStep::RetrieveConfirmed { provider_payment_id, conclusive: false },
    }
}

/// What the re-confirmed intent, read past the attempt's key window, says about the attempt;
/// `None` leaves it pending. The intent succeeds at most once, and attempt n + 2 cannot exist
/// while this attempt is undecided, so a success is this attempt's. Still waiting for a payment
/// method: nothing was charged — the attempt expires once the window is over (`conclusive`),
/// and waits while the key's age is unknown. Processing waits (resolve_snapshot keeps it pending).
pub fn resolve_confirmed(
    snapshot: &PaymentSnapshot,
    requested: &super::ChargeParams,
    conclusive: bool,
) -> Option<super::Resolution> {
    if snapshot.status != super::ProviderPaymentStatus::RequiresPaymentMethod {
        return Some(super::resolve_snapshot(snapshot, requested));
    }
    conclusive.then(|| super::Resolution {
        status: AttemptStatus::Failed,
        failure: Some(super::Failure::expired()),
        next_action: None,
        review_reason: None,
    })
}

/// The provider `created` range in which an attempt's objects can lie: from the key's start to
/// the end of the last lease under which a create could be sent, widened by the skew
/// tolerance (the provider's clock) and `slack`. Rows recorded before `create_sent_until`
/// existed fall back to the whole window.
pub fn lookup_created_range(
    attempt: &Attempt,
    window: KeyWindow,
    slack: Duration,
) -> (DateTime<Utc>, DateTime<Utc>) {
    let started_at = attempt.key_window_started_at;
    let sent_until = attempt.create_sent_until.unwrap_or(started_at + window.safe());
    let margin = CLOCK_SKEW_TOLERANCE + slack;
    (started_at - margin, sent_until.max(started_at) + margin)
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
        format!("{}: {} provider objects for one attempt: {}", super::review::DOUBLE_CHARGE, ids.len(), ids.join(", "))
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

    /// Both clocks agree.
    fn agreed(hours: i64) -> ClockReadings {
        ClockReadings { process: at(hours), database: at(hours) }
    }

    #[test]
    fn the_safe_window_stays_inside_the_provider_retention() {
        assert!(KeyWindow::new(Duration::hours(24)).is_none());
        assert!(KeyWindow::new(Duration::zero()).is_none());
    }

    #[test]
    fn resends_only_inside_the_window() {
        let attempt = pending_attempt();
        let step = |hours| choose_recovery_step(&attempt, agreed(hours), window(), Duration::hours(24));
        assert_eq!(step(1), Some(RecoveryStep::ResendCreate));
        assert_eq!(step(22), Some(RecoveryStep::ResendCreate));
        assert_eq!(step(23), Some(RecoveryStep::FindByMetadata { conclusive: true }));
        assert_eq!(step(25), Some(RecoveryStep::FindByMetadata { conclusive: true }));
    }

    #[test]
    fn a_clock_that_went_backwards_makes_the_age_unknown() {
        let mut attempt = pending_attempt();
        attempt.updated_at = at(10);
        assert_eq!(window().age(&attempt, agreed(9)), KeyAge::Unknown);
        assert_eq!(window().age(&attempt, agreed(10)), KeyAge::Open);
    }

    #[test]
    fn the_latest_clock_ages_the_key() {
        let attempt = pending_attempt();
        let fast_process = ClockReadings { process: at(23), database: at(21) };
        assert_eq!(window().age(&attempt, fast_process), KeyAge::Expired);
        let fast_database = ClockReadings { process: at(21), database: at(23) };
        assert_eq!(window().age(&attempt, fast_database), KeyAge::Expired);
        assert_eq!(window().age(&attempt, agreed(21)), KeyAge::Open);
    }

    #[test]
    fn a_clock_behind_the_key_start_beyond_the_tolerance_never_resends() {
        let mut attempt = pending_attempt();
        attempt.key_window_started_at = at(2);
        attempt.updated_at = at(2);
        let slow_process = ClockReadings { process: at(0), database: at(2) };
        assert_eq!(window().age(&attempt, slow_process), KeyAge::Unknown);
        let step = choose_recovery_step(&attempt, slow_process, window(), Duration::hours(24));
        assert_eq!(step, Some(RecoveryStep::FindByMetadata { conclusive: false }));
        let within_tolerance = ClockReadings {
            process: at(2) - CLOCK_SKEW_TOLERANCE,
            database: at(2),
        };
        assert_eq!(window().age(&attempt, within_tolerance), KeyAge::Open);
    }

    #[test]
    fn a_key_that_replays_a_failure_is_looked_up_not_resent() {
        let mut attempt = pending_attempt();
        attempt.create_replays_failure = true;
        let step = |hours| choose_recovery_step(&attempt, agreed(hours), window(), Duration::hours(24));
        assert_eq!(step(1), Some(RecoveryStep::FindByMetadata { conclusive: false }));
        assert_eq!(step(23), Some(RecoveryStep::FindByMetadata { conclusive: true }));
    }

    #[test]
    fn the_lookup_range_covers_the_sends_not_the_window() {
        let mut attempt = pending_attempt();
        attempt.create_sent_until = Some(at(0) + Duration::seconds(30));
        let slack = Duration::minutes(1);
        let (from, to) = lookup_created_range(&attempt, window(), slack);
        assert_eq!(from, at(0) - CLOCK_SKEW_TOLERANCE - slack);
        assert_eq!(to, at(0) + Duration::seconds(30) + CLOCK_SKEW_TOLERANCE + slack);
        attempt.create_sent_until = None;
        let (_, to) = lookup_created_range(&attempt, window(), slack);
        assert_eq!(to, at(23) + CLOCK_SKEW_TOLERANCE + slack, "old rows: the whole window");
    }

    #[test]
    fn an_action_times_out_from_when_it_was_asked_for() {
        let mut attempt = pending_attempt();
        attempt.status = AttemptStatus::RequiresAction;
        attempt.provider_payment_id = Some("pi_1".into());
        attempt.action_started_at = Some(at(10));
        let step = |hours| choose_recovery_step(&attempt, agreed(hours), window(), Duration::hours(24));
        assert_eq!(step(30), Some(RecoveryStep::Retrieve { provider_payment_id: "pi_1".into() }));
        assert_eq!(step(35), Some(RecoveryStep::Cancel { provider_payment_id: "pi_1".into() }));
    }

    #[test]
    fn known_objects_are_read_and_abandoned_actions_cancelled() {
        let mut attempt = pending_attempt();
        attempt.provider_payment_id = Some("pi_1".into());
        let step = choose_recovery_step(&attempt, agreed(30), window(), Duration::hours(24));
        assert_eq!(step, Some(RecoveryStep::Retrieve { provider_payment_id: "pi_1".into() }));
        attempt.status = AttemptStatus::RequiresAction;
        let step = choose_recovery_step(&attempt, agreed(30), window(), Duration::hours(24));
        assert_eq!(step, Some(RecoveryStep::Cancel { provider_payment_id: "pi_1".into() }));
        attempt.status = AttemptStatus::Succeeded;
        assert_eq!(choose_recovery_step(&attempt, agreed(30), window(), Duration::hours(24)), None);
    }

    #[test]
    fn a_confirm_is_resent_inside_the_window_and_its_intent_read_after() {
        let mut attempt = pending_attempt();
        attempt.generation = 1;
        attempt.confirms_payment_id = Some("pi_1".into());
        let step = |attempt: &Attempt, readings| choose_recovery_step(attempt, readings, window(), Duration::hours(24));
        assert_eq!(step(&attempt, agreed(1)), Some(RecoveryStep::ResendCreate));
        let read = |conclusive| Some(RecoveryStep::RetrieveConfirmed { provider_payment_id: "pi_1".into(), conclusive });
        assert_eq!(step(&attempt, agreed(23)), read(true), "never a lookup by metadata: it names attempt 1");
        attempt.updated_at = at(10);
        assert_eq!(step(&attempt, agreed(9)), read(false), "a clock that went back never re-sends");
        attempt.updated_at = at(0);
        attempt.create_replays_failure = true;
        assert_eq!(step(&attempt, agreed(1)), read(false));
        attempt.provider_payment_id = Some("pi_1".into());
        assert_eq!(
            step(&attempt, agreed(1)),
            Some(RecoveryStep::Retrieve { provider_payment_id: "pi_1".into() }),
            "once the confirm answered, the intent is this attempt's known object"
        );
    }

    #[test]
    fn a_read_confirmed_intent_adopts_success_waits_on_processing_and_expires_unpaid() {
        let attempt = pending_attempt();
        let read = |status, conclusive| resolve_confirmed(&snapshot("pi_1", status, 0), &attempt.params, conclusive);
        assert_eq!(read(ProviderPaymentStatus::Succeeded, true).unwrap().status, AttemptStatus::Succeeded);
        assert_eq!(read(ProviderPaymentStatus::Succeeded, false).unwrap().status, AttemptStatus::Succeeded);
        assert_eq!(read(ProviderPaymentStatus::Processing, true).unwrap().status, AttemptStatus::Pending);
        let expired = read(ProviderPaymentStatus::RequiresPaymentMethod, true).unwrap();
        assert_eq!(expired.status, AttemptStatus::Failed);
        assert_eq!(expired.failure.unwrap().code, crate::domain::Failure::expired().code);
        assert_eq!(read(ProviderPaymentStatus::RequiresPaymentMethod, false), None, "the key's age is unknown");
        assert_eq!(read(ProviderPaymentStatus::Canceled, false).unwrap().status, AttemptStatus::Failed);
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
