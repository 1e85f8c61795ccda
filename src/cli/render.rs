//! What the CLI prints: a table for people, JSON (`--json`) for scripts, and errors with their
//! gRPC status, message and `chargeguard-error-code`. Text from the server is printed with
//! control characters replaced, so a stored description cannot drive the terminal.

use serde_json::{Value, json};

use super::connect::ClientError;
use crate::grpc::proto;
use crate::grpc::{ATTEMPT_ID_METADATA, ERROR_CODE_METADATA};

/// A `Charge` or `Refund` answer: its outcome and the attempt.
pub fn outcome(outcome: i32, attempt: Option<&proto::Attempt>, json: bool) -> String {
    let outcome = outcome_name(outcome);
    if json {
        let attempt = attempt.map(attempt_json).unwrap_or(Value::Null);
        return pretty(&json!({ "outcome": outcome, "attempt": attempt }));
    }
    let mut rows = vec![("outcome", outcome)];
    if let Some(attempt) = attempt {
        rows.extend(attempt_rows(attempt));
    }
    key_value_table(&rows)
}

pub fn attempt(attempt: &proto::Attempt, json: bool) -> String {
    if json {
        return pretty(&attempt_json(attempt));
    }
    key_value_table(&attempt_rows(attempt))
}

pub fn list(response: &proto::ListAttemptsResponse, json: bool) -> String {
    if json {
        let attempts: Vec<Value> = response.attempts.iter().map(attempt_json).collect();
        return pretty(
            &json!({ "attempts": attempts, "next_page_token": response.next_page_token }),
        );
    }
    let header = [
        "ATTEMPT ID",
        "OPERATION KEY",
        "ATTEMPT",
        "KIND",
        "STATUS",
        "AMOUNT",
        "REFUNDED",
        "CREATED AT",
        "PROVIDER ID",
    ];
    let rows: Vec<[String; 9]> = response
        .attempts
        .iter()
        .map(|attempt| {
            [
                attempt.attempt_id.clone(),
                attempt.operation_key.clone(),
                attempt.attempt_number.to_string(),
                kind_name(attempt.kind),
                status_name(attempt.status),
                format!("{} {}", attempt.amount_minor, attempt.currency),
                refunded_cell(attempt),
                attempt.created_at.as_ref().map(rfc3339).unwrap_or_default(),
                attempt.provider_payment_id.clone(),
            ]
        })
        .collect();
    let mut out = columns(&header, &rows);
    if rows.is_empty() {
        out.push_str("(no attempts)\n");
    }
    if !response.next_page_token.is_empty() {
        out.push_str(&format!(
            "next page: --page-token {}\n",
            printable(&response.next_page_token)
        ));
    }
    out.trim_end().to_owned()
}

pub fn error(error: &ClientError) -> String {
    let ClientError::Status(status) = error else {
        let hint = if error.is_retryable() {
            "\n  retry: safe, the same command may be sent again"
        } else {
            ""
        };
        return format!("error: {}{hint}", printable(&error.to_string()));
    };
    let mut out = format!(
        "error: {}: {}",
        // The status names grpcurl and the gRPC documentation use.
        crate::grpc::code_name(status.code()).to_ascii_uppercase(),
        printable(status.message())
    );
    for key in [ERROR_CODE_METADATA, ATTEMPT_ID_METADATA] {
        if let Some(value) = status
            .metadata()
            .get(key)
            .and_then(|value| value.to_str().ok())
        {
            out.push_str(&format!("\n  {key}: {}", printable(value)));
        }
    }
    if error.is_retryable() {
        out.push_str("\n  retry: safe, the same command may be sent again");
    }
    out
}

