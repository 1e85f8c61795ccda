//! The finance page's HTML: period picker, summary, chart, discrepancies, every row. One pass
//! over the report's rows; the tables hold at most [`TABLE_ROWS_MAX`] rows each (the downloads
//! hold them all), the chart one count per day of the period. No scripts: the search is the
//! `q` parameter of the same GET form. Every value goes through `escape`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use chrono::{DateTime, NaiveDate, Utc};

use crate::report::render::html::{escape, write_row, write_row_header};
use crate::report::{PreparedReport, ReportError, ReportRow, major_units};

/// Rows shown in each table; past it the page says so and points at the downloads.
pub const TABLE_ROWS_MAX: usize = 2_000;

/// The page's only style sheet; its digest is in the Content-Security-Policy (`mod.rs`).
pub const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:1.5em 2em;color:#111}\
header{display:flex;justify-content:space-between;align-items:baseline}\
form{background:#f4f4f4;padding:.6em 1em;display:flex;gap:1em;align-items:end;flex-wrap:wrap}\
label{display:flex;flex-direction:column;font-size:.9em}input{font-size:1em;padding:.2em}\
table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #bbb;padding:.3em .6em;text-align:left;vertical-align:top}\
th{background:#eee}td.num{text-align:right;font-variant-numeric:tabular-nums}\
.verdict{font-size:1.3em;font-weight:bold;padding:.4em 1em;display:inline-block}\
.clean{background:#dfd;color:#050}.unclean{background:#fdd;color:#800}\
tr.discrepancy{background:#fee}tr.double_charge{background:#fbb;font-weight:bold}\
.downloads a{margin-right:1em}.note{color:#555}svg{max-width:100%;height:auto;border:1px solid #ddd}";

/// What the page shows: whole UTC days, both included, and the search text.
pub struct PageQuery {
    pub from: NaiveDate,
    pub to: NaiveDate,
    pub search: String,
}

impl PageQuery {
    fn period_query(&self) -> String {
        serde_urlencoded::to_string([("from", self.from.to_string()), ("to", self.to.to_string())]).unwrap_or_default()
    }

    /// Case-insensitive: whether a row mentions the search text anywhere a person reads.
    fn matches(&self, row: &ReportRow) -> bool {
        if self.search.is_empty() {
            return true;
        }
        let needle = self.search.to_lowercase();
        let mut haystack = format!("{} {}", row.category.as_str(), row.detail);
        if let Some(attempt) = &row.attempt {
            let _ = write!(
                haystack,
                " {} {} {} {} {} {} {}",
                attempt.id,
                attempt.consumer,
                attempt.operation_key,
                attempt.status.as_str(),
                attempt.currency,
                major_units(&attempt.currency, attempt.amount_minor),
                attempt.provider_payment_id.as_deref().unwrap_or_default()
            );
        }
        for object in &row.objects {
            let _ = write!(haystack, " {} {} {}", object.id, object.status, major_units(&object.currency, object.amount_minor));
        }
        haystack.to_lowercase().contains(&needle)
    }
}

/// Rows and discrepancies of one day, for the chart.
#[derive(Default, Clone, Copy)]
struct DayCounts {
    rows: u64,
    discrepancies: u64,
}

/// The whole page for a prepared report.
pub async fn render(report: &PreparedReport, query: &PageQuery, operator: &str) -> Result<String, ReportError> {
    let mut discrepancies = Table::default();
    let mut all_rows = Table::default();
    let mut days: BTreeMap<NaiveDate, DayCounts> = query.from.iter_days().take_while(|day| *day <= query.to).map(|day| (day, DayCounts::default())).collect();
    let mut pages = report.rows();
    while let Some(page) = pages.next_page().await? {
        for row in &page {
            if let Some(counts) = row_day(row).and_then(|day| days.get_mut(&day)) {
                counts.rows += 1;
                counts.discrepancies += u64::from(row.category.is_discrepancy());
            }
            if !query.matches(row) {
                continue;
            }
            if row.category.is_discrepancy() {
                discrepancies.add(row);
            }
            all_rows.add(row);
        }
    }
    let summary = report.summary();
    let mut page = String::with_capacity(16 * 1024 + discrepancies.html.len() + all_rows.html.len());
    let period = format!("{} to {}", query.from, query.to);
    let _ = writeln!(
        page,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\">\
         <title>chargeguard finance {}</title><style>{STYLE}</style></head><body>\n\
         <header><h1>Reconciliation</h1><p>Signed in as <strong id=\"operator\">{}</strong></p></header>",
        escape(&period),
        escape(operator)
    );
    let _ = writeln!(
        page,
        "<form id=\"period\" method=\"get\" action=\"/finance\">\
         <label>From (UTC day)<input type=\"date\" name=\"from\" value=\"{}\" required></label>\
         <label>To (included)<input type=\"date\" name=\"to\" value=\"{}\" required></label>\
         <label>Search rows<input type=\"search\" name=\"q\" value=\"{}\" placeholder=\"operation, attempt, pi_…, category\"></label>\
         <button type=\"submit\">Show</button></form>",
        query.from,
        query.to,
        escape(&query.search)
    );
    let (class, verdict) = match summary.is_clean() {
        true => ("clean", format!("Clean: {} rows, no discrepancies", summary.rows)),
        false => ("unclean", format!("{} discrepancies in {} rows", summary.discrepancies, summary.rows)),
    };
    let _ = writeln!(page, "<p class=\"verdict {class}\" id=\"verdict\">{}</p>", escape(&verdict));
    let period_query = query.period_query();
    let _ = writeln!(
        page,
        "<p class=\"downloads\">Download this period: <a id=\"download-csv\" href=\"/finance/report.csv?{0}\">CSV</a>\
         <a id=\"download-json\" href=\"/finance/report.json?{0}\">JSON</a> \
         <span class=\"note\">(every row, whatever the search)</span></p>",
        escape(&period_query)
    );
    write_totals(&mut page, report);
    write_chart(&mut page, &days);
    discrepancies.write(&mut page, "discrepancies", "Discrepancies", query);
    all_rows.write(&mut page, "rows", "All rows", query);
    let _ = write!(
        page,
        "<p class=\"note\">Generated {} by chargeguard {} from the {} list API ({} payments, {} refunds listed). \
         Pending counts as stale after {} minutes, requires_action after {} minutes.</p>\n</body></html>\n",
        escape(&summary.generated_at.to_rfc3339()),
        escape(summary.sources.chargeguard_version),
        escape(&summary.sources.provider),
        summary.sources.provider_payments_listed,
        summary.sources.provider_refunds_listed,
        summary.pending_age_max_minutes,
        summary.requires_action_age_max_minutes
    );
    Ok(page)
}

/// The day a row belongs to: its attempt's, else its oldest provider object's.
fn row_day(row: &ReportRow) -> Option<NaiveDate> {
    let created: Option<DateTime<Utc>> = match &row.attempt {
        Some(attempt) => Some(attempt.created_at),
        None => row.objects.iter().map(|object| object.created_at).min(),
    };
    created.map(|instant| instant.date_naive())
}

/// One table's rows as HTML, at most [`TABLE_ROWS_MAX`]; `matched` counts them all.
#[derive(Default)]
struct Table {
    html: Vec<u8>,
    shown: usize,
    matched: u64,
}

impl Table {
    fn add(&mut self, row: &ReportRow) {
        self.matched += 1;
        if self.shown >= TABLE_ROWS_MAX {
            return;
        }
        self.shown += 1;
        // Writing to a Vec cannot fail.
        let _ = write_row(&mut self.html, row);
    }

    fn write(&self, page: &mut String, id: &str, title: &str, query: &PageQuery) {
        let searched = match query.search.is_empty() {
            true => String::new(),
            false => format!(" matching “{}”", escape(&query.search)),
        };
        let _ = writeln!(page, "<h2>{} ({}{})</h2>", escape(title), self.matched, searched);
        if self.shown == 0 {
            let _ = writeln!(page, "<p class=\"note\" id=\"{}-none\">None.</p>", escape(id));
            return;
        }
        let mut header = Vec::new();
        let _ = write_row_header(&mut header);
        let _ = write!(page, "<table id=\"{}\">{}", escape(id), String::from_utf8_lossy(&header));
        page.push_str(&String::from_utf8_lossy(&self.html));
        page.push_str("</table>\n");
        if self.matched > self.shown as u64 {
            let _ = writeln!(page, "<p class=\"note\">The first {} of {} shown; the downloads hold every row.</p>",
                self.shown, self.matched
            );
        }
    }
}

fn write_totals(page: &mut String, report: &PreparedReport) {
    let summary = report.summary();
    page.push_str("<h2>Totals by currency</h2>\n");
    if summary.currencies.is_empty() {
        page.push_str("<p class=\"note\">No money in this period.</p>\n");
    } else {
        page.push_str(
            "<table id=\"totals\"><tr><th>currency</th><th>ours succeeded</th><th>provider succeeded</th>\
             <th>ours refunded</th><th>provider refunded</th></tr>\n",
        );
        for (currency, totals) in &summary.currencies {
            let cell = |amount: i64| format!("<td class=\"num\">{}</td>", escape(&major_units(currency, amount)));
            let _ = writeln!(
                page,
                "<tr><td>{}</td>{}{}{}{}</tr>",
                escape(currency),
                cell(totals.ours_succeeded_minor),
                cell(totals.provider_succeeded_minor),
                cell(totals.ours_refunded_minor),
                cell(totals.provider_refunded_minor)
            );
        }
        page.push_str("</table>\n");
    }
    let counted: Vec<_> = summary.categories.iter().filter(|(_, count)| *count > 0).collect();
    if counted.is_empty() {
        return;
    }
    page.push_str("<table id=\"categories\"><tr><th>category</th><th>meaning</th><th>rows</th></tr>\n");
    for (category, count) in counted {
        let class = if category.is_discrepancy() { "discrepancy" } else { "" };
        let _ = writeln!(
            page,
            "<tr class=\"{class}\"><td>{}</td><td>{}</td><td class=\"num\">{count}</td></tr>",
            escape(category.as_str()),
            escape(category.label())
        );
    }
    page.push_str("</table>\n");
}

/// Geometry of the chart, in SVG user units (the picture scales to the page's width).
const CHART_WIDTH: u64 = 900;
const CHART_HEIGHT: u64 = 220;
const CHART_MARGIN: u64 = 30;

/// Bars per day: every row (grey) with its discrepancies (red) in front.
fn write_chart(page: &mut String, days: &BTreeMap<NaiveDate, DayCounts>) {
    page.push_str("<h2>Charges and discrepancies per day</h2>\n");
    let Some((first, _)) = days.first_key_value() else {
        return;
    };
    let last = days.last_key_value().map(|(day, _)| *day).unwrap_or(*first);
    let rows_max = days.values().map(|counts| counts.rows).max().unwrap_or(0).max(1);
    let plot_width = CHART_WIDTH - 2 * CHART_MARGIN;
    let plot_height = CHART_HEIGHT - 2 * CHART_MARGIN;
    let slot = plot_width as f64 / days.len() as f64;
    let bar = (slot * 0.8).max(0.5);
    let _ = write!(
        page,
        "<svg id=\"chart\" role=\"img\" aria-label=\"rows and discrepancies per day\" xmlns=\"http://www.w3.org/2000/svg\" \
         viewBox=\"0 0 {CHART_WIDTH} {CHART_HEIGHT}\" width=\"{CHART_WIDTH}\" height=\"{CHART_HEIGHT}\" font-size=\"12\">\
         <line x1=\"{CHART_MARGIN}\" y1=\"{bottom}\" x2=\"{right}\" y2=\"{bottom}\" stroke=\"#888\"/>\
         <text x=\"{CHART_MARGIN}\" y=\"{top_label}\" fill=\"#555\">{rows_max} rows</text>",
        bottom = CHART_MARGIN + plot_height,
        right = CHART_MARGIN + plot_width,
        top_label = CHART_MARGIN - 8,
    );
    for (index, (day, counts)) in days.iter().enumerate() {
        let x = CHART_MARGIN as f64 + index as f64 * slot + (slot - bar) / 2.0;
        let height = |value: u64| value as f64 * plot_height as f64 / rows_max as f64;
        let bottom = (CHART_MARGIN + plot_height) as f64;
        let _ = write!(
            page,
            "<g class=\"day\"><title>{}: {} rows, {} discrepancies</title>\
             <rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{bar:.1}\" height=\"{:.1}\" fill=\"#9ab\"/>\
             <rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{bar:.1}\" height=\"{:.1}\" fill=\"#c33\"/></g>",
            escape(&day.to_string()),
            counts.rows,
            counts.discrepancies,
            bottom - height(counts.rows),
            height(counts.rows),
            bottom - height(counts.discrepancies),
            height(counts.discrepancies),
        );
    }
    let label_y = CHART_HEIGHT - 8;
    let _ = writeln!(
        page,
        "<text x=\"{CHART_MARGIN}\" y=\"{label_y}\" fill=\"#555\">{}</text>\
         <text x=\"{}\" y=\"{label_y}\" fill=\"#555\" text-anchor=\"end\">{}</text>\
         <rect x=\"{}\" y=\"6\" width=\"10\" height=\"10\" fill=\"#9ab\"/><text x=\"{}\" y=\"15\">rows</text>\
         <rect x=\"{}\" y=\"6\" width=\"10\" height=\"10\" fill=\"#c33\"/><text x=\"{}\" y=\"15\">discrepancies</text></svg>",
        escape(&first.to_string()),
        CHART_MARGIN + plot_width,
        escape(&last.to_string()),
        CHART_WIDTH - 220,
        CHART_WIDTH - 206,
        CHART_WIDTH - 150,
        CHART_WIDTH - 136,
    );
}
