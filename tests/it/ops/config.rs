//! docs/CONFIGURATION.md lists every option of `Config` with its default and its environment
//! variable, and nothing that does not exist; a bad file or variable stops `serve` with a
//! message naming the option.

use std::collections::BTreeMap;

use chargeguard::config::{Config, ConsumerConfig, OperatorConfig, OperatorRole};
use chargeguard::grpc::hash_token;
use serde_json::Value;

use super::process::{command, failed_start, write_config};

const REFERENCE: &str = include_str!("../../../docs/CONFIGURATION.md");
/// Options that never serialize (secrets) and so cannot be found by walking the defaults.
const SECRET_OPTIONS: [&str; 3] = ["database.url", "provider.api_key", "webhooks.secrets"];

/// `section.option` → its default, rendered as the reference renders it (`unset` for none).
fn options_of_config() -> BTreeMap<String, String> {
    let mut config = Config::default();
    // One entry, so that the fields of a consumer show up too.
    config.consumers.push(ConsumerConfig {
        name: String::new(),
        token_sha256: String::new().into(),
        client_cert_sha256: String::new().into(),
        client_cert_names: vec![String::new()],
        ..ConsumerConfig::default()
    });
    config.operators.push(OperatorConfig {
        name: String::new(),
        token_sha256: String::new().into(),
        role: OperatorRole::Finance,
    });
    let mut options = BTreeMap::new();
    walk("", &serde_json::to_value(&config).unwrap(), &mut options);
    for secret in SECRET_OPTIONS {
        assert!(
            !options.contains_key(secret),
            "{secret} is serialized: take it off SECRET_OPTIONS"
        );
        options.insert(secret.to_owned(), "unset".to_owned());
    }
    options
}

fn walk(prefix: &str, value: &Value, options: &mut BTreeMap<String, String>) {
    match value {
        Value::Object(fields) => {
            for (name, value) in fields {
                let key = if prefix.is_empty() {
                    name.clone()
                } else {
                    format!("{prefix}.{name}")
                };
                walk(&key, value, options);
            }
        }
        // A list of values is one option (`client_cert_names = ["…"]`); a list of tables
        // (`[[consumers]]`) has options of its own.
        Value::Array(items) if items.iter().all(|item| !item.is_object()) => {
            options.insert(prefix.to_owned(), value.to_string());
        }
        Value::Array(items) => {
            for item in items {
                walk(&format!("{prefix}[]"), item, options);
            }
        }
        Value::Null => {
            options.insert(prefix.to_owned(), "unset".to_owned());
        }
        Value::String(text) => {
            options.insert(prefix.to_owned(), text.clone());
        }
        other => {
            options.insert(prefix.to_owned(), other.to_string());
        }
    }
}

struct Row {
    option: String,
    default: String,
    bound: String,
    env: String,
}

/// The reference's table rows: `| `option` | `default` | bound | `ENV` | what |`.
fn documented_rows() -> Vec<Row> {
    let unquote = |cell: &str| cell.trim().trim_matches('`').to_owned();
    REFERENCE
        .lines()
        .filter(|line| line.starts_with("| `"))
        .map(|line| {
            let cells: Vec<&str> = line.trim_matches('|').split(" | ").collect();
            assert!(
                cells.len() >= 5,
                "a row needs option, default, bound, variable, meaning: {line}"
            );
            Row {
                option: unquote(cells[0]),
                default: unquote(cells[1]),
                bound: cells[2].trim().to_owned(),
                env: unquote(cells[3]),
            }
        })
        .collect()
}

fn env_var(option: &str) -> String {
    let section_path = option.split("[]").next().unwrap();
    format!(
        "CHARGEGUARD_{}",
        section_path.to_ascii_uppercase().replace('.', "__")
    )
}

#[test]
fn the_configuration_reference_lists_every_option_with_default_and_variable() {
    let options = options_of_config();
    let rows = documented_rows();
    let documented: BTreeMap<&str, &Row> =
        rows.iter().map(|row| (row.option.as_str(), row)).collect();
    assert_eq!(documented.len(), rows.len(), "an option is listed twice");
    let missing: Vec<&String> = options
        .keys()
        .filter(|key| !documented.contains_key(key.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/CONFIGURATION.md lacks {missing:?}"
    );
    let unknown: Vec<&&str> = documented
        .keys()
        .filter(|key| !options.contains_key(**key))
        .collect();
    assert!(
        unknown.is_empty(),
        "docs/CONFIGURATION.md lists options Config does not have: {unknown:?}"
    );
    for (option, default) in &options {
        let row = documented[option.as_str()];
        assert_eq!(row.env, env_var(option), "environment variable of {option}");
        assert!(!row.bound.is_empty(), "bound of {option}");
        if !option.starts_with("consumers[]") && !option.starts_with("operators[]") {
            assert_eq!(&row.default, default, "default of {option}");
        }
    }
}

#[tokio::test]
async fn an_invalid_file_stops_serve_naming_the_file_and_the_option() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "[server]\ngrpc_listne = \"127.0.0.1:1\"\n");
    let stderr = failed_start(command(dir.path()), &["--config", config.to_str().unwrap()]).await;
    assert!(stderr.contains("grpc_listne"), "names the option: {stderr}");
    assert!(
        stderr.contains("chargeguard.toml"),
        "names the file: {stderr}"
    );
}

