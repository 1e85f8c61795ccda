//! Writes a prepared report: CSV (rows only, for spreadsheets), JSON (summary then rows, for
//! machines), HTML (one self-contained page for people). Each reads the rows page by page and
//! writes as it goes.

// The finance page (`finance/`) writes its downloads and tables with these, page by page.
pub(crate) mod csv;
pub(crate) mod html;
pub(crate) mod json;

use std::io::Write;

use super::{PreparedReport, ReportError, ReportRow};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Csv,
    Json,
    Html,
}

#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error(transparent)]
    Report(#[from] ReportError),
    #[error("writing the report: {0}")]
    Write(#[from] std::io::Error),
}

/// Writes `report` in `format`; the summary first where the format has one.
pub async fn write_report(
    report: &PreparedReport,
    format: Format,
    out: &mut dyn Write,
) -> Result<(), RenderError> {
    match format {
        Format::Csv => {
            csv::write_header(out)?;
            each_row(report, out, csv::write_row).await?;
        }
        Format::Json => {
            json::write_start(out, report.summary())?;
            let mut first = true;
            each_row(report, out, |out, row| {
                let written = json::write_row(out, row, first);
                first = false;
                written
            })
            .await?;
            json::write_end(out)?;
        }
        Format::Html => {
            html::write_start(out, report.summary())?;
            html::write_table_start(
                out,
                "discrepancies",
                "Discrepancies",
                report.summary().discrepancies,
            )?;
            each_row(report, out, |out, row| {
                match row.category.is_discrepancy() {
                    true => html::write_row(out, row),
                    false => Ok(()),
                }
            })
            .await?;
            html::write_table_end(out)?;
            html::write_all_rows_start(out, report.summary().rows)?;
            each_row(report, out, html::write_row).await?;
            html::write_end(out)?;
        }
    }
    out.flush()?;
    Ok(())
}

async fn each_row(
    report: &PreparedReport,
    out: &mut dyn Write,
    mut write: impl FnMut(&mut dyn Write, &ReportRow) -> std::io::Result<()>,
) -> Result<(), RenderError> {
    let mut pages = report.rows();
    while let Some(page) = pages.next_page().await? {
        for row in &page {
            write(out, row)?;
        }
    }
    Ok(())
}
