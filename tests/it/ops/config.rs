//! docs/CONFIGURATION.md lists every option of `Config` with its default and its environment
//! variable, and nothing that does not exist; a bad file or variable stops `serve` with a
//! message naming the option.

use std::collections::BTreeMap;

use chargeguard::config::{Config, ConsumerConfig, OperatorConfig, OperatorRole};
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
        token_sha256: String::new(),
    });
    config.operators.push(OperatorConfig {
        name: String::new(),
        token_sha256: String::new(),
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
