use chrono::{DateTime, Utc};

/// The provider's refund object as reports need it, whatever the provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundSnapshot {
    pub id: String,
    /// The payment the refund returns money from, when the provider names one.
    pub payment_id: Option<String>,
    /// The provider's own status string ("succeeded", "pending", "failed", ...).
    pub status: String,
    pub amount_minor: i64,
    /// Lowercase ISO 4217 code.
    pub currency: String,
    pub created: DateTime<Utc>,
}

impl RefundSnapshot {
    /// Only a succeeded refund has returned money; pending ones may still fail.
    pub fn has_returned_money(&self) -> bool {
        self.status == "succeeded"
    }
}
