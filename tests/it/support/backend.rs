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
/// and `cargo test … sqlite` runs one side. A test attribute written before a name replaces the
/// default `#[tokio::test]` (e.g. `#[tokio::test(flavor = "multi_thread")] name`).
macro_rules! on_both_backends {
    ($($(#[$attribute:meta])? $name:ident),+ $(,)?) => {
        mod postgres {
            $( $crate::support::on_both_backends!(@test Postgres, [$($attribute)?], $name); )+
        }
        mod sqlite {
            $( $crate::support::on_both_backends!(@test Sqlite, [$($attribute)?], $name); )+
        }
    };
    (@test $backend:ident, [], $name:ident) => {
        $crate::support::on_both_backends!(@test $backend, [tokio::test], $name);
    };
    (@test $backend:ident, [$attribute:meta], $name:ident) => {
        #[$attribute]
        async fn $name() {
            super::$name($crate::support::Backend::$backend).await
        }
    };
}

pub(crate) use on_both_backends;
