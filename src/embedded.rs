//! The first-run demo consumer. When `serve` starts with no consumers configured and charges
//! the built-in simulator (no real money can move), it authenticates one consumer, `demo`,
//! whose random token lives in a file only the user can read. The token is never logged or
//! printed: the CLI client reads the same file, so the quickstart needs no token handling.
//! With a real provider key or any configured consumer, none of this happens.
//!
//! Likewise, with no operators configured, the first run makes one admin operator,
//! `demo-admin`, whose token is in its own file beside the demo token: `chargeguard
//! finance-link` reads it to get a one-time login link to the finance page. A consumer's token
//! never reads reports, so the two stay apart.

use std::io::{ErrorKind, Read, Write};
use std::path::{Path, PathBuf};

use rand::RngCore;

use crate::config::{ConsumerConfig, OperatorConfig, OperatorRole};
use crate::grpc::hash_token;
use crate::secret::Secret;

/// Where the demo token is kept unless `embedded.demo_token_file` says otherwise; relative to
/// the working directory of `serve` (and of the CLI client, which reads it).
pub const DEMO_TOKEN_FILE_DEFAULT: &str = "chargeguard-data/demo-token";
/// The file beside the demo token that names the running built-in simulator.
const SIMULATOR_URL_FILE: &str = "simulator-url";
/// The consumer name the demo token authenticates.
pub const DEMO_CONSUMER: &str = "demo";
/// Where the demo operator's token is kept: beside the demo token, whatever its file is called.
pub const DEMO_OPERATOR_TOKEN_FILE_NAME: &str = "demo-operator-token";
/// The demo operator token file of a first-run server with the default `embedded.demo_token_file`.
pub const DEMO_OPERATOR_TOKEN_FILE_DEFAULT: &str = "chargeguard-data/demo-operator-token";
/// The operator name the demo operator token authenticates (role admin).
pub const DEMO_OPERATOR: &str = "demo-admin";
/// Random bytes in a demo token (hex-encoded in the file).
const DEMO_TOKEN_BYTES: usize = 32;
/// A token file larger than this is not a token file.
const TOKEN_FILE_BYTES_MAX: u64 = 4_096;

#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    #[error("cannot read token file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot create token file {path}: {source}")]
    Create {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "token file {path} can be read by other users (mode {mode:o}); run `chmod 600 {path}` or delete it"
    )]
    TooOpen { path: String, mode: u32 },
    #[error("token file {path} does not hold a token (empty, too long or not printable ASCII)")]
    Malformed { path: String },
    #[error("{path} does not hold the built-in simulator's http:// URL")]
    MalformedUrl { path: String },
}

/// The demo consumer, creating its token file (mode 0600, in a 0700 directory) on first use and
/// reusing it afterwards, so a token a user exported keeps working across restarts.
pub fn demo_consumer(path: &Path) -> Result<ConsumerConfig, TokenFileError> {
    let token = read_or_create_token_file(path, "cg_demo_")?;
    Ok(ConsumerConfig {
        name: DEMO_CONSUMER.to_owned(),
        token_sha256: hash_token(token.expose()).into(),
        ..ConsumerConfig::default()
    })
}

/// The demo operator (role admin) of a first run, its token file created on first use like the
/// demo consumer's. `demo_token_file` is the demo consumer's token file: the operator's sits
/// beside it.
pub fn demo_operator(demo_token_file: &Path) -> Result<(OperatorConfig, PathBuf), TokenFileError> {
    let path = demo_token_file.with_file_name(DEMO_OPERATOR_TOKEN_FILE_NAME);
    let token = read_or_create_token_file(&path, "cg_demo_admin_")?;
    let operator = OperatorConfig {
        name: DEMO_OPERATOR.to_owned(),
        token_sha256: hash_token(token.expose()).into(),
        role: OperatorRole::Admin,
    };
    Ok((operator, path))
}

fn read_or_create_token_file(path: &Path, prefix: &str) -> Result<Secret, TokenFileError> {
    match read_token_file(path) {
        Ok(token) => Ok(token),
        Err(TokenFileError::Read { source, .. }) if source.kind() == ErrorKind::NotFound => {
            create_token_file(path, prefix)
        }
        Err(error) => Err(error),
    }
}

