use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

/// The provider's refund object as reports and refund reconciliation need it, whatever the
/// provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundSnapshot {
    pub id: String,
    /// The payment the refund returns money from, when the provider names one.
    pub payment_id: Option<String>,
    /// The provider's own status string ("succeeded", "pending", "failed", ...); see
    /// [`RefundSnapshot::refund_status`] for its meaning.
    pub status: String,
    pub amount_minor: i64,
    /// Lowercase ISO 4217 code.
    pub currency: String,
    pub created: DateTime<Utc>,
    /// Everything the provider holds, chargeguard's own keys (`chargeguard_attempt_id`, ...)
    /// included: how a refund is found again without its key.
    pub metadata: BTreeMap<String, String>,
    /// Why a failed refund failed (`expired_or_canceled_card`, `lost_or_stolen_card`, ...).
    pub failure_reason: Option<String>,
}

impl RefundSnapshot {
    /// Only a succeeded refund has returned money; pending ones may still fail.
    pub fn has_returned_money(&self) -> bool {
        self.refund_status() == RefundStatus::Succeeded
    }

    pub fn refund_status(&self) -> RefundStatus {
        RefundStatus::parse(&self.status)
    }
}

/// Stripe's refund lifecycle: `pending` (or `requires_action`) → `succeeded` | `failed` |
/// `canceled`, and a `succeeded` refund may still turn `failed` later (the money came back to
/// the merchant).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefundStatus {
    Pending,
    RequiresAction,
    Succeeded,
    Failed,
    Canceled,
    /// A status the provider added later: kept by name, never guessed.
    Other(String),
}

impl RefundStatus {
    pub fn parse(name: &str) -> Self {
        match name {
            "pending" => Self::Pending,
            "requires_action" => Self::RequiresAction,
            "succeeded" => Self::Succeeded,
            "failed" => Self::Failed,
            "canceled" => Self::Canceled,
            other => Self::Other(other.to_owned()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            Self::Pending => "pending",
            Self::RequiresAction => "requires_action",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Canceled => "canceled",
            Self::Other(name) => name,
        }
    }

    /// Failed or canceled: the refund returned nothing and never will (the refunded amount is
    /// refundable again). `succeeded` is not terminal in this sense: it may still fail.
    pub fn returned_nothing(&self) -> bool {
        matches!(self, Self::Failed | Self::Canceled)
    }

    /// Pending or awaiting action: the amount is held against the charge, the outcome open.
    pub fn is_in_flight(&self) -> bool {
        matches!(self, Self::Pending | Self::RequiresAction)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_stripe_refund_status_parses_and_prints_back() {
        for name in ["pending", "requires_action", "succeeded", "failed", "canceled"] {
            let status = RefundStatus::parse(name);
            assert!(!matches!(status, RefundStatus::Other(_)), "{name}");
            assert_eq!(status.as_str(), name);
        }
        assert_eq!(RefundStatus::parse("reversed"), RefundStatus::Other("reversed".to_owned()));
        assert_eq!(RefundStatus::parse("reversed").as_str(), "reversed");
    }

    #[test]
    fn only_failed_and_canceled_returned_nothing_and_only_pending_ones_are_in_flight() {
        let returned_nothing: Vec<&str> = ["pending", "requires_action", "succeeded", "failed", "canceled", "x"]
            .into_iter()
            .filter(|name| RefundStatus::parse(name).returned_nothing())
            .collect();
        assert_eq!(returned_nothing, ["failed", "canceled"]);
        let in_flight: Vec<&str> = ["pending", "requires_action", "succeeded", "failed", "canceled", "x"]
            .into_iter()
            .filter(|name| RefundStatus::parse(name).is_in_flight())
            .collect();
        assert_eq!(in_flight, ["pending", "requires_action"]);
    }

    #[test]
    fn only_a_succeeded_refund_has_returned_money() {
        let snapshot = |status: &str| RefundSnapshot {
            id: "re_1".to_owned(),
            payment_id: Some("pi_1".to_owned()),
            status: status.to_owned(),
            amount_minor: 100,
            currency: "usd".to_owned(),
            created: DateTime::<Utc>::MIN_UTC,
            metadata: BTreeMap::new(),
            failure_reason: None,
        };
        assert!(snapshot("succeeded").has_returned_money());
        for status in ["pending", "failed", "canceled", "requires_action"] {
            assert!(!snapshot(status).has_returned_money(), "{status}");
        }
    }
}
