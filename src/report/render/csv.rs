//! CSV per RFC 4180: a header row, CRLF line ends, fields quoted when they hold a comma, a
//! quote or a line break. Amounts in minor units and in major units (by the currency's
//! exponent). Rows only: one table, so spreadsheets and CSV readers take it as it is.

use std::io::{self, Write};

use crate::report::{ReportRow, major_units};

pub const HEADER: [&str; 26] = [
    "seq",
    "category",
    "discrepancy",
    "detail",
    "attempt_id",
    "consumer",
    "operation_key",
    "our_status",
    "our_currency",
    "our_amount_minor",
    "our_amount",
    "attempt_created_at",
    "provider_objects",
    "provider_payment_ids",
    "provider_statuses",
    "provider_currency",
    "provider_amount_minor",
    "provider_amount",
    "provider_refunded_minor",
    "provider_refunded",
    "provider_created_at",
    "review_reason",
    "our_refunded_minor",
    "our_refunded",
    "orphan_refund_ids",
    "mismatched_refund_attempt_ids",
];

pub fn write_header(out: &mut dyn Write) -> io::Result<()> {
    write_record(out, HEADER.iter().map(|field| field.to_string()))
}

pub fn write_row(out: &mut dyn Write, row: &ReportRow) -> io::Result<()> {
    let attempt = row.attempt.as_ref();
    let text = |value: Option<&str>| value.unwrap_or_default().to_owned();
    let provider_currency = row.provider_currency().map(str::to_owned);
    // Major units only where the row's provider objects share one currency.
    let provider_major = |amount: i64| match provider_currency.as_deref() {
        Some(currency) => major_units(currency, amount),
        None => String::new(),
    };
    let has_objects = !row.objects.is_empty();
    let fields = [
        row.seq.to_string(),
        row.category.as_str().to_owned(),
        row.category.is_discrepancy().to_string(),
        row.detail.clone(),
        attempt.map(|a| a.id.to_string()).unwrap_or_default(),
        text(attempt.map(|a| a.consumer.as_str())),
        text(attempt.map(|a| a.operation_key.as_str())),
        text(attempt.map(|a| a.status.as_str())),
        text(attempt.map(|a| a.currency.as_str())),
        attempt
            .map(|a| a.amount_minor.to_string())
            .unwrap_or_default(),
        attempt
            .map(|a| major_units(&a.currency, a.amount_minor))
            .unwrap_or_default(),
        attempt
            .map(|a| a.created_at.to_rfc3339())
            .unwrap_or_default(),
        row.objects_total.to_string(),
        row.objects
            .iter()
            .map(|o| o.id.as_str())
            .collect::<Vec<_>>()
            .join(" "),
        row.objects
            .iter()
            .map(|o| o.status.as_str())
            .collect::<Vec<_>>()
            .join(" "),
        provider_currency.clone().unwrap_or_default(),
        if has_objects {
            row.provider_amount_minor().to_string()
        } else {
            String::new()
        },
        if has_objects {
            provider_major(row.provider_amount_minor())
        } else {
            String::new()
        },
        if has_objects {
            row.provider_refunded_minor().to_string()
        } else {
            String::new()
        },
        if has_objects {
            provider_major(row.provider_refunded_minor())
        } else {
            String::new()
        },
        row.objects
            .first()
            .map(|o| o.created_at.to_rfc3339())
            .unwrap_or_default(),
        text(attempt.and_then(|a| a.review_reason.as_deref())),
        attempt
            .map(|a| a.ours_refunded_minor.to_string())
            .unwrap_or_default(),
        attempt
            .map(|a| major_units(&a.currency, a.ours_refunded_minor))
            .unwrap_or_default(),
        attempt
            .map(|a| {
                let ids: Vec<&str> = a.refunds.orphans.iter().map(|r| r.id.as_str()).collect();
                ids.join(" ")
            })
            .unwrap_or_default(),
        attempt
            .map(|a| {
                let ids: Vec<&str> =
                    a.refunds.mismatches.iter().map(|r| r.attempt_id.as_str()).collect();
                ids.join(" ")
            })
            .unwrap_or_default(),
    ];
    write_record(out, fields.into_iter())
}

fn write_record(out: &mut dyn Write, fields: impl Iterator<Item = String>) -> io::Result<()> {
    for (index, field) in fields.enumerate() {
        if index > 0 {
            out.write_all(b",")?;
        }
        out.write_all(quote(&field).as_bytes())?;
    }
    out.write_all(b"\r\n")
}

fn quote(field: &str) -> std::borrow::Cow<'_, str> {
    if field.contains([',', '"', '\r', '\n']) {
        format!("\"{}\"", field.replace('"', "\"\"")).into()
    } else {
        field.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_only_fields_that_need_it() {
        assert_eq!(quote("plain"), "plain");
        assert_eq!(quote("a,b"), "\"a,b\"");
        assert_eq!(quote("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(quote("two\nlines"), "\"two\nlines\"");
    }
}
