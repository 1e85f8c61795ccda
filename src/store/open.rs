//! Which store the service uses, decided in one place from `[database]`: `postgres://…` is
//! PostgreSQL (production), `sqlite:…` or no URL at all is the embedded SQLite file (first run,
//! demos, one process).

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::SqliteConnectOptions;

use super::postgres::PostgresPoolOptions;
use super::sqlite::SqliteStoreOptions;
use super::{AttemptStore, PostgresStore, SqliteStore, StoreError};
use crate::config::DatabaseConfig;

/// Where the attempts live, read from configuration without connecting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatabaseLocation {
    /// The URL is secret-bearing: it is passed to the driver and never printed.
    Postgres,
    /// From `database.url = "sqlite:…"`.
    SqliteUrl(PathBuf),
    /// No URL: the embedded default at `database.sqlite_path`.
    SqliteDefault(PathBuf),
}

#[derive(Debug, thiserror::Error)]
pub enum LocationError {
    // The URL itself is never part of the message: it may hold a password.
    #[error("database.url must start with postgres://, postgresql:// or sqlite:")]
    UnknownScheme,
    #[error("database.url: {0}")]
    BadSqliteUrl(String),
    #[error(
        "database.url names an in-memory SQLite database; payment_attempts is a financial \
         record and must outlive the process: name a file"
    )]
    InMemory,
    #[error("database.sqlite_path must not be empty")]
    EmptySqlitePath,
}

impl DatabaseLocation {
    pub fn from_config(config: &DatabaseConfig) -> Result<Self, LocationError> {
        let Some(url) = &config.url else {
            if config.sqlite_path.as_os_str().is_empty() {
                return Err(LocationError::EmptySqlitePath);
            }
            return Ok(Self::SqliteDefault(config.sqlite_path.clone()));
        };
        let url = url.expose();
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(Self::Postgres);
        }
        if !url.starts_with("sqlite:") {
            return Err(LocationError::UnknownScheme);
        }
        // Each pooled connection to an in-memory database would get its own empty database.
        if url.contains(":memory:") || url.contains("mode=memory") {
            return Err(LocationError::InMemory);
        }
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|error| LocationError::BadSqliteUrl(error.to_string()))?;
        Ok(Self::SqliteUrl(options.get_filename().to_path_buf()))
    }

    /// What the start-up log says; never the PostgreSQL URL.
    pub fn describe(&self) -> String {
        match self {
            Self::Postgres => "PostgreSQL at database.url".to_owned(),
            Self::SqliteUrl(path) => format!("SQLite at {} (database.url)", path.display()),
            Self::SqliteDefault(path) => format!(
                "embedded SQLite at {} (database.url is not set; for one process — use \
                 PostgreSQL for production and several replicas)",
                path.display()
            ),
        }
    }
}

/// An opened store, still knowing its backend so that it can be migrated.
pub enum OpenedStore {
    Postgres(PostgresStore),
    Sqlite(SqliteStore),
}

impl OpenedStore {
    pub async fn migrate(&self) -> Result<(), StoreError> {
        match self {
            Self::Postgres(store) => store.migrate().await,
            Self::Sqlite(store) => store.migrate().await,
        }
    }

    /// The store behind the trait, for the orchestrator, the health ping and `/readyz`.
    pub fn into_store(self) -> Arc<dyn AttemptStore> {
        match self {
            Self::Postgres(store) => Arc::new(store),
            Self::Sqlite(store) => Arc::new(store),
        }
    }
}

