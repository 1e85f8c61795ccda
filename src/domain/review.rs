//! Review reasons that people and scripts match on, and when the provider's object calls for
//! one regardless of what the attempt says.

use super::provider_payment::{PaymentSnapshot, ProviderPaymentStatus};
use super::Currency;

/// The provider reports money moved for an attempt chargeguard answered `failed`: a declined
/// PaymentIntent stays `requires_payment_method`, and anyone holding the key (or the client
/// secret) can confirm it again later. The first word of the review reason, and the report's
/// name for such a row.
pub const SUCCEEDED_AFTER_FAILURE: &str = "succeeded_after_failure";

/// Whether the provider's object holds money: it succeeded, or received an amount.
pub fn shows_money_moved(snapshot: &PaymentSnapshot) -> bool {
    snapshot.status == ProviderPaymentStatus::Succeeded || snapshot.amount_received_minor > 0
}

/// The review reason for a failed attempt whose provider object `snapshot` shows money moved;
/// `None` when it shows none. The same object in the same state gives the same text, so a
/// second event reporting it adds nothing to the attempt.
pub fn succeeded_after_failure_reason(snapshot: &PaymentSnapshot) -> Option<String> {
    if !shows_money_moved(snapshot) {
        return None;
    }
    let received = match Currency::parse(&snapshot.currency) {
        Ok(currency) => format!(
            "{} {}",
            currency.format_major(snapshot.amount_received_minor),
            currency.code()
        ),
        Err(_) => format!(
            "{} (minor units) {}",
            snapshot.amount_received_minor, snapshot.currency
        ),
    };
    Some(format!(
        "{SUCCEEDED_AFTER_FAILURE}: provider object {} is {} and received {received}, but the \
         attempt was answered failed",
        snapshot.id,
        snapshot.status.as_str()
    ))
}

/// The first word of a review reason a dispute put on a charge attempt; reports name such a
/// charge `disputed` while the reason stands.
pub const DISPUTE: &str = "dispute";

/// A dispute on a charge, as a charge attempt's review reason names it: its id, reason, amount
/// and status. The same dispute in the same status gives the same text (a repeated event adds
/// nothing to the attempt); closing it adds a second reason, with `won` or `lost`.
pub fn dispute_reason(
    dispute_id: &str,
    charge: Option<&str>,
    reason: &str,
    amount_minor: i64,
    currency: &str,
    status: &str,
) -> String {
    let amount = match Currency::parse(currency) {
        Ok(known) => format!("{} {}", known.format_major(amount_minor), known.code()),
        Err(_) => format!("{amount_minor} (minor units) {currency}"),
    };
    format!(
        "{DISPUTE}: {dispute_id} on charge {} is {status}: reason {reason}, {amount}",
        charge.unwrap_or("unknown")
    )
}

/// The first words of the other review reasons, which the code that writes each one and
/// [`ReviewKind::of`] share.
pub const DOUBLE_CHARGE: &str = "double charge";
pub const DOUBLE_REFUND: &str = "double refund";
pub const SECOND_PROVIDER_OBJECT: &str = "second provider object";
pub const SECOND_PROVIDER_REFUND: &str = "second provider refund";
pub const KEY_CONFLICT: &str = "the provider reports an idempotency key conflict";
/// Said of a provider object or refund in a status chargeguard never puts it in.
pub const UNEXPECTED_STATUS: &str = "is in unexpected status";
/// Said of a provider object or refund for another amount or currency than the attempt's.
pub const OTHER_AMOUNT: &str = "the attempt asked for";

/// What a person is asked to look at, by kind: the `reason` label of
/// `chargeguard_attempts_flagged_total`, a bounded set however the reasons' texts vary, so that
/// an alert on flagged attempts can leave out the kinds that have alerts of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReviewKind {
    DoubleCharge,
    DoubleRefund,
    /// A second provider object or refund for one attempt, not (yet) one that moved money.
    SecondProviderObject,
    SucceededAfterFailure,
    Dispute,
    KeyConflict,
    UnexpectedStatus,
    OtherAmount,
    Other,
}

impl ReviewKind {
    pub const ALL: [Self; 9] = [
        Self::DoubleCharge,
        Self::DoubleRefund,
        Self::SecondProviderObject,
        Self::SucceededAfterFailure,
        Self::Dispute,
        Self::KeyConflict,
        Self::UnexpectedStatus,
        Self::OtherAmount,
        Self::Other,
    ];

    /// The kind of a review reason this codebase wrote, by its first words (or, for the two
    /// said of either a payment or a refund, the words in its middle). Pure.
    pub fn of(reason: &str) -> Self {
        let starts = |prefix: &str| reason.starts_with(prefix);
        if starts(DOUBLE_CHARGE) {
            Self::DoubleCharge
        } else if starts(DOUBLE_REFUND) {
            Self::DoubleRefund
        } else if starts(SECOND_PROVIDER_OBJECT) || starts(SECOND_PROVIDER_REFUND) {
            Self::SecondProviderObject
        } else if starts(SUCCEEDED_AFTER_FAILURE) {
            Self::SucceededAfterFailure
        } else if starts(DISPUTE) {
            Self::Dispute
        } else if starts(KEY_CONFLICT) {
            Self::KeyConflict
        } else if reason.contains(UNEXPECTED_STATUS) {
            Self::UnexpectedStatus
        } else if reason.contains(OTHER_AMOUNT) {
            Self::OtherAmount
        } else {
            Self::Other
        }
    }

