//! A fresh PostgreSQL database per test, dropped when the test ends. Databases left behind by a
//! crashed test process are dropped by the next run.

use std::sync::OnceLock;

use sqlx::{Connection, Executor, PgConnection};

/// Override with CHARGEGUARD_TEST_DATABASE_ADMIN_URL to test against another server.
pub fn admin_url() -> String {
    std::env::var("CHARGEGUARD_TEST_DATABASE_ADMIN_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

const PREFIX: &str = "cg_it_";

pub struct TestDatabase {
    pub name: String,
    pub url: String,
}

static LEFTOVERS_DROPPED: OnceLock<()> = OnceLock::new();

impl TestDatabase {
    pub async fn create() -> Self {
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
        Self { name, url }
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