fn attempt_rows(attempt: &proto::Attempt) -> Vec<(&'static str, String)> {
    let mut rows = vec![
        ("attempt_id", attempt.attempt_id.clone()),
        ("operation_key", attempt.operation_key.clone()),
        ("attempt_number", attempt.attempt_number.to_string()),
        ("consumer", attempt.consumer.clone()),
        ("kind", kind_name(attempt.kind)),
        ("refund_of", attempt.parent_attempt_id.clone()),
        ("refund_reason", attempt.refund_reason.clone()),
        ("status", status_name(attempt.status)),
        (
            "amount",
            format!(
                "{} {} (minor units)",
                attempt.amount_minor, attempt.currency
            ),
        ),
        ("refunded", refunded_cell(attempt)),
        ("payment_method", attempt.payment_method.clone()),
        ("customer", attempt.customer.clone().unwrap_or_default()),
        (
            "description",
            attempt.description.clone().unwrap_or_default(),
        ),
        ("provider", attempt.provider.clone()),
        ("provider_payment_id", attempt.provider_payment_id.clone()),
        ("provider_status", attempt.provider_status.clone()),
        ("failure_code", attempt.failure_code.clone()),
        ("failure_message", attempt.failure_message.clone()),
        (
            "next_action",
            attempt
                .next_action
                .as_ref()
                .map(|a| format!("{} {}", a.r#type, a.redirect_url))
                .unwrap_or_default(),
        ),
        ("review_reason", attempt.review_reason.clone()),
        ("idempotency_key", attempt.idempotency_key.clone()),
        ("provider_calls", attempt.provider_calls.to_string()),
        (
            "created_at",
            attempt.created_at.as_ref().map(rfc3339).unwrap_or_default(),
        ),
        (
            "updated_at",
            attempt.updated_at.as_ref().map(rfc3339).unwrap_or_default(),
        ),
    ];
    let mut metadata: Vec<_> = attempt.metadata.iter().collect();
    metadata.sort();
    rows.extend(
        metadata
            .into_iter()
            .map(|(key, value)| ("metadata", format!("{key}={value}"))),
    );
    rows.retain(|(_, value)| !value.trim().is_empty());
    rows
}

fn attempt_json(attempt: &proto::Attempt) -> Value {
    json!({
        "attempt_id": attempt.attempt_id,
        "consumer": attempt.consumer,
        "operation_key": attempt.operation_key,
        "kind": kind_name(attempt.kind),
        "parent_attempt_id": non_empty(&attempt.parent_attempt_id),
        "refund_reason": non_empty(&attempt.refund_reason),
        "refunded_minor": attempt.refunded_minor,
        "refund_pending_minor": attempt.refund_pending_minor,
        "status": status_name(attempt.status),
        "amount_minor": attempt.amount_minor,
        "currency": attempt.currency,
        "payment_method": attempt.payment_method,
        "customer": attempt.customer,
        "description": attempt.description,
        "metadata": attempt.metadata,
        "provider": attempt.provider,
        "provider_payment_id": non_empty(&attempt.provider_payment_id),
        "provider_status": non_empty(&attempt.provider_status),
        "failure_code": non_empty(&attempt.failure_code),
        "failure_message": non_empty(&attempt.failure_message),
        "next_action": attempt.next_action.as_ref().map(|action| json!({
            "type": action.r#type,
            "redirect_url": non_empty(&action.redirect_url),
        })),
        "needs_review": attempt.needs_review,
        "review_reason": non_empty(&attempt.review_reason),
        "idempotency_key": attempt.idempotency_key,
        "attempt_number": attempt.attempt_number,
        "generation": attempt.generation,
        "provider_calls": attempt.provider_calls,
        "created_at": attempt.created_at.as_ref().map(rfc3339),
        "updated_at": attempt.updated_at.as_ref().map(rfc3339),
    })
}

fn non_empty(value: &str) -> Option<&str> {
    (!value.is_empty()).then_some(value)
}

fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).expect("a JSON value always serializes")
}

/// `succeeded` for `ATTEMPT_STATUS_SUCCEEDED`; the number for a value this client does not know.
fn status_name(status: i32) -> String {
    match proto::AttemptStatus::try_from(status) {
        Ok(status) => short_name(status.as_str_name(), "ATTEMPT_STATUS_"),
        Err(_) => format!("unknown({status})"),
    }
}

fn kind_name(kind: i32) -> String {
    match proto::AttemptKind::try_from(kind) {
        Ok(kind) => short_name(kind.as_str_name(), "ATTEMPT_KIND_"),
        Err(_) => format!("unknown({kind})"),
    }
}

/// A charge's refunds, `250 (+100 pending)`; empty for refunds and unrefunded charges.
fn refunded_cell(attempt: &proto::Attempt) -> String {
    match (attempt.refunded_minor, attempt.refund_pending_minor) {
        (0, 0) => String::new(),
        (refunded, 0) => refunded.to_string(),
        (refunded, pending) => format!("{refunded} (+{pending} pending)"),
    }
}

fn outcome_name(outcome: i32) -> String {
    match proto::ChargeOutcome::try_from(outcome) {
        Ok(outcome) => short_name(outcome.as_str_name(), "CHARGE_OUTCOME_"),
        Err(_) => format!("unknown({outcome})"),
    }
}

fn short_name(name: &str, prefix: &str) -> String {
    name.strip_prefix(prefix)
        .unwrap_or(name)
        .to_ascii_lowercase()
}

fn rfc3339(timestamp: &prost_types::Timestamp) -> String {
    u32::try_from(timestamp.nanos)
        .ok()
        .and_then(|nanos| chrono::DateTime::from_timestamp(timestamp.seconds, nanos))
        .map(|instant| instant.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_else(|| format!("{}s", timestamp.seconds))
}

fn printable(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { '\u{fffd}' } else { c })
        .collect()
}

fn key_value_table(rows: &[(&str, String)]) -> String {
    let width = rows.iter().map(|(key, _)| key.len()).max().unwrap_or(0);
    rows.iter()
        .map(|(key, value)| format!("{key:<width$}  {}", printable(value)))
        .collect::<Vec<_>>()
        .join("\n")
}

fn columns<const N: usize>(header: &[&str; N], rows: &[[String; N]]) -> String {
    let mut widths = header.map(str::len);
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(printable(cell).chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        format!("{}\n", padded.join("  ").trim_end())
    };
    let mut out = line(header.iter().map(|h| (*h).to_owned()).collect());
    for row in rows {
        out.push_str(&line(row.iter().map(|cell| printable(cell)).collect()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_names_status_code_and_retry() {
        let mut status = Status::unavailable("attempt x is pending");
        status
            .metadata_mut()
            .insert(ERROR_CODE_METADATA, "outcome_unknown".parse().unwrap());
        let text = error(&ClientError::Status(status));
        assert!(
            text.starts_with("error: UNAVAILABLE: attempt x is pending"),
            "{text}"
        );
        assert!(
            text.contains("chargeguard-error-code: outcome_unknown"),
            "{text}"
        );
        assert!(text.contains("retry: safe"), "{text}");
    }

    #[test]
    fn control_characters_from_the_server_are_not_printed() {
        let attempt = proto::Attempt {
            description: Some("evil\u{1b}[2Jtext".to_owned()),
            ..Default::default()
        };
        let table = super::attempt(&attempt, false);
        assert!(!table.contains('\u{1b}'), "{table:?}");
    }

    use tonic::Status;
}
