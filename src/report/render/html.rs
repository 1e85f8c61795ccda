//! One self-contained HTML page for people: the summary first, then the discrepancies, then
//! every row (folded). Inline CSS only: no scripts, links, fonts or images, so the page reads
//! the same offline, in a mail, or archived. Every value is escaped.

use std::io::{self, Write};

use crate::report::{ReportRow, Summary, major_units, money};

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:2em;color:#111}\
table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #bbb;padding:.3em .6em;text-align:left;vertical-align:top}\
th{background:#eee}td.num{text-align:right;font-variant-numeric:tabular-nums}\
.verdict{font-size:1.3em;font-weight:bold;padding:.5em 1em;display:inline-block}\
.clean{background:#dfd;color:#050}.unclean{background:#fdd;color:#800}\
tr.discrepancy{background:#fee}tr.double_charge{background:#fbb;font-weight:bold}\
td.zero{color:#999}details{margin-top:2em}summary{cursor:pointer;font-size:1.2em}";

const ROW_HEADER: [&str; 12] = [
    "#",
    "category",
    "detail",
    "attempt",
    "operation",
    "ours",
    "our status",
    "provider objects",
    "provider status",
    "provider",
    "refunded",
    "ours refunded",
];

pub fn write_start(out: &mut dyn Write, summary: &Summary) -> io::Result<()> {
    let period = format!(
        "{} to {}",
        summary.period.from().to_rfc3339(),
        summary.period.to().to_rfc3339()
    );
    write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>chargeguard reconciliation {}</title><style>{STYLE}</style></head><body>\n",
        escape(&period)
    )?;
    write!(
        out,
        "<h1>Reconciliation report</h1>\n<p>Period {} (end excluded). Generated {}.</p>\n",
        escape(&period),
        escape(&summary.generated_at.to_rfc3339())
    )?;
    let (class, verdict) = if summary.is_clean() {
        ("clean", "Clean: no discrepancies".to_owned())
    } else {
        (
            "unclean",
            format!(
                "{} discrepancies in {} rows",
                summary.discrepancies, summary.rows
            ),
        )
    };
    write!(
        out,
        "<p class=\"verdict {class}\">{}</p>\n<h2>Summary</h2>\n",
        escape(&verdict)
    )?;
    out.write_all(b"<table><tr><th>category</th><th>meaning</th><th>rows</th></tr>\n")?;
    for (category, count) in &summary.categories {
        let class = match (category.is_discrepancy(), *count) {
            (_, 0) => "zero",
            (true, _) => "discrepancy",
            (false, _) => "",
        };
        writeln!(
            out,
            "<tr class=\"{class}\"><td>{}</td><td>{}</td><td class=\"num {class}\">{count}</td></tr>",
            category.as_str(),
            escape(category.label())
        )?;
    }
    out.write_all(b"</table>\n<table><tr><th>currency</th><th>ours succeeded</th><th>provider succeeded</th><th>ours refunded</th><th>provider refunded</th></tr>\n")?;
    for (currency, totals) in &summary.currencies {
        let cell = |amount: i64| {
            format!(
                "<td class=\"num\">{}</td>",
                escape(&major_units(currency, amount))
            )
        };
        writeln!(
            out,
            "<tr><td>{}</td>{}{}{}{}</tr>",
            escape(currency),
            cell(totals.ours_succeeded_minor),
            cell(totals.provider_succeeded_minor),
            cell(totals.ours_refunded_minor),
            cell(totals.provider_refunded_minor)
        )?;
    }
    out.write_all(b"</table>\n")?;
    let sources = &summary.sources;
    writeln!(
        out,
        "<p>Data: chargeguard's payment_attempts (PostgreSQL); the {} list API: {} payments created {} to {}, \
         {} refunds created {} to {}, in {} calls. Pending counts as stale after {} minutes, requires_action \
         after {} minutes. chargeguard {}.</p>",
        escape(&sources.provider),
        sources.provider_payments_listed,
        escape(&sources.payments_listed_from.to_rfc3339()),
        escape(&sources.payments_listed_to.to_rfc3339()),
        sources.provider_refunds_listed,
        escape(&sources.refunds_listed_from.to_rfc3339()),
        escape(&sources.refunds_listed_to.to_rfc3339()),
        sources.provider_list_calls,
        summary.pending_age_max_minutes,
        summary.requires_action_age_max_minutes,
        escape(sources.chargeguard_version)
    )
}

pub fn write_table_start(out: &mut dyn Write, id: &str, title: &str, count: u64) -> io::Result<()> {
    write!(
        out,
        "<h2 id=\"{}\">{} ({count})</h2>\n<table>",
        escape(id),
        escape(title)
    )?;
    write_row_header(out)
}

pub fn write_table_end(out: &mut dyn Write) -> io::Result<()> {
    out.write_all(b"</table>\n")
}

pub fn write_all_rows_start(out: &mut dyn Write, count: u64) -> io::Result<()> {
    write!(
        out,
        "<details><summary>All rows ({count})</summary>\n<table>"
    )?;
    write_row_header(out)
}

pub(crate) fn write_row_header(out: &mut dyn Write) -> io::Result<()> {
    out.write_all(b"<tr>")?;
    for title in ROW_HEADER {
        write!(out, "<th>{title}</th>")?;
    }
    out.write_all(b"</tr>\n")
}

pub fn write_row(out: &mut dyn Write, row: &ReportRow) -> io::Result<()> {
    let class = if row.category.is_discrepancy() {
        format!("discrepancy {}", row.category.as_str())
    } else {
        String::new()
    };
    let attempt = row.attempt.as_ref();
    let ids: Vec<&str> = row
        .objects
        .iter()
        .map(|object| object.id.as_str())
        .collect();
    let statuses: Vec<&str> = row
        .objects
        .iter()
        .map(|object| object.status.as_str())
        .collect();
    let provider_amount = match row.provider_currency() {
        Some(currency) => money(currency, row.provider_amount_minor()),
        None => String::new(),
    };
    let refunded = match row.provider_currency() {
        Some(currency) if row.provider_refunded_minor() > 0 => {
            money(currency, row.provider_refunded_minor())
        }
        _ => String::new(),
    };
    let cells = [
        row.seq.to_string(),
        row.category.as_str().to_owned(),
        row.detail.clone(),
        attempt
            .map(|a| format!("{} ({})", a.id, a.consumer))
            .unwrap_or_default(),
        attempt.map(|a| a.operation_key.clone()).unwrap_or_default(),
        attempt
            .map(|a| money(&a.currency, a.amount_minor))
            .unwrap_or_default(),
        attempt
            .map(|a| a.status.as_str().to_owned())
            .unwrap_or_default(),
        format!("{}: {}", row.objects_total, ids.join(" ")),
        statuses.join(" "),
        provider_amount,
        refunded,
        attempt
            .filter(|a| a.ours_refunded_minor > 0)
            .map(|a| money(&a.currency, a.ours_refunded_minor))
            .unwrap_or_default(),
    ];
    write!(out, "<tr class=\"{}\">", escape(&class))?;
    for cell in cells {
        write!(out, "<td>{}</td>", escape(&cell))?;
    }
    out.write_all(b"</tr>\n")
}

pub fn write_end(out: &mut dyn Write) -> io::Result<()> {
    out.write_all(b"</table></details>\n</body></html>\n")
}

/// Text and attribute values: the five characters that can change HTML's meaning.
pub(crate) fn escape(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    for character in value.chars() {
        match character {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&#39;"),
            other => escaped.push(other),
        }
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup() {
        assert_eq!(
            escape("<script>alert('x') & \"y\"</script>"),
            "&lt;script&gt;alert(&#39;x&#39;) &amp; &quot;y&quot;&lt;/script&gt;"
        );
    }
}