#[tokio::test]
async fn an_invalid_environment_variable_stops_serve_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut serve = command(dir.path());
    serve.env("CHARGEGUARD_CHARGE__LEASE_MS", "soon");
    let stderr = failed_start(serve, &[]).await;
    assert!(
        stderr.contains("charge.lease_ms: "),
        "names the option: {stderr}"
    );
    assert!(
        stderr.contains("in environment variable CHARGEGUARD_CHARGE__LEASE_MS"),
        "names the variable: {stderr}"
    );
    assert!(stderr.contains("soon"), "shows the value: {stderr}");
}

#[tokio::test]
async fn options_out_of_bounds_are_listed_together_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut serve = command(dir.path());
    serve
        .env("CHARGEGUARD_CHARGE__LEASE_MS", "1")
        .env("CHARGEGUARD_CHARGE__KEY_WINDOW_SAFE_MINUTES", "1440");
    let stderr = failed_start(serve, &[]).await;
    assert!(
        stderr.contains("charge.lease_ms") && stderr.contains("charge.key_window_safe_minutes"),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_token_or_a_consumer_name_used_twice_stops_serve_naming_both_entries() {
    let shared = hash_token("shared-token-0123456789");
    let entry = |section: &str, name: &str, hash: &str, role: &str| {
        format!("[[{section}]]\nname = \"{name}\"\ntoken_sha256 = \"{hash}\"\n{role}")
    };
    let toml = [
        entry("consumers", "orders", &shared, ""),
        // Authentication compares lowercase hashes: the same token however it is written.
        entry("consumers", "billing", &shared.to_ascii_uppercase(), ""),
        entry("consumers", "orders", &hash_token("another-token-0123456789"), ""),
        entry("operators", "finance", &shared, "role = \"finance\"\n"),
    ]
    .concat();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &toml);
    let stderr = failed_start(command(dir.path()), &["--config", config.to_str().unwrap()]).await;
    for problem in [
        "consumers: \"billing\" has the same token_sha256 as consumer \"orders\": every consumer and operator needs its own token",
        "operators: \"finance\" has the same token_sha256 as consumer \"orders\": every consumer and operator needs its own token",
        "consumers: \"orders\" is listed twice: two consumers of one name share one key space",
    ] {
        assert!(stderr.contains(problem), "{problem:?} in:\n{stderr}");
    }
    assert!(
        !stderr.to_ascii_lowercase().contains(&shared),
        "the hash is never shown: {stderr}"
    );
}

#[tokio::test]
async fn a_key_window_that_could_outlive_the_providers_retention_stops_serve_with_the_sum() {
    let dir = tempfile::tempdir().unwrap();
    let mut serve = command(dir.path());
    serve.env("CHARGEGUARD_CHARGE__KEY_WINDOW_SAFE_MINUTES", "1435");
    let stderr = failed_start(serve, &[]).await;
    let problem = "charge.key_window_safe_minutes (1435 min) + the clock skew tolerance (5 min) \
                   + provider.call_timeout_ms (10000 ms) = 86410 s, which must stay under the \
                   provider's key retention (86400 s = 24 h): a re-send could reach the provider \
                   after it forgot the key, and charge again";
    assert!(stderr.contains(problem), "{problem:?} in:\n{stderr}");
}

#[test]
fn the_largest_key_window_leaves_room_for_skew_and_one_call() {
    let with = |safe_minutes: u64, call_timeout_ms: u64| {
        let mut config = Config::default();
        config.charge.key_window_safe_minutes = safe_minutes;
        config.provider.call_timeout_ms = call_timeout_ms;
        // What a long call timeout asks of the options bounded by it.
        config.charge.lease_ms = call_timeout_ms * 2 + config.database.statement_timeout_ms + 1;
        config.charge.recovery_grace_ms = config.charge.lease_ms;
        config.server.shutdown_grace_ms = call_timeout_ms + 1;
        config.validate()
    };
    // 1434 min + 5 min + 10 s is 23 h 59 min 10 s.
    with(1_434, 10_000).expect("the largest window with the default call timeout");
    with(1_435, 10_000).unwrap_err();
    // The longest call allowed (5 min) takes five minutes off the window.
    with(1_429, 300_000).expect("the largest window with the longest call timeout");
    let refused = with(1_430, 300_000).unwrap_err().to_string();
    assert!(
        refused.contains("(1430 min) + the clock skew tolerance (5 min) + provider.call_timeout_ms (300000 ms) = 86400 s"),
        "{refused}"
    );
    // A call timeout in milliseconds is summed exactly.
    let refused = with(1_434, 60_500).unwrap_err().to_string();
    assert!(refused.contains("(60500 ms) = 86400.5 s"), "{refused}");
}
