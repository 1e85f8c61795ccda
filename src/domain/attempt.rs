use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{ChargeParams, ConsumerName, Fingerprint, IdempotencyKey, OperationKey};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AttemptId(Uuid);

impl AttemptId {
    pub fn from_uuid(id: Uuid) -> Self {
        Self(id)
    }
    pub fn as_uuid(self) -> Uuid {
        self.0
    }
}

impl std::fmt::Display for AttemptId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptKind {
    Charge,
    /// Money back from a succeeded charge: a row of its own, with its own operation key and
    /// derived key, linked to the charge by `Attempt::parent_attempt_id`.
    Refund,
}

impl AttemptKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptKind::Charge => "charge",
            AttemptKind::Refund => "refund",
        }
    }
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "charge" => Some(AttemptKind::Charge),
            "refund" => Some(AttemptKind::Refund),
            _ => None,
        }
    }
}

/// Why money is given back, in Stripe's three words for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RefundReason {
    Duplicate,
    Fraudulent,
    RequestedByCustomer,
}

impl RefundReason {
    pub const ALL: [RefundReason; 3] =
        [RefundReason::Duplicate, RefundReason::Fraudulent, RefundReason::RequestedByCustomer];

    pub fn as_str(self) -> &'static str {
        match self {
            RefundReason::Duplicate => "duplicate",
            RefundReason::Fraudulent => "fraudulent",
            RefundReason::RequestedByCustomer => "requested_by_customer",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|reason| reason.as_str() == value)
    }
}

/// The attempt lifecycle of SEMANTICS.md. States only move forward: pending, then
/// requires_action, then a terminal state; a terminal state never changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttemptStatus {
    Pending,
    RequiresAction,
    Succeeded,
    Failed,
}

impl AttemptStatus {
    pub const ALL: [AttemptStatus; 4] = [
        AttemptStatus::Pending,
        AttemptStatus::RequiresAction,
        AttemptStatus::Succeeded,
        AttemptStatus::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AttemptStatus::Pending => "pending",
            AttemptStatus::RequiresAction => "requires_action",
            AttemptStatus::Succeeded => "succeeded",
            AttemptStatus::Failed => "failed",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == value)
    }

    pub fn is_terminal(self) -> bool {
        match self {
            AttemptStatus::Succeeded | AttemptStatus::Failed => true,
            AttemptStatus::Pending | AttemptStatus::RequiresAction => false,
        }
    }

    fn rank(self) -> u8 {
        match self {
            AttemptStatus::Pending => 0,
            AttemptStatus::RequiresAction => 1,
            AttemptStatus::Succeeded | AttemptStatus::Failed => 2,
        }
    }

    /// Whether a row in `self` may be moved to `next`. Staying put is not a move.
    pub fn can_move_to(self, next: AttemptStatus) -> bool {
        next.rank() > self.rank()
    }

    /// The states a row may be in for a move to `self` to be allowed; used as the guard of the
    /// conditional update, so the database enforces monotonicity even against racing writers.
    pub fn allowed_sources(self) -> Vec<AttemptStatus> {
        Self::ALL.into_iter().filter(|source| source.can_move_to(self)).collect()
    }
}

/// Why an attempt failed, in the provider's words (`card_declined`) or ours (`expired`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub code: String,
    pub message: String,
}

impl Failure {
    /// A provider's error on its own terms (Stripe's): `code` is the error's `code`
    /// (`card_declined`, `expired_card`, `incorrect_cvc`, …), or `fallback_code` when it has
    /// none. The issuer's `decline_code` (`generic_decline`, `insufficient_funds`, …) refines
    /// `card_declined`; with no field of its own it is kept visible at the end of the message.
    pub fn from_provider_error(
        code: Option<&str>,
        decline_code: Option<&str>,
        message: Option<&str>,
        fallback_code: &str,
    ) -> Self {
        let code = code.unwrap_or(fallback_code).to_owned();
        let message = message.unwrap_or_default();
        let message = match decline_code {
            Some(decline_code) if decline_code != code && message.is_empty() => {
                format!("decline_code: {decline_code}")
            }
            Some(decline_code) if decline_code != code => {
                format!("{message} (decline_code: {decline_code})")
            }
            _ => message.to_owned(),
        };
        Self { code, message }
    }

    /// The key window passed and the provider confirmed that nothing was charged.
    pub fn expired() -> Self {
        Self {
            code: "expired".to_owned(),
            message: "the provider has no payment for this attempt and its idempotency key \
                      may have expired; nothing was charged"
                .to_owned(),
        }
    }
}

/// What the customer must do before the payment can complete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NextAction {
    pub kind: String,
    pub redirect_url: Option<String>,
}

/// The identity of one holder of a lease on an attempt: one call or one sweep pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseOwner(Uuid);

impl LeaseOwner {
    pub fn from_uuid(id: Uuid) -> Self {
        Self(id)
    }
    pub fn as_uuid(self) -> Uuid {
        self.0
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub owner: LeaseOwner,
    pub expires_at: DateTime<Utc>,
}

/// How far a lookup past the key window has listed the provider's objects. Kept on the row, so
/// that a lookup in a busy account resumes across rounds instead of starting over.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ListProgress {
    #[default]
    NotStarted,
    /// The next page starts after this object.
    After(String),
    /// Every page of the attempt's created range was read.
    Complete,
}

impl ListProgress {
    /// The cursor to start the next page from, if paging is under way.
    pub fn cursor(&self) -> Option<&str> {
        match self {
            ListProgress::After(cursor) => Some(cursor),
            ListProgress::NotStarted | ListProgress::Complete => None,
        }
    }
}