/// Reads a token from a file that only its owner can read.
pub fn read_token_file(path: &Path) -> Result<Secret, TokenFileError> {
    let display = path.display().to_string();
    let read_error = |source| TokenFileError::Read {
        path: display.clone(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_error)?;
    refuse_open_permissions(&file, &display)?;
    let mut contents = String::new();
    file.take(TOKEN_FILE_BYTES_MAX + 1)
        .read_to_string(&mut contents)
        .map_err(read_error)?;
    let token = contents.trim();
    let printable = token.bytes().all(|b| b.is_ascii_graphic());
    if token.is_empty() || !printable || contents.len() as u64 > TOKEN_FILE_BYTES_MAX {
        return Err(TokenFileError::Malformed { path: display });
    }
    Ok(Secret::new(token))
}

/// Beside the demo token: where `serve` records the address of its built-in simulator (which
/// listens on `embedded.simulator_listen`, a random port by default), so that `chargeguard
/// report` run from the same directory lists what the first run's charges made there.
pub fn simulator_url_file(demo_token_file: &Path) -> PathBuf {
    demo_token_file.with_file_name(SIMULATOR_URL_FILE)
}

/// Records the running built-in simulator's URL (mode 0600, in a 0700 directory, replaced
/// whole): a report trusts what this file names as the provider.
pub fn record_simulator_url(demo_token_file: &Path, url: &str) -> std::io::Result<()> {
    let path = simulator_url_file(demo_token_file);
    if let Some(parent) = path.parent().filter(|parent| !parent.as_os_str().is_empty()) {
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder.create(parent)?;
    }
    let partial = path.with_extension(format!("partial-{}", std::process::id()));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(&partial)?;
    file.write_all(format!("{url}\n").as_bytes())?;
    drop(file);
    std::fs::rename(&partial, &path)
}

/// The URL `serve` recorded for its built-in simulator, from a file only its owner can read.
pub fn recorded_simulator_url(demo_token_file: &Path) -> Result<String, TokenFileError> {
    let path = simulator_url_file(demo_token_file);
    let display = path.display().to_string();
    let read_error = |source| TokenFileError::Read { path: display.clone(), source };
    let file = std::fs::File::open(&path).map_err(read_error)?;
    refuse_open_permissions(&file, &display)?;
    let mut contents = String::new();
    file.take(TOKEN_FILE_BYTES_MAX + 1).read_to_string(&mut contents).map_err(read_error)?;
    let url = contents.trim();
    if !url.starts_with("http://") || !url.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(TokenFileError::MalformedUrl { path: display });
    }
    Ok(url.to_owned())
}

#[cfg(unix)]
fn refuse_open_permissions(file: &std::fs::File, path: &str) -> Result<(), TokenFileError> {
    use std::os::unix::fs::PermissionsExt;
    let metadata = file.metadata().map_err(|source| TokenFileError::Read {
        path: path.to_owned(),
        source,
    })?;
    let mode = metadata.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(TokenFileError::TooOpen {
            path: path.to_owned(),
            mode,
        });
    }
    Ok(())
}

#[cfg(not(unix))]
fn refuse_open_permissions(_file: &std::fs::File, _path: &str) -> Result<(), TokenFileError> {
    Ok(())
}

fn create_token_file(path: &Path, prefix: &str) -> Result<Secret, TokenFileError> {
    let display = path.display().to_string();
    let create_error = |source| TokenFileError::Create {
        path: display.clone(),
        source,
    };
    if let Some(parent) = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
    {
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder.create(parent).map_err(create_error)?;
    }
    let mut bytes = [0u8; DEMO_TOKEN_BYTES];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    let token = format!("{prefix}{}", hex::encode(bytes));
    let mut options = std::fs::OpenOptions::new();
    // create_new: two servers starting at once never overwrite each other's token.
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = match options.open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == ErrorKind::AlreadyExists => return read_token_file(path),
        Err(error) => return Err(create_error(error)),
    };
    file.write_all(format!("{token}\n").as_bytes())
        .map_err(create_error)?;
    file.sync_all().map_err(create_error)?;
    Ok(Secret::new(token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_a_private_token_once_and_reuses_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/demo-token");
        let first = demo_consumer(&path).unwrap();
        let again = demo_consumer(&path).unwrap();
        assert_eq!(first.name, DEMO_CONSUMER);
        assert_eq!(first.token_sha256, again.token_sha256);
        let token = read_token_file(&path).unwrap();
        assert_eq!(crate::config::Sha256List::from(hash_token(token.expose())), first.token_sha256);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(
                std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
                0o600
            );
        }
    }

    #[test]
    fn the_demo_operator_token_sits_beside_the_demo_token_and_differs_from_it() {
        let dir = tempfile::tempdir().unwrap();
        let consumer_path = dir.path().join("data/demo-token");
        let consumer = demo_consumer(&consumer_path).unwrap();
        let (operator, operator_path) = demo_operator(&consumer_path).unwrap();
        assert_eq!(operator_path, dir.path().join("data").join(DEMO_OPERATOR_TOKEN_FILE_NAME));
        assert_eq!(operator.role, OperatorRole::Admin);
        assert_ne!(operator.token_sha256, consumer.token_sha256);
        let (again, _) = demo_operator(&consumer_path).unwrap();
        assert_eq!(again.token_sha256, operator.token_sha256, "reused across restarts");
        assert_eq!(
            Path::new(DEMO_TOKEN_FILE_DEFAULT).with_file_name(DEMO_OPERATOR_TOKEN_FILE_NAME),
            Path::new(DEMO_OPERATOR_TOKEN_FILE_DEFAULT)
        );
    }

    #[cfg(unix)]
    #[test]
    fn refuses_a_token_file_others_can_read() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "cg_demo_abc\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            read_token_file(&path),
            Err(TokenFileError::TooOpen { .. })
        ));
        assert!(
            demo_consumer(&path).is_err(),
            "a readable token is never adopted"
        );
    }

    #[test]
    fn refuses_an_empty_token_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "\n").unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        assert!(matches!(
            read_token_file(&path),
            Err(TokenFileError::Malformed { .. })
        ));
    }
}
