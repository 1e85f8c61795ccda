//! JSON for machines: `{"summary": {...}, "rows": [...]}`, written row by row (one per line).
//! Amounts in minor units, with major units beside them as strings.

use std::io::{self, Write};

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::report::{RefundFacts, ReportRow, Summary, major_units};

#[derive(Serialize)]
struct SummaryJson<'a> {
    period_from: DateTime<Utc>,
    /// Excluded.
    period_to: DateTime<Utc>,
    generated_at: DateTime<Utc>,
    clean: bool,
    rows: u64,
    discrepancies: u64,
    pending_age_max_minutes: i64,
    requires_action_age_max_minutes: i64,
    sources: SourcesJson<'a>,
    categories: Vec<CategoryJson>,
    currencies: Vec<CurrencyJson<'a>>,
}

#[derive(Serialize)]
struct SourcesJson<'a> {
    database: &'static str,
    provider: &'a str,
    provider_payments_listed: u64,
    provider_refunds_listed: u64,
    provider_list_calls: u64,
    payments_listed_from: DateTime<Utc>,
    payments_listed_to: DateTime<Utc>,
    refunds_listed_from: DateTime<Utc>,
    refunds_listed_to: DateTime<Utc>,
    chargeguard_version: &'static str,
}

#[derive(Serialize)]
struct CategoryJson {
    category: &'static str,
    label: &'static str,
    discrepancy: bool,
    rows: u64,
}

#[derive(Serialize)]
struct CurrencyJson<'a> {
    currency: &'a str,
    ours_succeeded_minor: i64,
    ours_succeeded: String,
    ours_refunded_minor: i64,
    ours_refunded: String,
    provider_succeeded_minor: i64,
    provider_succeeded: String,
    provider_refunded_minor: i64,
    provider_refunded: String,
}

#[derive(Serialize)]
struct RowJson<'a> {
    seq: i64,
    category: &'static str,
    discrepancy: bool,
    detail: &'a str,
    attempt: Option<AttemptJson<'a>>,
    provider_objects_total: u32,
    provider_objects: Vec<ObjectJson<'a>>,
}

#[derive(Serialize)]
struct AttemptJson<'a> {
    attempt_id: String,
    consumer: &'a str,
    operation_key: &'a str,
    status: &'static str,
    currency: &'a str,
    amount_minor: i64,
    amount: String,
    provider_payment_id: Option<&'a str>,
    failure_code: Option<&'a str>,
    review_reason: Option<&'a str>,
    created_at: DateTime<Utc>,
    /// Its refund attempts recorded succeeded.
    refunded_minor: i64,
    refunded: String,
    /// Where its refunds disagree with the provider's (lists bounded, totals complete).
    refunds: &'a RefundFacts,
}

#[derive(Serialize)]
struct ObjectJson<'a> {
    id: &'a str,
    status: &'a str,
    currency: &'a str,
    amount_minor: i64,
    amount: String,
    amount_received_minor: i64,
    refunded_minor: i64,
    created_at: DateTime<Utc>,
    linked_by: Option<&'static str>,
}

pub fn write_start(out: &mut dyn Write, summary: &Summary) -> io::Result<()> {
    let sources = &summary.sources;
    let view = SummaryJson {
        period_from: summary.period.from(),
        period_to: summary.period.to(),
        generated_at: summary.generated_at,
        clean: summary.is_clean(),
        rows: summary.rows,
        discrepancies: summary.discrepancies,
        pending_age_max_minutes: summary.pending_age_max_minutes,
        requires_action_age_max_minutes: summary.requires_action_age_max_minutes,
        sources: SourcesJson {
            database: "payment_attempts (PostgreSQL)",
            provider: &sources.provider,
            provider_payments_listed: sources.provider_payments_listed,
            provider_refunds_listed: sources.provider_refunds_listed,
            provider_list_calls: sources.provider_list_calls,
            payments_listed_from: sources.payments_listed_from,
            payments_listed_to: sources.payments_listed_to,
            refunds_listed_from: sources.refunds_listed_from,
            refunds_listed_to: sources.refunds_listed_to,
            chargeguard_version: sources.chargeguard_version,
        },
        categories: summary
            .categories
            .iter()
            .map(|(category, rows)| CategoryJson {
                category: category.as_str(),
                label: category.label(),
                discrepancy: category.is_discrepancy(),
                rows: *rows,
            })
            .collect(),
        currencies: summary
            .currencies
            .iter()
            .map(|(currency, totals)| CurrencyJson {
                currency,
                ours_succeeded_minor: totals.ours_succeeded_minor,
                ours_succeeded: major_units(currency, totals.ours_succeeded_minor),
                ours_refunded_minor: totals.ours_refunded_minor,
                ours_refunded: major_units(currency, totals.ours_refunded_minor),
                provider_succeeded_minor: totals.provider_succeeded_minor,
                provider_succeeded: major_units(currency, totals.provider_succeeded_minor),
                provider_refunded_minor: totals.provider_refunded_minor,
                provider_refunded: major_units(currency, totals.provider_refunded_minor),
            })
            .collect(),
    };
    out.write_all(b"{\"summary\":")?;
    serde_json::to_writer(&mut *out, &view)?;
    out.write_all(b",\n\"rows\":[")
}

pub fn write_row(out: &mut dyn Write, row: &ReportRow, first: bool) -> io::Result<()> {
    let view = RowJson {
        seq: row.seq,
        category: row.category.as_str(),
        discrepancy: row.category.is_discrepancy(),
        detail: &row.detail,
        attempt: row.attempt.as_ref().map(|attempt| AttemptJson {
            attempt_id: attempt.id.to_string(),
            consumer: &attempt.consumer,
            operation_key: &attempt.operation_key,
            status: attempt.status.as_str(),
            currency: &attempt.currency,
            amount_minor: attempt.amount_minor,
            amount: major_units(&attempt.currency, attempt.amount_minor),
            provider_payment_id: attempt.provider_payment_id.as_deref(),
            failure_code: attempt.failure_code.as_deref(),
            review_reason: attempt.review_reason.as_deref(),
            created_at: attempt.created_at,
            refunded_minor: attempt.ours_refunded_minor,
            refunded: major_units(&attempt.currency, attempt.ours_refunded_minor),
            refunds: &attempt.refunds,
        }),
        provider_objects_total: row.objects_total,
        provider_objects: row
            .objects
            .iter()
            .map(|object| ObjectJson {
                id: &object.id,
                status: &object.status,
                currency: &object.currency,
                amount_minor: object.amount_minor,
                amount: major_units(&object.currency, object.amount_minor),
                amount_received_minor: object.amount_received_minor,
                refunded_minor: object.refunded_minor,
                created_at: object.created_at,
                linked_by: object.linked_by.map(|linked| linked.as_str()),
            })
            .collect(),
    };
    out.write_all(if first { b"\n" } else { b",\n" })?;
    serde_json::to_writer(&mut *out, &view)?;
    Ok(())
}

pub fn write_end(out: &mut dyn Write) -> io::Result<()> {
    out.write_all(b"\n]}\n")
}
