//! The pgbench scripts in bench/pgbench/ must run the statements the service runs, or the
//! ratios in BENCHMARKS.md compare different work. These tests fail when a statement in
//! src/store/postgres.rs changes and its pgbench copy does not.

const NEW_CHARGE: &str = include_str!("../../bench/pgbench/new_charge.sql");
const BY_KEY: &str = include_str!("../../bench/pgbench/by_key.sql");
const STORE: &str = include_str!("../store/postgres.rs");

/// The SQL commands of a pgbench script: comment and meta-command lines (`\set`, `\gset`) end
/// a command and are dropped.
fn commands(script: &str) -> Vec<String> {
    let mut commands = Vec::new();
    let mut current = String::new();
    for line in script.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("--") || trimmed.starts_with('\\') || trimmed.is_empty() {
            if !current.trim().is_empty() {
                commands.push(std::mem::take(&mut current));
            }
            current.clear();
            continue;
        }
        current.push_str(line);
        current.push('\n');
    }
    if !current.trim().is_empty() {
        commands.push(current);
    }
    commands
}

/// Every parameter (`$3`, `:name`, `gen_random_uuid()`) becomes `?`, runs of whitespace one
/// space, and a final `;` goes: what is left is the statement's shape.
fn shape(sql: &str) -> String {
    let sql = sql.replace("gen_random_uuid()", "?");
    let mut out = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    let mut previous = ' ';
    while let Some(c) = chars.next() {
        let parameter_follows = |chars: &mut std::iter::Peekable<std::str::Chars>, digits: bool| {
            chars.peek().is_some_and(|next| {
                if digits {
                    next.is_ascii_digit()
                } else {
                    next.is_ascii_lowercase() || *next == '_'
                }
            })
        };
        if c == '$' && parameter_follows(&mut chars, true) {
            while chars.peek().is_some_and(char::is_ascii_digit) {
                chars.next();
            }
            out.push('?');
        } else if c == ':' && previous != ':' && parameter_follows(&mut chars, false) {
            while chars
                .peek()
                .is_some_and(|next| next.is_ascii_alphanumeric() || *next == '_')
            {
                chars.next();
            }
            out.push('?');
        } else if c.is_whitespace() {
            if !out.ends_with(' ') {
                out.push(' ');
            }
        } else {
            out.push(c);
        }
        previous = c;
    }
    out.trim().trim_end_matches(';').trim().to_owned()
}

#[test]
fn new_charge_script_runs_insert_pending_then_finish_round() {
    let store = shape(STORE);
    let commands = commands(NEW_CHARGE);
    assert_eq!(commands.len(), 2, "{commands:#?}");
    assert!(shape(&commands[0]).starts_with("SELECT * FROM insert_pending_attempt( ?"));
    assert!(shape(&commands[1]).starts_with("UPDATE payment_attempts SET failure_code"));
    for command in &commands {
        assert!(
            store.contains(&shape(command)),
            "not a statement of src/store/postgres.rs:\n{}",
            shape(command)
        );
    }
}

#[test]
fn by_key_script_runs_find_by_operation() {
    let commands = commands(BY_KEY);
    assert_eq!(commands.len(), 1, "{commands:#?}");
    assert_eq!(
        shape(&commands[0]),
        "SELECT * FROM payment_attempts WHERE consumer = ? AND operation_key = ?"
    );
    assert!(shape(STORE).contains(&shape(&commands[0])));
}

#[test]
fn the_shape_ignores_parameter_names_and_layout_but_not_the_statement() {
    assert_eq!(
        shape("SELECT a\n   FROM t WHERE b = $12 AND c = :name;"),
        "SELECT a FROM t WHERE b = ? AND c = ?"
    );
    assert_eq!(shape("SELECT x::text"), "SELECT x::text");
    assert_ne!(shape("UPDATE t SET a = $1"), shape("UPDATE t SET b = :a"));
}
