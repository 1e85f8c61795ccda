//! `chargeguard report --from DATE --to DATE [--format csv|json|html] [--output FILE]`.
//! Exit 0 when clean, 1 when there are discrepancies, 2 on error, so cron and alerting can act
//! on the code alone. The summary also goes to standard error.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use super::render::{Format, write_report};
use super::{ReportPeriod, ReportSettings, Reporter};
use crate::clock::SystemClock;
use crate::config::Config;
use crate::provider::{StripeProvider, StripeProviderConfig};
use crate::store::postgres::PostgresPoolOptions;
use crate::store::{DatabaseLocation, PostgresStore};

/// The CLI's pool: staging and row pages run one at a time.
const CLI_CONNECTIONS_MAX: u32 = 2;

pub const EXIT_CLEAN: u8 = 0;
pub const EXIT_DISCREPANCIES: u8 = 1;
pub const EXIT_ERROR: u8 = 2;

#[derive(Debug, Clone, clap::Args)]
pub struct ReportArgs {
    /// First day (UTC) or RFC 3339 instant of the period, included.
    #[arg(long)]
    pub from: String,
    /// Last day (UTC, included) or RFC 3339 instant (excluded) of the period.
    #[arg(long)]
    pub to: String,
    #[arg(long, value_enum, default_value = "csv")]
    pub format: Format,
    /// Write here instead of standard output (through a temporary file renamed at the end, so
    /// a failed run never leaves a complete-looking report).
    #[arg(long)]
    pub output: Option<PathBuf>,
}

pub async fn run(config_file: Option<&Path>, args: ReportArgs) -> ExitCode {
    match produce(config_file, &args).await {
        Ok(clean) => ExitCode::from(if clean {
            EXIT_CLEAN
        } else {
            EXIT_DISCREPANCIES
        }),
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

/// Writes the report; `Ok(true)` when it is clean.
async fn produce(config_file: Option<&Path>, args: &ReportArgs) -> anyhow::Result<bool> {
    let config = Config::load(config_file)?;
    config.validate()?;
    let settings = ReportSettings::from_config(&config.report);
    let period = ReportPeriod::parse(&args.from, &args.to, settings.period_days_max)?;
    let database_url = config
        .database
        .url
        .as_ref()
        .context("database.url is not set (CHARGEGUARD_DATABASE__URL)")?;
    let location = DatabaseLocation::from_config(&config.database)?;
    anyhow::ensure!(
        location == DatabaseLocation::Postgres,
        "reports need PostgreSQL; {} is not",
        location.describe()
    );
    let store = PostgresStore::connect_lazy(
        database_url.expose(),
        &PostgresPoolOptions {
            connections_max: CLI_CONNECTIONS_MAX,
            acquire_timeout: Duration::from_millis(config.database.acquire_timeout_ms),
            statement_timeout: Duration::from_millis(config.database.statement_timeout_ms),
        },
    )?;
    let provider = StripeProvider::new(StripeProviderConfig::from_config(&config.provider)?)?;
    let reporter = Reporter::new(
        Arc::new(store),
        Arc::new(provider),
        Arc::new(SystemClock),
        settings,
    );
    let report = reporter
        .prepare(reporter.new_run(), period)
        .await
        .context("preparing the report")?;
    let written = match &args.output {
        Some(path) => write_to_file(&report, args.format, path).await,
        None => {
            let mut stdout = std::io::BufWriter::new(std::io::stdout().lock());
            write_report(&report, args.format, &mut stdout)
                .await
                .map_err(anyhow::Error::from)
        }
    };
    let clean = report.summary().is_clean();
    eprint!("{}", report.summary().to_text());
    report.finish().await;
    written?;
    Ok(clean)
}

async fn write_to_file(
    report: &super::PreparedReport,
    format: Format,
    path: &Path,
) -> anyhow::Result<()> {
    let mut partial = path.as_os_str().to_owned();
    partial.push(format!(".partial-{}", std::process::id()));
    let partial = PathBuf::from(partial);
    let file = std::fs::File::create(&partial)
        .with_context(|| format!("creating {}", partial.display()))?;
    let mut writer = std::io::BufWriter::new(file);
    let written = match write_report(report, format, &mut writer).await {
        Ok(()) => writer.flush().map_err(anyhow::Error::from),
        Err(error) => Err(error.into()),
    };
    drop(writer);
    match written {
        Ok(()) => std::fs::rename(&partial, path)
            .with_context(|| format!("renaming to {}", path.display())),
        Err(error) => {
            let _ = std::fs::remove_file(&partial);
            Err(error)
        }
    }
}