/// Opens the configured store. PostgreSQL connects lazily (the service starts, and reports
/// NOT_SERVING, while the database is down); SQLite opens its file now, creating the file and
/// its directory, so that a bad path fails at start.
pub async fn open(config: &DatabaseConfig) -> Result<OpenedStore, StoreError> {
    let location = DatabaseLocation::from_config(config)
        .map_err(|error| StoreError::Unavailable(error.to_string()))?;
    let acquire_timeout = Duration::from_millis(config.acquire_timeout_ms);
    let statement_timeout = Duration::from_millis(config.statement_timeout_ms);
    let sqlite_options = SqliteStoreOptions {
        connections_max: config.connections_max,
        acquire_timeout,
        busy_timeout: statement_timeout,
    };
    match location {
        DatabaseLocation::Postgres => {
            let url = config
                .url
                .as_ref()
                .expect("a PostgreSQL location comes from the url");
            let options = PostgresPoolOptions {
                connections_max: config.connections_max,
                acquire_timeout,
                statement_timeout,
            };
            let store = PostgresStore::connect_lazy(url.expose(), &options)?;
            // SQLite has no group commit: its one writer lock already serializes writers, and
            // a commit there is a local fsync with no round trip to share (README "Storage").
            if config.group_commit.enabled {
                return Ok(OpenedStore::Postgres(store.with_group_commit(&config.group_commit)));
            }
            Ok(OpenedStore::Postgres(store))
        }
        DatabaseLocation::SqliteUrl(path) => {
            create_parent_directory(&path)?;
            let url = config
                .url
                .as_ref()
                .expect("a SQLite URL location comes from the url");
            let connect_options = SqliteConnectOptions::from_str(url.expose())
                .map_err(|error| StoreError::Unavailable(format!("database.url: {error}")))?;
            Ok(OpenedStore::Sqlite(
                SqliteStore::open(connect_options, &sqlite_options).await?,
            ))
        }
        DatabaseLocation::SqliteDefault(path) => {
            create_parent_directory(&path)?;
            let connect_options = SqliteStore::file(&path);
            Ok(OpenedStore::Sqlite(
                SqliteStore::open(connect_options, &sqlite_options).await?,
            ))
        }
    }
}

fn create_parent_directory(path: &Path) -> Result<(), StoreError> {
    let Some(parent) = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
    else {
        return Ok(());
    };
    std::fs::create_dir_all(parent)
        .map_err(|error| StoreError::Unavailable(format!("creating {}: {error}", parent.display())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secret::Secret;

    fn with_url(url: Option<&str>) -> DatabaseConfig {
        DatabaseConfig {
            url: url.map(Secret::new),
            ..DatabaseConfig::default()
        }
    }

    #[test]
    fn the_url_scheme_chooses_the_backend() {
        let location = |url| DatabaseLocation::from_config(&with_url(url));
        assert_eq!(
            location(None).unwrap(),
            DatabaseLocation::SqliteDefault(PathBuf::from("chargeguard-data/chargeguard.sqlite"))
        );
        assert_eq!(
            location(Some("postgres://u:pw@db/x")).unwrap(),
            DatabaseLocation::Postgres
        );
        assert_eq!(
            location(Some("postgresql://db/x")).unwrap(),
            DatabaseLocation::Postgres
        );
        assert_eq!(
            location(Some("sqlite:///var/lib/cg/a.sqlite")).unwrap(),
            DatabaseLocation::SqliteUrl(PathBuf::from("/var/lib/cg/a.sqlite"))
        );
        assert_eq!(
            location(Some("sqlite://data/a.sqlite")).unwrap(),
            DatabaseLocation::SqliteUrl(PathBuf::from("data/a.sqlite"))
        );
        assert!(matches!(
            location(Some("sqlite::memory:")),
            Err(LocationError::InMemory)
        ));
        assert!(matches!(
            location(Some("sqlite://a?mode=memory")),
            Err(LocationError::InMemory)
        ));
        let unknown = location(Some("mysql://root:hunter2@db/x")).unwrap_err();
        assert!(
            !unknown.to_string().contains("hunter2"),
            "the url is never echoed"
        );
    }

    #[test]
    fn an_empty_sqlite_path_is_refused() {
        let config = DatabaseConfig {
            sqlite_path: PathBuf::new(),
            ..DatabaseConfig::default()
        };
        assert!(matches!(
            DatabaseLocation::from_config(&config),
            Err(LocationError::EmptySqlitePath)
        ));
    }

    #[tokio::test]
    async fn the_embedded_default_creates_its_directory_and_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/data/chargeguard.sqlite");
        let config = DatabaseConfig {
            sqlite_path: path.clone(),
            ..DatabaseConfig::default()
        };
        let opened = open(&config).await.unwrap();
        opened.migrate().await.unwrap();
        opened.into_store().ping().await.unwrap();
        assert!(path.is_file(), "{} exists", path.display());
    }

    #[tokio::test]
    async fn a_sqlite_url_opens_that_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("by-url/a.sqlite");
        let opened = open(&with_url(Some(&format!("sqlite://{}", path.display()))))
            .await
            .unwrap();
        opened.migrate().await.unwrap();
        assert!(path.is_file(), "{} exists", path.display());
    }
}
