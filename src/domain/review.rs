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
}
