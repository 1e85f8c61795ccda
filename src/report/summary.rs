//! The summary every report starts with: counts per category, totals per currency (ours and
//! the provider's, succeeded and refunded), the period, when and from which data. Accumulated
//! row by row, so it costs one small map however many rows there are.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use crate::domain::AttemptStatus;

use super::category::Category;
use super::model::{ReportRow, money};
use super::period::ReportPeriod;

/// Where the figures came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataSources {
    /// "stripe".
    pub provider: String,
    pub provider_payments_listed: u64,
    pub provider_refunds_listed: u64,
    pub provider_list_calls: u64,
    /// The provider's payments were listed over `[from, to]` (the period widened by the
    /// look-behind and look-ahead) ...
    pub payments_listed_from: DateTime<Utc>,
    pub payments_listed_to: DateTime<Utc>,
    /// ... and its refunds over this range, up to when the report ran.
    pub refunds_listed_from: DateTime<Utc>,
    pub refunds_listed_to: DateTime<Utc>,
    pub chargeguard_version: &'static str,
}

/// Per currency, in minor units.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CurrencyTotals {
    /// Our succeeded charge attempts.
    pub ours_succeeded_minor: i64,
    /// Our refund attempts of those charges recorded `succeeded` (a refund the provider failed
    /// after success is `failed`: not counted).
    pub ours_refunded_minor: i64,
    /// What the provider received on succeeded objects of the report's rows.
    pub provider_succeeded_minor: i64,
    /// Succeeded refunds of those objects.
    pub provider_refunded_minor: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub period: ReportPeriod,
    pub generated_at: DateTime<Utc>,
    pub sources: DataSources,
    pub pending_age_max_minutes: i64,
    pub requires_action_age_max_minutes: i64,
    pub rows: u64,
    pub discrepancies: u64,
    /// Every category, in `Category::ALL` order, zeros included.
    pub categories: Vec<(Category, u64)>,
    /// By currency code.
    pub currencies: BTreeMap<String, CurrencyTotals>,
}

impl Summary {
    pub fn is_clean(&self) -> bool {
        self.discrepancies == 0
    }

    pub fn count(&self, category: Category) -> u64 {
        self.categories
            .iter()
            .find(|(c, _)| *c == category)
            .map_or(0, |(_, count)| *count)
    }

    /// A few lines for a terminal or a cron mail.
    pub fn to_text(&self) -> String {
        let mut text = format!(
            "chargeguard reconciliation {} .. {} (generated {})\n{} rows, {} discrepancies: {}\n",
            self.period.from().to_rfc3339(),
            self.period.to().to_rfc3339(),
            self.generated_at.to_rfc3339(),
            self.rows,
            self.discrepancies,
            if self.is_clean() {
                "clean"
            } else {
                "NOT CLEAN"
            },
        );
        for (category, count) in &self.categories {
            if *count > 0 {
                text.push_str(&format!("  {:<20} {count}\n", category.as_str()));
            }
        }
        for (currency, totals) in &self.currencies {
            text.push_str(&format!(
                "  {currency}: ours succeeded {}, provider succeeded {}, ours refunded {}, provider refunded {}\n",
                money(currency, totals.ours_succeeded_minor),
                money(currency, totals.provider_succeeded_minor),
                money(currency, totals.ours_refunded_minor),
                money(currency, totals.provider_refunded_minor),
            ));
        }
        text
    }
}

/// Accumulates a summary over the rows of one pass.
#[derive(Debug, Default)]
pub struct SummaryBuilder {
    counts: BTreeMap<Category, u64>,
    currencies: BTreeMap<String, CurrencyTotals>,
}

impl SummaryBuilder {
    pub fn add(&mut self, row: &ReportRow) {
        *self.counts.entry(row.category).or_default() += 1;
        if let Some(attempt) = &row.attempt {
            let totals = self.currencies.entry(attempt.currency.clone()).or_default();
            if attempt.status == AttemptStatus::Succeeded {
                totals.ours_succeeded_minor += attempt.amount_minor;
            }
            totals.ours_refunded_minor += attempt.ours_refunded_minor;
        }
        for object in &row.objects {
            let totals = self.currencies.entry(object.currency.clone()).or_default();
            totals.provider_succeeded_minor += object.succeeded_minor();
            totals.provider_refunded_minor += object.refunded_minor;
        }
    }

    pub fn finish(
        self,
        period: ReportPeriod,
        generated_at: DateTime<Utc>,
        sources: DataSources,
        thresholds: &super::category::Thresholds,
    ) -> Summary {
        let categories: Vec<(Category, u64)> = Category::ALL
            .into_iter()
            .map(|category| (category, self.counts.get(&category).copied().unwrap_or(0)))
            .collect();
        let rows = categories.iter().map(|(_, count)| count).sum();
        let discrepancies = categories
            .iter()
            .filter(|(category, _)| category.is_discrepancy())
            .map(|(_, count)| count)
            .sum();
        Summary {
            period,
            generated_at,
            sources,
            pending_age_max_minutes: thresholds.pending_age_max.num_minutes(),
            requires_action_age_max_minutes: thresholds.requires_action_age_max.num_minutes(),
            rows,
            discrepancies,
            categories,
            currencies: self.currencies,
        }
    }
}
