//! The two stores a behaviour test can run on, and a macro that runs a test on both.

/// Which store the app under test keeps its attempts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A fresh PostgreSQL database on 127.0.0.1:5432, dropped after the test.
    Postgres,
    /// The embedded default: `database.url` unset, a fresh SQLite file in a temporary directory.
    Sqlite,
}

/// Instantiates each listed `async fn name(backend: Backend)` once per backend, as
/// `<module>::postgres::name` and `<module>::sqlite::name`, so that a failure names its backend
/// and `cargo test … sqlite` runs one side.
macro_rules! on_both_backends {
    ($($name:ident),+ $(,)?) => {
        mod postgres {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name($crate::support::Backend::Postgres).await
                }
            )+
        }
        mod sqlite {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name($crate::support::Backend::Sqlite).await
                }
            )+
        }
    };
}

pub(crate) use on_both_backends;
