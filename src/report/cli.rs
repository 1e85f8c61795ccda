//! `chargeguard report --from DATE --to DATE [--format csv|json|html] [--output FILE]`.
//! Exit 0 when clean, 1 when there are discrepancies, 2 on error, so cron and alerting can act
//! on the code alone. The summary also goes to standard error.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;

use super::render::{Format, write_report};
use super::{ReportPeriod, ReportSettings, Reporter};
use crate::clock::SystemClock;
use crate::config::{Config, DatabaseConfig};
use crate::provider::{StripeProvider, StripeProviderConfig};
use crate::secret::Secret;
use crate::store::{DatabaseLocation, OpenedStore, ReportStore, open};

/// The CLI's pool: staging and row pages run one at a time.
const CLI_CONNECTIONS_MAX: u32 = 2;

pub const EXIT_CLEAN: u8 = 0;
pub const EXIT_DISCREPANCIES: u8 = 1;
pub const EXIT_ERROR: u8 = 2;

#[derive(Debug, Clone, clap::Args)]
pub struct ReportArgs {
    /// First day (UTC; `today` for today's date) or RFC 3339 instant of the period, included.
    #[arg(long)]
    pub from: String,
    /// Last day (UTC, included; `today` for today's date) or RFC 3339 instant (excluded) of the period.
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
    let (from, to) = (named_day(&args.from), named_day(&args.to));
    let period = ReportPeriod::parse(&from, &to, settings.period_days_max)?;
    // The store `serve` uses: PostgreSQL at database.url, else the embedded SQLite file
    // (database.sqlite_path by default), so a first run's report needs nothing but the period.
    let location = DatabaseLocation::from_config(&config.database)?;
    if let DatabaseLocation::SqliteUrl(path) | DatabaseLocation::SqliteDefault(path) = &location {
        // A report never creates a database: an empty one would report a clean nothing.
        anyhow::ensure!(
            path.is_file(),
            "no database at {}: `chargeguard serve` creates it on its first start",
            path.display()
        );
    }
    let database = DatabaseConfig {
        connections_max: CLI_CONNECTIONS_MAX,
        ..config.database.clone()
    };
    let opened = open(&database)
        .await
        .with_context(|| format!("opening {}", location.describe()))?;
    let store: Arc<dyn ReportStore> = match opened {
        OpenedStore::Postgres(store) => Arc::new(store),
        OpenedStore::Sqlite(store) => {
            // The embedded file is chargeguard's alone, and its report staging came with a
            // later migration than a first run's file may have: apply what is missing, as
            // `serve` does at start (database.migrate_on_start). A PostgreSQL database is
            // migrated by its deployment, as before.
            if config.database.migrate_on_start {
                store.migrate().await.context("applying migrations")?;
            }
            Arc::new(store)
        }
    };
    let mut provider_config = config.provider.clone();
    if provider_config.api_key.is_none() {
        // No provider key: `serve` charges its built-in simulator, whose objects live in that
        // process. The report lists them there, at the URL serve recorded.
        let token_file = &config.embedded.demo_token_file;
        let url = crate::embedded::recorded_simulator_url(token_file).with_context(|| {
            format!(
                "provider.api_key is not set, and no built-in simulator is recorded at {}: \
                 the report lists the simulator of a running `chargeguard serve` started from \
                 this directory",
                crate::embedded::simulator_url_file(token_file).display()
            )
        })?;
        provider_config.api_key = Some(Secret::new(crate::simulator::DEFAULT_API_KEY));
        provider_config.base_url = Some(url);
    }
    let provider = StripeProvider::new(StripeProviderConfig::from_config(&provider_config)?)?;
    let reporter = Reporter::new(
        store,
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

/// `today` as the UTC date it names (so a README command needs no shell to say it); anything
/// else as written, for `ReportPeriod::parse` to judge.
fn named_day(day: &str) -> String {
    match day {
        "today" => chrono::Utc::now().date_naive().to_string(),
        other => other.to_owned(),
    }
}

