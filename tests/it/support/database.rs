//! A fresh database per test: a PostgreSQL database dropped when the test ends (databases left
//! behind by a crashed test process are dropped by the next run), or a SQLite file in a
//! temporary directory removed with it.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use chargeguard::config::Config;
use chargeguard::secret::Secret;
use chargeguard::store::AttemptStore;
use sqlx::{Connection, Executor, PgConnection};

use super::Backend;
use super::faketime::FakeClockCluster;

/// Override with CHARGEGUARD_TEST_DATABASE_ADMIN_URL to test against another server.
pub fn admin_url() -> String {
    std::env::var("CHARGEGUARD_TEST_DATABASE_ADMIN_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

const PREFIX: &str = "cg_it_";
const SQLITE_FILE: &str = "chargeguard.sqlite";

pub struct TestDatabase {
    pub backend: Backend,
    /// The PostgreSQL database's name, or the SQLite file's path.
    pub name: String,
    /// `postgres://…/name` or `sqlite://path`: what a child `chargeguard` process is given as
    /// CHARGEGUARD_DATABASE__URL.
    pub url: String,
    /// Holds the SQLite file; removed (with the file) when the database is dropped.
    sqlite_dir: Option<tempfile::TempDir>,
    /// The private cluster this database lives in, when its clock is the test's to move;
    /// removed whole with the database.
    fake_clock: Option<FakeClockCluster>,
}

static LEFTOVERS_DROPPED: OnceLock<()> = OnceLock::new();

impl TestDatabase {
    /// A fresh PostgreSQL database.
    pub async fn create() -> Self {
        Self::create_on(Backend::Postgres).await
    }

    pub async fn create_on(backend: Backend) -> Self {
        match backend {
            Backend::Postgres => Self::create_postgres().await,
            Backend::Sqlite => Self::create_sqlite(),
        }
    }

    async fn create_postgres() -> Self {
        let mut admin = PgConnection::connect(&admin_url())
            .await
            .expect("PostgreSQL must run on 127.0.0.1:5432 (see README: .ci/run starts it)");
        if LEFTOVERS_DROPPED.set(()).is_ok() {
            drop_leftovers(&mut admin).await;
        }
        let name = format!("{PREFIX}{}_{}", std::process::id(), uuid::Uuid::new_v4().simple());
        admin.execute(format!(r#"CREATE DATABASE "{name}""#).as_str()).await.expect("create test database");
        let base = admin_url();
        let url = format!("{}/{name}", base.rsplit_once('/').expect("url has a database").0);
        Self { backend: Backend::Postgres, name, url, sqlite_dir: None, fake_clock: None }
    }

    /// A fresh PostgreSQL database in a cluster of its own whose clock the test moves
    /// ([`Self::fake_clock`]); it starts at the real time.
    pub async fn create_on_fake_clock() -> Self {
        let cluster = FakeClockCluster::start().await;
        let name = "chargeguard".to_owned();
        let mut admin = PgConnection::connect(&cluster.admin_url()).await.expect("private cluster accepts connections");
        admin.execute(format!(r#"CREATE DATABASE "{name}""#).as_str()).await.expect("create test database");
        let _ = admin.close().await;
        let url = cluster.url(&name);
        Self { backend: Backend::Postgres, name, url, sqlite_dir: None, fake_clock: Some(cluster) }
    }

    /// The cluster whose clock this database reads, for databases made by
    /// [`Self::create_on_fake_clock`].
    pub fn fake_clock(&self) -> Option<&FakeClockCluster> {
        self.fake_clock.as_ref()
    }

    /// Only the directory: the app creates the file, as it does on a first run.
    fn create_sqlite() -> Self {
        let dir = tempfile::Builder::new().prefix("cg_it_sqlite_").tempdir().expect("temporary directory");
        let path = dir.path().join(SQLITE_FILE);
        let name = path.display().to_string();
        Self { backend: Backend::Sqlite, url: format!("sqlite://{name}"), name, sqlite_dir: Some(dir), fake_clock: None }
    }

    /// The SQLite file, for SQLite databases.
    pub fn sqlite_path(&self) -> Option<PathBuf> {
        self.sqlite_dir.as_ref().map(|dir| dir.path().join(SQLITE_FILE))
    }

    /// Points `config` at this database: PostgreSQL by URL; SQLite as the embedded default
    /// (no URL, `database.sqlite_path`), which is what a first run uses.
    pub fn configure(&self, config: &mut Config) {
        match self.sqlite_path() {
            None => config.database.url = Some(Secret::new(&self.url)),
            Some(path) => {
                config.database.url = None;
                config.database.sqlite_path = path;
            }
        }
    }

    /// The store itself, migrated, through the same `store::open` the service uses.
    pub async fn open_store(&self) -> Arc<dyn AttemptStore> {
        self.open_store_with(|_| {}).await
    }

    /// The same, with `customize` applied to the default configuration first.
    pub async fn open_store_with(&self, customize: impl FnOnce(&mut Config)) -> Arc<dyn AttemptStore> {
        let mut config = Config::default();
        self.configure(&mut config);
        customize(&mut config);
        let opened = chargeguard::store::open(&config.database).await.expect("store opens");
        opened.migrate().await.expect("migrations apply");
        opened.into_store()
    }

    /// Runs one statement as another writer would (an operator, another replica), on either
    /// backend; returns the rows it changed.
    pub async fn execute(&self, statement: &str) -> u64 {
        match self.sqlite_path() {
            None => {
                let mut connection = PgConnection::connect(&self.url).await.unwrap();
                sqlx::query(statement).execute(&mut connection).await.unwrap().rows_affected()
            }
            Some(path) => {
                let options = sqlx::sqlite::SqliteConnectOptions::new().filename(path);
                let mut connection = sqlx::SqliteConnection::connect_with(&options).await.unwrap();
                sqlx::query(statement).execute(&mut connection).await.unwrap().rows_affected()
            }
        }
    }

    /// Rows in payment_attempts, counted in the database itself.
    pub async fn attempt_rows(&self) -> i64 {
        let query = "SELECT count(*) FROM payment_attempts";
        match self.sqlite_path() {
            None => {
                let mut connection = PgConnection::connect(&self.url).await.unwrap();
                sqlx::query_scalar(query).fetch_one(&mut connection).await.unwrap()
            }
            Some(path) => {
                let options = sqlx::sqlite::SqliteConnectOptions::new().filename(path).read_only(true);
                let mut connection = sqlx::SqliteConnection::connect_with(&options).await.unwrap();
                sqlx::query_scalar(query).fetch_one(&mut connection).await.unwrap()
            }
        }
    }
}

/// Drops databases of test processes that no longer run.
async fn drop_leftovers(admin: &mut PgConnection) {
    let names: Vec<(String,)> = sqlx::query_as("SELECT datname FROM pg_database WHERE datname LIKE $1")
        .bind(format!("{PREFIX}%"))
        .fetch_all(&mut *admin)
        .await
        .unwrap_or_default();
    for (name,) in names {
        let pid: Option<u32> = name.strip_prefix(PREFIX).and_then(|rest| rest.split('_').next()).and_then(|p| p.parse().ok());
        let alive = pid.is_some_and(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists());
        if !alive {
            let _ = admin.execute(format!(r#"DROP DATABASE IF EXISTS "{name}" WITH (FORCE)"#).as_str()).await;
        }
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        // A private cluster is removed whole, this database with it.
        if self.backend != Backend::Postgres || self.fake_clock.is_some() {
            return;
        }
        let name = self.name.clone();
        // Drop runs outside async context; a short-lived thread with its own runtime does the
        // cleanup so a failed assertion still removes the database.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
            if let Ok(runtime) = runtime {
                runtime.block_on(async {
                    if let Ok(mut admin) = PgConnection::connect(&admin_url()).await {
                        let _ = admin.execute(format!(r#"DROP DATABASE IF EXISTS "{name}" WITH (FORCE)"#).as_str()).await;
                    }
                });
            }
        })
        .join();
    }
}
