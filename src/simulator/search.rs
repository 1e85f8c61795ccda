//! A subset of Stripe's search query language for payment intents: clauses
//! `metadata['key']:'value'`, `status:'succeeded'`, `currency:'usd'`, `amount>1000`,
//! `created>=1700000000`, optionally negated with `-`, joined by all-`AND` or all-`OR`.

use super::model::PaymentIntent;

/// Longest query accepted (Stripe's limit is higher; ours is a bound, not a feature).
pub const QUERY_LENGTH_MAX: usize = 1_000;
/// Most clauses in one query (Stripe allows 10).
const CLAUSES_MAX: usize = 10;

#[derive(Debug, Clone, PartialEq)]
enum Field {
    Metadata(String),
    Status,
    Currency,
    Amount,
    Created,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    Equals,
    Greater,
    GreaterOrEqual,
    Less,
    LessOrEqual,
}

#[derive(Debug, Clone, PartialEq)]
enum Value {
    Text(String),
    Number(i64),
}

#[derive(Debug, Clone, PartialEq)]
struct Clause {
    negated: bool,
    field: Field,
    op: Op,
    value: Value,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    clauses: Vec<Clause>,
    any: bool,
}

impl Query {
    pub fn parse(input: &str) -> Result<Self, String> {
        let input = input.trim();
        if input.is_empty() {
            return Err("the query is empty".into());
        }
        if input.len() > QUERY_LENGTH_MAX {
            return Err(format!(
                "the query is longer than {QUERY_LENGTH_MAX} characters"
            ));
        }
        let mut clauses = Vec::new();
        let mut joiner: Option<&str> = None;
        let mut rest = input;
        loop {
            let (clause, after) = parse_clause(rest)?;
            clauses.push(clause);
            if clauses.len() > CLAUSES_MAX {
                return Err(format!("a query has at most {CLAUSES_MAX} clauses"));
            }
            let after = after.trim_start();
            if after.is_empty() {
                break;
            }
            let (word, tail) = after
                .split_once(char::is_whitespace)
                .ok_or("expected AND or OR")?;
            if word != "AND" && word != "OR" {
                return Err(format!("expected AND or OR, found {word:?}"));
            }
            if joiner.is_some_and(|seen| seen != word) {
                return Err("AND and OR cannot be mixed in one query".into());
            }
            joiner = Some(if word == "AND" { "AND" } else { "OR" });
            rest = tail.trim_start();
        }
        Ok(Self {
            clauses,
            any: joiner == Some("OR"),
        })
    }

    pub fn matches(&self, intent: &PaymentIntent) -> bool {
        let mut results = self.clauses.iter().map(|clause| clause.matches(intent));
        if self.any {
            results.any(|hit| hit)
        } else {
            results.all(|hit| hit)
        }
    }
}

impl Clause {
    fn matches(&self, intent: &PaymentIntent) -> bool {
        let hit = match (&self.field, &self.value) {
            (Field::Metadata(key), Value::Text(text)) => intent.metadata.get(key) == Some(text),
            (Field::Status, Value::Text(text)) => intent.status.as_str() == text,
            (Field::Currency, Value::Text(text)) => intent.currency.eq_ignore_ascii_case(text),
            (Field::Amount, Value::Number(number)) => compare(intent.amount, self.op, *number),
            (Field::Created, Value::Number(number)) => compare(intent.created, self.op, *number),
            _ => false,
        };
        hit != self.negated
    }
}

fn compare(actual: i64, op: Op, expected: i64) -> bool {
    match op {
        Op::Equals => actual == expected,
        Op::Greater => actual > expected,
        Op::GreaterOrEqual => actual >= expected,
        Op::Less => actual < expected,
        Op::LessOrEqual => actual <= expected,
    }
}

fn parse_clause(input: &str) -> Result<(Clause, &str), String> {
    let (negated, input) = match input.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, input),
    };
    let (field, rest) = if let Some(rest) = input.strip_prefix("metadata[") {
        let (key, rest) = parse_quoted(rest)?;
        let rest = rest
            .strip_prefix(']')
            .ok_or("expected ] after the metadata key")?;
        (Field::Metadata(key), rest)
    } else {
        let end = input
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(input.len());
        let field = match &input[..end] {
            "status" => Field::Status,
            "currency" => Field::Currency,
            "amount" => Field::Amount,
            "created" => Field::Created,
            other => return Err(format!("unsupported search field {other:?}")),
        };
        (field, &input[end..])
    };
    let (op, rest) = [
        (">=", Op::GreaterOrEqual),
        ("<=", Op::LessOrEqual),
        (">", Op::Greater),
        ("<", Op::Less),
        (":", Op::Equals),
    ]
    .into_iter()
    .find_map(|(token, op)| rest.strip_prefix(token).map(|rest| (op, rest)))
    .ok_or("expected one of : > < >= <= after the field")?;
    let numeric = matches!(field, Field::Amount | Field::Created);
    let (value, rest) = if numeric {
        let rest = rest.trim_start_matches(['\'', '"']);
        let end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '-'))
            .unwrap_or(rest.len());
        let number = rest[..end]
            .parse::<i64>()
            .map_err(|_| "expected a number")?;
        (
            Value::Number(number),
            rest[end..].trim_start_matches(['\'', '"']),
        )
    } else {
        if op != Op::Equals {
            return Err("text fields only support ':'".into());
        }
        let (text, rest) = parse_quoted(rest)?;
        (Value::Text(text), rest)
    };
    Ok((
        Clause {
            negated,
            field,
            op,
            value,
        },
        rest,
    ))
}

/// `'text'` or `"text"` with `\` escaping the quote.
fn parse_quoted(input: &str) -> Result<(String, &str), String> {
    let quote = input
        .chars()
        .next()
        .filter(|c| *c == '\'' || *c == '"')
        .ok_or("expected a quoted value")?;
    let mut text = String::new();
    let mut chars = input[1..].char_indices();
    while let Some((index, c)) = chars.next() {
        match c {
            '\\' => text.push(
                chars
                    .next()
                    .map(|(_, escaped)| escaped)
                    .ok_or("unterminated escape")?,
            ),
            c if c == quote => return Ok((text, &input[1 + index + 1..])),
            c => text.push(c),
        }
    }
    Err("unterminated quoted value".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_supported_forms() {
        let query =
            Query::parse(r#"metadata['attempt']:'a 1' AND -status:"canceled" AND amount>=100"#)
                .unwrap();
        assert_eq!(query.clauses.len(), 3);
        assert!(!query.any);
        assert_eq!(query.clauses[0].field, Field::Metadata("attempt".into()));
        assert_eq!(query.clauses[0].value, Value::Text("a 1".into()));
        assert!(query.clauses[1].negated);
        assert_eq!(query.clauses[2].op, Op::GreaterOrEqual);
        assert!(
            Query::parse("status:'succeeded' OR status:'processing'")
                .unwrap()
                .any
        );
    }

    #[test]
    fn rejects_what_it_does_not_understand() {
        for input in [
            "",
            "customer:'x'",
            "metadata['a':'b'",
            "status:'a' AND status:'b' OR status:'c'",
            "status>'a'",
            "status:'a' status:'b'",
            "amount:abc",
        ] {
            assert!(Query::parse(input).is_err(), "{input}");
        }
    }
}