    /// The metric label's value.
    pub fn label(self) -> &'static str {
        match self {
            Self::DoubleCharge => "double_charge",
            Self::DoubleRefund => "double_refund",
            Self::SecondProviderObject => "second_provider_object",
            Self::SucceededAfterFailure => "succeeded_after_failure",
            Self::Dispute => "dispute",
            Self::KeyConflict => "key_conflict",
            Self::UnexpectedStatus => "unexpected_status",
            Self::OtherAmount => "other_amount",
            Self::Other => "other",
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::{TimeZone, Utc};

    use super::*;

    fn snapshot(status: ProviderPaymentStatus, received: i64) -> PaymentSnapshot {
        let created = Utc.timestamp_opt(1_700_000_000, 0).unwrap();
        PaymentSnapshot {
            amount_received_minor: received,
            ..crate::domain::fixtures::snapshot("pi_1", status, created)
        }
    }

    #[test]
    fn money_moved_is_success_or_an_amount_received() {
        let paid = succeeded_after_failure_reason(&snapshot(ProviderPaymentStatus::Succeeded, 1_000))
            .unwrap();
        assert!(paid.starts_with("succeeded_after_failure: provider object pi_1"), "{paid}");
        assert!(paid.contains("10.00 usd"), "{paid}");
        assert!(shows_money_moved(&snapshot(ProviderPaymentStatus::RequiresCapture, 1)));
        for status in [
            ProviderPaymentStatus::RequiresPaymentMethod,
            ProviderPaymentStatus::Canceled,
            ProviderPaymentStatus::Processing,
        ] {
            assert_eq!(succeeded_after_failure_reason(&snapshot(status, 0)), None);
        }
    }

    /// Each producer's own text is classified by the kind its alert expects; a producer whose
    /// words changed would fall to `Other` and fail here.
    #[test]
    fn every_review_reason_written_here_has_its_kind() {
        use crate::domain::{ChargeParams, PaymentSnapshot, resolve_lookup, resolve_refund_snapshot, resolve_snapshot};

        let created = Utc.timestamp_opt(1_700_000_000, 0).unwrap();
        let paid = snapshot(ProviderPaymentStatus::Succeeded, 1_000);
        let kind = |reason: Option<String>| ReviewKind::of(&reason.expect("a review reason"));

        assert_eq!(kind(succeeded_after_failure_reason(&paid)), ReviewKind::SucceededAfterFailure);
        assert_eq!(
            kind(Some(dispute_reason("dp_1", Some("ch_1"), "fraudulent", 1_000, "usd", "needs_response"))),
            ReviewKind::Dispute
        );
        let second = PaymentSnapshot { id: "pi_2".into(), ..paid.clone() };
        let crate::domain::LookupResolution::Adopt { double_charge, .. } = resolve_lookup(vec![paid.clone(), second]) else {
            panic!("two objects found are adopted")
        };
        assert_eq!(kind(double_charge), ReviewKind::DoubleCharge);

        let requested: ChargeParams = crate::domain::fixtures::pending_attempt(created).params;
        let odd = PaymentSnapshot { amount_minor: requested.amount_minor, ..snapshot(ProviderPaymentStatus::RequiresCapture, 0) };
        assert_eq!(kind(resolve_snapshot(&odd, &requested).review_reason), ReviewKind::UnexpectedStatus);
        let other_amount = PaymentSnapshot { amount_minor: requested.amount_minor + 1, ..paid.clone() };
        assert_eq!(kind(resolve_snapshot(&other_amount, &requested).review_reason), ReviewKind::OtherAmount);

        let refund = |status: &str, amount_minor: i64| crate::domain::RefundSnapshot {
            id: "re_1".into(),
            status: status.into(),
            amount_minor,
            currency: requested.currency.code().into(),
            failure_reason: None,
            payment_id: Some("pi_1".into()),
            created,
            metadata: Default::default(),
        };
        assert_eq!(
            kind(resolve_refund_snapshot(&refund("reversed", requested.amount_minor), &requested).review_reason),
            ReviewKind::UnexpectedStatus
        );
        assert_eq!(
            kind(resolve_refund_snapshot(&refund("succeeded", requested.amount_minor + 1), &requested).review_reason),
            ReviewKind::OtherAmount
        );

        for (prefix, expected) in [
            (DOUBLE_REFUND, ReviewKind::DoubleRefund),
            (SECOND_PROVIDER_OBJECT, ReviewKind::SecondProviderObject),
            (SECOND_PROVIDER_REFUND, ReviewKind::SecondProviderObject),
            (KEY_CONFLICT, ReviewKind::KeyConflict),
        ] {
            assert_eq!(ReviewKind::of(&format!("{prefix}: details")), expected);
        }
        assert_eq!(ReviewKind::of("flagged by hand"), ReviewKind::Other);
    }

    #[test]
    fn each_kind_has_its_own_label() {
        let labels: std::collections::HashSet<_> = ReviewKind::ALL.iter().map(|kind| kind.label()).collect();
        assert_eq!(labels.len(), ReviewKind::ALL.len());
    }
}
