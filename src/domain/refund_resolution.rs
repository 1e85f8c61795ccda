//! What a refund attempt becomes given the provider's refund object (Stripe's lifecycle:
//! `pending` → `succeeded` | `failed` | `canceled`, and `requires_action` for some methods).

use super::{AttemptStatus, ChargeParams, Failure, RefundSnapshot, RefundStatus, Resolution};

/// A provider refund that failed or was canceled returned nothing: the attempt fails with the
/// provider's reason (`failure_reason`, or `canceled`). A pending one stays pending with the
/// object known, so recovery retrieves it later instead of creating again.
pub fn resolve_refund_snapshot(snapshot: &RefundSnapshot, requested: &ChargeParams) -> Resolution {
    let mut resolution = match snapshot.refund_status() {
        RefundStatus::Succeeded => Resolution::plain(AttemptStatus::Succeeded),
        RefundStatus::Pending => Resolution::plain(AttemptStatus::Pending),
        RefundStatus::RequiresAction => Resolution::plain(AttemptStatus::RequiresAction),
        RefundStatus::Failed => Resolution {
            failure: Some(Failure {
                code: snapshot.failure_reason.clone().unwrap_or_else(|| "refund_failed".to_owned()),
                message: format!("the provider failed refund {}", snapshot.id),
            }),
            ..Resolution::plain(AttemptStatus::Failed)
        },
        RefundStatus::Canceled => Resolution {
            failure: Some(Failure {
                code: snapshot.failure_reason.clone().unwrap_or_else(|| "canceled".to_owned()),
                message: format!("refund {} was canceled at the provider", snapshot.id),
            }),
            ..Resolution::plain(AttemptStatus::Failed)
        },
        RefundStatus::Other(name) => Resolution {
            review_reason: Some(format!("provider refund {} {} {name:?}", snapshot.id, super::review::UNEXPECTED_STATUS)),
            ..Resolution::plain(AttemptStatus::Pending)
        },
    };
    resolution.flag_other_amount("provider refund", &snapshot.id, snapshot.amount_minor, &snapshot.currency, requested);
    resolution
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn snapshot(status: &str, failure_reason: Option<&str>, amount_minor: i64) -> RefundSnapshot {
        RefundSnapshot {
            id: "re_1".to_owned(),
            payment_id: Some("pi_1".to_owned()),
            status: status.to_owned(),
            amount_minor,
            currency: "usd".to_owned(),
            created: chrono::DateTime::<chrono::Utc>::MIN_UTC,
            metadata: BTreeMap::new(),
            failure_reason: failure_reason.map(str::to_owned),
        }
    }

    fn params() -> ChargeParams {
        crate::domain::fixtures::pending_attempt(chrono::Utc::now()).params
    }

    #[test]
    fn stripe_refund_statuses_map_to_attempt_states() {
        let status = |name, reason| resolve_refund_snapshot(&snapshot(name, reason, 1_000), &params());
        assert_eq!(status("succeeded", None).status, AttemptStatus::Succeeded);
        assert_eq!(status("pending", None).status, AttemptStatus::Pending);
        assert_eq!(status("requires_action", None).status, AttemptStatus::RequiresAction);
        let failed = status("failed", Some("expired_or_canceled_card"));
        assert_eq!((failed.status, failed.failure.unwrap().code.as_str()), (AttemptStatus::Failed, "expired_or_canceled_card"));
        let canceled = status("canceled", None);
        assert_eq!((canceled.status, canceled.failure.unwrap().code.as_str()), (AttemptStatus::Failed, "canceled"));
        let odd = status("reversed", None);
        assert_eq!(odd.status, AttemptStatus::Pending);
        assert!(odd.review_reason.unwrap().contains("reversed"));
    }

    #[test]
    fn a_refund_of_another_amount_is_flagged() {
        let resolution = resolve_refund_snapshot(&snapshot("succeeded", None, 999), &params());
        assert_eq!(resolution.status, AttemptStatus::Succeeded);
        assert!(resolution.review_reason.unwrap().contains("999"));
    }
}
