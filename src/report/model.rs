//! The rows a report is made of: one charge attempt created in the period with the provider
//! objects joined to it, or one provider object that no attempt claims. Pure data.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::{AttemptId, AttemptStatus, Currency};

use super::category::Category;

/// What chargeguard recorded for one charge attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptFacts {
    pub id: AttemptId,
    pub consumer: String,
    pub operation_key: String,
    pub status: AttemptStatus,
    pub amount_minor: i64,
    /// Lowercase ISO 4217 code.
    pub currency: String,
    pub provider_payment_id: Option<String>,
    pub failure_code: Option<String>,
    pub review_reason: Option<String>,
    pub created_at: DateTime<Utc>,
    /// Sum of the charge's refund attempts recorded `succeeded` (a refund the provider failed
    /// after success is `failed`, so not counted).
    pub ours_refunded_minor: i64,
    /// Where our refunds of the charge and the provider's disagree.
    pub refunds: RefundFacts,
}

/// Where a charge's refunds disagree between the two sides, as the database joined them. Lists
/// at most `report.objects_listed_per_row_max` of each; the totals count all.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RefundFacts {
    /// Provider refunds of the charge's payment that no refund attempt claims.
    pub orphans: Vec<ProviderRefund>,
    pub orphans_total: u32,
    /// Refund attempts recorded `succeeded` that the provider does not list, or lists not
    /// succeeded.
    pub mismatches: Vec<RefundMismatch>,
    pub mismatches_total: u32,
}

/// A provider refund as a report row names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderRefund {
    pub id: String,
    pub status: String,
    pub amount_minor: i64,
}

/// A refund we recorded `succeeded` and what the provider says of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefundMismatch {
    pub attempt_id: String,
    pub provider_refund_id: Option<String>,
    pub amount_minor: i64,
    /// `None`: the provider does not list the refund.
    pub provider_status: Option<String>,
}

/// How a provider object was tied to an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkedBy {
    /// Its `chargeguard_attempt_id` metadata names the attempt.
    Metadata,
    /// The attempt recorded the object's id (the metadata named no attempt we have).
    ProviderPaymentId,
    /// A later attempt of the operation confirmed the object again (issue 16): the object's
    /// metadata names the attempt that created it, its news is the latest confirming attempt's.
    ConfirmsPaymentId,
}

impl LinkedBy {
    pub fn as_str(self) -> &'static str {
        match self {
            LinkedBy::Metadata => "metadata",
            LinkedBy::ProviderPaymentId => "provider_payment_id",
            LinkedBy::ConfirmsPaymentId => "confirms_payment_id",
        }
    }
}

/// One provider payment object as the report saw it (also its staging JSON form).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderObject {
    pub id: String,
    /// The provider's status string ("succeeded", "canceled", ...).
    pub status: String,
    pub amount_minor: i64,
    pub amount_received_minor: i64,
    /// Lowercase ISO 4217 code.
    pub currency: String,
    pub created_at: DateTime<Utc>,
    /// Sum of the object's succeeded refunds seen by the run.
    pub refunded_minor: i64,
    pub linked_by: Option<LinkedBy>,
}

impl ProviderObject {
    /// Money the provider holds for this object before refunds.
    pub fn succeeded_minor(&self) -> i64 {
        if self.status == "succeeded" {
            self.amount_received_minor
        } else {
            0
        }
    }

    /// Whether the provider took money on it: succeeded, or an amount received.
    pub fn holds_money(&self) -> bool {
        self.status == "succeeded" || self.amount_received_minor > 0
    }
}

/// A row as read back from staging, before classification.
#[derive(Debug, Clone, PartialEq)]
pub struct JoinedRow {
    /// Output position, from 1.
    pub seq: i64,
    /// `None` for an orphan provider object.
    pub attempt: Option<AttemptFacts>,
    /// Oldest first; at most `report.objects_listed_per_row_max` of them.
    pub objects: Vec<ProviderObject>,
    /// Every object joined to the row, listed or not.
    pub objects_total: u32,
    /// The attempt's operation across its attempts (issue 16); zero for orphans.
    pub operation: OperationFacts,
}

/// What the other attempts of a succeeded attempt's operation hold: attempts of one operation
/// are one business operation, charged at most once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OperationFacts {
    /// Succeeded charge attempts of the operation, this one included.
    pub succeeded_attempts: u32,
    /// Provider objects the run saw for earlier attempts of the operation that are not
    /// canceled (and so hold money or may still be paid), other than this attempt's own.
    pub earlier_live_objects: u32,
}

/// A classified row: what every output format writes.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportRow {
    pub seq: i64,
    pub category: Category,
    /// One sentence a person reads: what disagrees, in major units.
    pub detail: String,
    pub attempt: Option<AttemptFacts>,
    pub objects: Vec<ProviderObject>,
    pub objects_total: u32,
}

impl ReportRow {
    /// The provider's currency for the row: `None` with no object, `Some("mixed")` when its
    /// objects disagree.
    pub fn provider_currency(&self) -> Option<&str> {
        let first = self.objects.first()?;
        if self
            .objects
            .iter()
            .all(|object| object.currency == first.currency)
        {
            Some(first.currency.as_str())
        } else {
            Some("mixed")
        }
    }

    pub fn provider_amount_minor(&self) -> i64 {
        self.objects.iter().map(|object| object.amount_minor).sum()
    }

    pub fn provider_refunded_minor(&self) -> i64 {
        self.objects
            .iter()
            .map(|object| object.refunded_minor)
            .sum()
    }
}

/// `amount_minor` in major units when the currency is one we know ("10.50"), else empty.
pub fn major_units(currency: &str, amount_minor: i64) -> String {
    Currency::parse(currency)
        .map(|currency| currency.format_major(amount_minor))
        .unwrap_or_default()
}

/// "10.50 usd", or "1050 (minor units) xyz" for a currency we do not know.
pub fn money(currency: &str, amount_minor: i64) -> String {
    match Currency::parse(currency) {
        Ok(known) => format!("{} {}", known.format_major(amount_minor), known.code()),
        Err(_) => format!("{amount_minor} (minor units) {currency}"),
    }
}