/// One row of `payment_attempts`.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    pub id: AttemptId,
    pub consumer: ConsumerName,
    pub operation_key: OperationKey,
    pub kind: AttemptKind,
    pub params: ChargeParams,
    pub fingerprint: Fingerprint,
    pub status: AttemptStatus,
    pub provider: String,
    pub provider_payment_id: Option<String>,
    pub provider_status: Option<String>,
    pub idempotency_key: IdempotencyKey,
    /// The operation's attempt number less one: attempt n of an operation is generation n - 1,
    /// with a key of its own. Refunds have one attempt (generation 0).
    pub generation: u32,
    /// A refund's charge; `None` for charges.
    pub parent_attempt_id: Option<AttemptId>,
    /// A refund's reason as sent to the provider; `None` for charges and unreasoned refunds.
    pub refund_reason: Option<RefundReason>,
    /// An earlier attempt's provider object that this attempt confirms again with its own key
    /// and payment method; `None` when the attempt creates its own object.
    pub confirms_payment_id: Option<String>,
    /// A refund the provider reported failed after it had succeeded: when that was recorded.
    pub failed_after_success_at: Option<DateTime<Utc>>,
    pub failure: Option<Failure>,
    pub next_action: Option<NextAction>,
    pub review_reason: Option<String>,
    /// Reasons an operator cleared with `attempt recheck`, kept for the record.
    pub review_history: Option<String>,
    pub provider_calls: u32,
    /// When the current idempotency key may first have reached the provider. The provider
    /// forgets keys a fixed time after their first use, so this bounds every re-send.
    pub key_window_started_at: DateTime<Utc>,
    /// No create with the current key can have reached the provider after this instant
    /// (database time): the end of the last lease under which a create could be sent. Bounds
    /// the created range a lookup lists. `None` on rows written before it was recorded.
    pub create_sent_until: Option<DateTime<Utc>>,
    /// The provider saved a failed answer (a 5xx) for the current key and replays it: sending
    /// the key again can never succeed, so only a lookup can find what happened.
    pub create_replays_failure: bool,
    pub lookup_progress: ListProgress,
    /// Fixed when the row is written and sent with every create under its key: a changed
    /// configuration never alters a re-send (SEMANTICS.md invariant 10).
    pub return_url: Option<String>,
    /// When the row entered requires_action: the customer's time to act counts from here.
    pub action_started_at: Option<DateTime<Utc>>,
    pub lease: Option<Lease>,
    pub check_count: u32,
    pub next_check_at: DateTime<Utc>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl Attempt {
    /// The operation's attempt number, 1-based, as callers name it.
    pub fn attempt_number(&self) -> u32 {
        self.generation.saturating_add(1)
    }

    pub fn is_leased_at(&self, now: DateTime<Utc>) -> bool {
        self.lease.is_some_and(|lease| lease.expires_at > now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_states_never_move() {
        for terminal in [AttemptStatus::Succeeded, AttemptStatus::Failed] {
            for next in AttemptStatus::ALL {
                assert!(!terminal.can_move_to(next), "{terminal:?} -> {next:?}");
            }
        }
    }

    #[test]
    fn states_move_forward_only() {
        assert!(AttemptStatus::Pending.can_move_to(AttemptStatus::RequiresAction));
        assert!(AttemptStatus::Pending.can_move_to(AttemptStatus::Succeeded));
        assert!(AttemptStatus::RequiresAction.can_move_to(AttemptStatus::Failed));
        assert!(!AttemptStatus::RequiresAction.can_move_to(AttemptStatus::Pending));
        assert!(!AttemptStatus::Pending.can_move_to(AttemptStatus::Pending));
    }

    #[test]
    fn allowed_sources_match_moves() {
        assert_eq!(
            AttemptStatus::Succeeded.allowed_sources(),
            vec![AttemptStatus::Pending, AttemptStatus::RequiresAction]
        );
        assert_eq!(AttemptStatus::RequiresAction.allowed_sources(), vec![AttemptStatus::Pending]);
        assert!(AttemptStatus::Pending.allowed_sources().is_empty());
    }

    #[test]
    fn a_provider_failure_keeps_the_error_code_and_shows_the_decline_code() {
        let check = |code, decline_code, message, expected: (&str, &str)| {
            let failure = Failure::from_provider_error(code, decline_code, message, "payment_failed");
            assert_eq!((failure.code.as_str(), failure.message.as_str()), expected);
        };
        check(
            Some("card_declined"),
            Some("generic_decline"),
            Some("Your card was declined."),
            ("card_declined", "Your card was declined. (decline_code: generic_decline)"),
        );
        check(
            Some("expired_card"),
            Some("expired_card"),
            Some("Your card has expired."),
            ("expired_card", "Your card has expired."),
        );
        check(None, Some("insufficient_funds"), None, ("payment_failed", "decline_code: insufficient_funds"));
        check(None, None, Some("no"), ("payment_failed", "no"));
    }

    #[test]
    fn kind_and_reason_names_round_trip() {
        for kind in [AttemptKind::Charge, AttemptKind::Refund] {
            assert_eq!(AttemptKind::parse(kind.as_str()), Some(kind));
        }
        for reason in RefundReason::ALL {
            assert_eq!(RefundReason::parse(reason.as_str()), Some(reason));
        }
        assert_eq!(RefundReason::parse("because"), None);
    }

    #[test]
    fn status_names_round_trip() {
        for status in AttemptStatus::ALL {
            assert_eq!(AttemptStatus::parse(status.as_str()), Some(status));
        }
    }
}
