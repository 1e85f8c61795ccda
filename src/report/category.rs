//! Classification of one joined row: pure, from the row, the report's instant and thresholds.

use chrono::{DateTime, Duration, Utc};

use crate::domain::{AttemptStatus, DISPUTE, SUCCEEDED_AFTER_FAILURE};

use super::model::{AttemptFacts, JoinedRow, ProviderObject, ReportRow, money};

/// Every row lands in exactly one category. Stable names: scripts match on `as_str`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Category {
    /// More than one provider object for one operation: what chargeguard exists to prevent.
    DoubleCharge,
    /// chargeguard recorded a success; the provider has no object for it.
    MissingAtProvider,
    /// A provider object no attempt claims.
    Orphan,
    /// The object's amount or currency differs from the attempt's.
    AmountMismatch,
    /// The object's status and the attempt's disagree.
    StatusMismatch,
    /// A refund we recorded succeeded that the provider does not have, or has failed.
    RefundMismatch,
    /// A provider refund of the charge that no refund attempt claims.
    OrphanRefund,
    /// The provider refunded more of the charge than the refunds we recorded succeeded.
    RefundedBeyondRecord,
    /// Pending or requires_action for longer than the report's threshold.
    StaleUnfinished,
    /// The key window passed and the provider confirmed nothing was charged: an accepted
    /// operation was never charged.
    Expired,
    /// The charge is under dispute (a dispute event flagged its attempt and the flag stands):
    /// the sides agree, but money may go back by chargeback; finance must see it.
    Disputed,
    /// Pending or requires_action, younger than the threshold: not decided yet.
    InProgress,
    /// Both sides agree.
    Matched,
}

impl Category {
    /// Discrepancies first, most severe first: the order of summaries.
    pub const ALL: [Category; 13] = [
        Category::DoubleCharge,
        Category::MissingAtProvider,
        Category::Orphan,
        Category::AmountMismatch,
        Category::StatusMismatch,
        Category::RefundMismatch,
        Category::OrphanRefund,
        Category::RefundedBeyondRecord,
        Category::StaleUnfinished,
        Category::Expired,
        Category::Disputed,
        Category::InProgress,
        Category::Matched,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Category::DoubleCharge => "double_charge",
            Category::MissingAtProvider => "missing_at_provider",
            Category::Orphan => "orphan",
            Category::AmountMismatch => "amount_mismatch",
            Category::StatusMismatch => "status_mismatch",
            Category::RefundMismatch => "refund_mismatch",
            Category::OrphanRefund => "orphan_refund",
            Category::RefundedBeyondRecord => "refunded_beyond_record",
            Category::Disputed => "disputed",
            Category::StaleUnfinished => "stale_unfinished",
            Category::Expired => "expired",
            Category::InProgress => "in_progress",
            Category::Matched => "matched",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|category| category.as_str() == value)
    }

    /// For people: what the category means.
    pub fn label(self) -> &'static str {
        match self {
            Category::DoubleCharge => {
                "more than one provider object for one operation (double charge)"
            }
            Category::MissingAtProvider => "our success with no provider object",
            Category::Orphan => "provider object with no attempt",
            Category::AmountMismatch => "amount or currency mismatch",
            Category::StatusMismatch => "status mismatch (ours vs the provider's)",
            Category::RefundMismatch => "our succeeded refund missing or failed at the provider",
            Category::OrphanRefund => "provider refund with no refund attempt",
            Category::RefundedBeyondRecord => "refunded at the provider beyond our recorded refunds",
            Category::Disputed => "charge under dispute",
            Category::StaleUnfinished => "pending or requires_action older than the threshold",
            Category::Expired => "expired: accepted, never charged",
            Category::InProgress => "pending or requires_action, within the threshold",
            Category::Matched => "matched",
        }
    }

    /// Whether the row makes the report unclean (non-zero exit).
    pub fn is_discrepancy(self) -> bool {
        match self {
            Category::Matched | Category::InProgress => false,
            Category::DoubleCharge
            | Category::MissingAtProvider
            | Category::Orphan
            | Category::AmountMismatch
            | Category::StatusMismatch
            | Category::RefundMismatch
            | Category::OrphanRefund
            | Category::RefundedBeyondRecord
            | Category::Disputed
            | Category::StaleUnfinished
            | Category::Expired => true,
        }
    }
}

/// How old an unfinished attempt may be before it is a discrepancy.
#[derive(Debug, Clone, Copy)]
pub struct Thresholds {
    pub pending_age_max: Duration,
    pub requires_action_age_max: Duration,
}

/// Classifies `row` as of `now` (the report's generation instant, so both passes agree).
pub fn classify(row: JoinedRow, now: DateTime<Utc>, thresholds: &Thresholds) -> ReportRow {
    let (category, detail) = match &row.attempt {
        None => orphan(&row.objects),
        Some(attempt) => match classify_attempt(attempt, &row, now, thresholds) {
            // The charge's sides agree: only then do its refunds and disputes speak (every
            // earlier category keeps its meaning).
            (Category::Matched, _) => refunds_and_disputes(attempt, &row.objects),
            classified => classified,
        },
    };
    ReportRow {
        seq: row.seq,
        category,
        detail,
        attempt: row.attempt,
        objects: row.objects,
        objects_total: row.objects_total,
    }
}

fn orphan(objects: &[ProviderObject]) -> (Category, String) {
    let detail = match objects.first() {
        Some(object) => format!(
            "provider object {} ({}, {}) is claimed by no attempt",
            object.id,
            object.status,
            money(&object.currency, object.amount_minor)
        ),
        None => "a row with neither an attempt nor a provider object".to_owned(),
    };
    (Category::Orphan, detail)
}

fn classify_attempt(
    attempt: &AttemptFacts,
    row: &JoinedRow,
    now: DateTime<Utc>,
    thresholds: &Thresholds,
) -> (Category, String) {
    if row.objects_total >= 2 {
        let succeeded = row
            .objects
            .iter()
            .filter(|object| object.status == "succeeded")
            .count();
        let ids: Vec<&str> = row
            .objects
            .iter()
            .map(|object| object.id.as_str())
            .collect();
        let listed = if row.objects.len() < row.objects_total as usize {
            format!(" (first {} listed)", row.objects.len())
        } else {
            String::new()
        };
        return (
            Category::DoubleCharge,
            format!(
                "{} provider objects for one operation, {succeeded} succeeded: {}{listed}",
                row.objects_total,
                ids.join(" ")
            ),
        );
    }
    if let Some(detail) = charged_across_attempts(attempt, &row.operation) {
        return (Category::DoubleCharge, detail);
    }
    let Some(object) = row.objects.first() else {
        return without_object(attempt, now, thresholds);
    };
    if object.amount_minor != attempt.amount_minor || object.currency != attempt.currency {
        return (
            Category::AmountMismatch,
            format!(
                "provider object {} is for {}, the attempt for {}",
                object.id,
                money(&object.currency, object.amount_minor),
                money(&attempt.currency, attempt.amount_minor)
            ),
        );
    }
    let stale = is_stale(attempt, now, thresholds);
    if expected_attempt_status(&object.status) != Some(attempt.status) {
        let detail = format!(
            "provider object {} is {}, the attempt is {}",
            object.id,
            object.status,
            attempt.status.as_str()
        );
        // Money taken where the consumer was told it was not (a declined intent confirmed again
        // later): a status mismatch, named so finance can find every one of them.
        if attempt.status == AttemptStatus::Failed && object.holds_money() {
            return (
                Category::StatusMismatch,
                format!(
                    "{SUCCEEDED_AFTER_FAILURE}: {detail}; the provider received {}",
                    money(&object.currency, object.amount_received_minor)
                ),
            );
        }
        // An unfinished attempt may not have recorded the provider's answer yet.
        return match (attempt.status.is_terminal(), stale) {
            (false, false) => (Category::InProgress, detail),
            _ => (Category::StatusMismatch, detail),
        };
    }
    if !attempt.status.is_terminal() {
        return unfinished(attempt, stale);
    }
    if is_expired(attempt) {
        return (
            Category::Expired,
            format!(
                "the attempt expired; provider object {} is {}",
                object.id, object.status
            ),
        );
    }
    (Category::Matched, String::new())
}

/// A succeeded attempt whose operation was charged, or may still be charged, by another
/// attempt: two succeeded attempts, or an object of an earlier attempt that is not canceled (a
/// new intent was made beside one that holds money or can still be paid). A canceled earlier
/// intent is the cancel-then-create flow of an amount change, and a re-confirmed intent belongs
/// to the latest attempt that confirmed it: neither is a second charge.
fn charged_across_attempts(attempt: &AttemptFacts, operation: &super::model::OperationFacts) -> Option<String> {
    if attempt.status != AttemptStatus::Succeeded {
        return None;
    }
    if operation.succeeded_attempts >= 2 {
        return Some(format!(
            "{} succeeded attempts for one operation ({})",
            operation.succeeded_attempts, attempt.operation_key
        ));
    }
    (operation.earlier_live_objects > 0).then(|| {
        format!(
            "the attempt succeeded while {} provider object(s) of earlier attempts of operation {} \
             are not canceled",
            operation.earlier_live_objects, attempt.operation_key
        )
    })
}

/// A matched charge's refunds and disputes: the first disagreement, most severe first, else
/// `Matched`.
fn refunds_and_disputes(attempt: &AttemptFacts, objects: &[ProviderObject]) -> (Category, String) {
    let facts = &attempt.refunds;
    let listed = |shown: usize, total: u32| match shown < total as usize {
        true => format!(" (first {shown} of {total} listed)"),
        false => String::new(),
    };
    if let Some(first) = facts.mismatches.first() {
        let provider = match &first.provider_status {
            Some(status) => format!("the provider has it {status}"),
            None => "the provider does not list it".to_owned(),
        };
        return (
            Category::RefundMismatch,
            format!(
                "refund attempt {} recorded succeeded for {} (provider refund {}), {provider}{}",
                first.attempt_id,
                money(&attempt.currency, first.amount_minor),
                first.provider_refund_id.as_deref().unwrap_or("unknown"),
                listed(facts.mismatches.len(), facts.mismatches_total)
            ),
        );
    }
    if !facts.orphans.is_empty() {
        let ids: Vec<String> = facts
            .orphans
            .iter()
            .map(|refund| {
                format!("{} ({}, {})", refund.id, refund.status, money(&attempt.currency, refund.amount_minor))
            })
            .collect();
        return (
            Category::OrphanRefund,
            format!(
                "provider refunds claimed by no refund attempt: {}{}",
                ids.join(", "),
                listed(facts.orphans.len(), facts.orphans_total)
            ),
        );
    }
    let provider_refunded: i64 = objects.iter().map(|object| object.refunded_minor).sum();
    if provider_refunded > attempt.ours_refunded_minor {
        return (
            Category::RefundedBeyondRecord,
            format!(
                "the provider refunded {}, chargeguard recorded {} of succeeded refunds",
                money(&attempt.currency, provider_refunded),
                money(&attempt.currency, attempt.ours_refunded_minor)
            ),
        );
    }
    if let Some(dispute) = disputes(attempt) {
        return (Category::Disputed, dispute);
    }
    (Category::Matched, String::new())
}

/// The dispute reasons on the attempt's standing review reason, joined; `None` without one.
/// (The provider layer lists no disputes and the payment list does not carry them: the report
/// reads what the dispute webhooks recorded on the attempt.)
fn disputes(attempt: &AttemptFacts) -> Option<String> {
    let prefix = format!("{DISPUTE}: ");
    let found: Vec<&str> = attempt
        .review_reason
        .as_deref()?
        .split("; ")
        .filter(|reason| reason.starts_with(&prefix))
        .collect();
    (!found.is_empty()).then(|| found.join("; "))
}

fn without_object(
    attempt: &AttemptFacts,
    now: DateTime<Utc>,
    thresholds: &Thresholds,
) -> (Category, String) {
    match attempt.status {
        AttemptStatus::Succeeded => (
            Category::MissingAtProvider,
            format!(
                "the attempt succeeded for {} (provider id {}), but the provider lists no object for it",
                money(&attempt.currency, attempt.amount_minor),
                attempt.provider_payment_id.as_deref().unwrap_or("unknown")
            ),
        ),
        AttemptStatus::Pending | AttemptStatus::RequiresAction => {
            unfinished(attempt, is_stale(attempt, now, thresholds))
        }
        AttemptStatus::Failed if is_expired(attempt) => (
            Category::Expired,
            "the attempt expired; the provider has no object for it".to_owned(),
        ),
        // Refused before the provider made anything (invalid request): both sides hold nothing.
        AttemptStatus::Failed => (Category::Matched, String::new()),
    }
}

fn unfinished(attempt: &AttemptFacts, stale: bool) -> (Category, String) {
    if stale {
        (
            Category::StaleUnfinished,
            format!(
                "{} since {}",
                attempt.status.as_str(),
                attempt.created_at.to_rfc3339()
            ),
        )
    } else {
        (Category::InProgress, String::new())
    }
}

fn is_expired(attempt: &AttemptFacts) -> bool {
    attempt.status == AttemptStatus::Failed && attempt.failure_code.as_deref() == Some("expired")
}

fn is_stale(attempt: &AttemptFacts, now: DateTime<Utc>, thresholds: &Thresholds) -> bool {
    let age = now - attempt.created_at;
    match attempt.status {
        AttemptStatus::Pending => age > thresholds.pending_age_max,
        AttemptStatus::RequiresAction => age > thresholds.requires_action_age_max,
        AttemptStatus::Succeeded | AttemptStatus::Failed => false,
    }
}

/// The attempt status that agrees with a provider status; `None` for statuses chargeguard
/// never asks for (requires_confirmation, requires_capture, unknown ones).
fn expected_attempt_status(provider_status: &str) -> Option<AttemptStatus> {
    match provider_status {
        "succeeded" => Some(AttemptStatus::Succeeded),
        "requires_payment_method" | "canceled" => Some(AttemptStatus::Failed),
        "requires_action" => Some(AttemptStatus::RequiresAction),
        "processing" => Some(AttemptStatus::Pending),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::AttemptId;
    use crate::report::model::{LinkedBy, OperationFacts, ProviderRefund, RefundFacts, RefundMismatch};

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-12-02T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    const THRESHOLDS: Thresholds = Thresholds {
        pending_age_max: Duration::hours(1),
        requires_action_age_max: Duration::hours(25),
    };

    fn attempt(status: AttemptStatus, age_minutes: i64) -> AttemptFacts {
        AttemptFacts {
            id: AttemptId::from_uuid(uuid::Uuid::nil()),
            consumer: "orders".into(),
            operation_key: "order-1:charge".into(),
            status,
            amount_minor: 1_000,
            currency: "usd".into(),
            provider_payment_id: Some("pi_1".into()),
            failure_code: None,
            review_reason: None,
            created_at: now() - Duration::minutes(age_minutes),
            ours_refunded_minor: 0,
            refunds: RefundFacts::default(),
        }
    }

    fn object(id: &str, status: &str) -> ProviderObject {
        ProviderObject {
            id: id.into(),
            status: status.into(),
            amount_minor: 1_000,
            amount_received_minor: if status == "succeeded" { 1_000 } else { 0 },
            currency: "usd".into(),
            created_at: now(),
            refunded_minor: 0,
            linked_by: Some(LinkedBy::Metadata),
        }
    }

    fn check(attempt: Option<AttemptFacts>, objects: Vec<ProviderObject>, expected: Category) {
        let objects_total = objects.len() as u32;
        let row = JoinedRow {
            seq: 1,
            attempt,
            objects,
            objects_total,
            operation: OperationFacts::default(),
        };
        let classified = classify(row.clone(), now(), &THRESHOLDS);
        assert_eq!(
            classified.category, expected,
            "{row:?}: {}",
            classified.detail
        );
    }

    #[test]
    fn agreement_is_matched() {
        check(
            Some(attempt(AttemptStatus::Succeeded, 5)),
            vec![object("pi_1", "succeeded")],
            Category::Matched,
        );
        check(
            Some(attempt(AttemptStatus::Failed, 5)),
            vec![object("pi_1", "requires_payment_method")],
            Category::Matched,
        );
        check(
            Some(attempt(AttemptStatus::Failed, 5)),
            vec![],
            Category::Matched,
        );
    }

    #[test]
    fn two_objects_for_one_attempt_is_a_double_charge_before_anything_else() {
        let mut other = object("pi_2", "succeeded");
        other.amount_minor = 5;
        check(
            Some(attempt(AttemptStatus::Succeeded, 5)),
            vec![object("pi_1", "succeeded"), other],
            Category::DoubleCharge,
        );
        let row = JoinedRow {
            seq: 1,
            attempt: Some(attempt(AttemptStatus::Pending, 5)),
            objects: vec![object("pi_1", "canceled")],
            objects_total: 3,
            operation: OperationFacts::default(),
        };
        let classified = classify(row, now(), &THRESHOLDS);
        assert_eq!(classified.category, Category::DoubleCharge);
        assert!(
            classified.detail.contains("first 1 listed"),
            "{}",
            classified.detail
        );
    }

    #[test]
    fn attempts_of_one_operation_charged_twice_are_a_double_charge() {
        let row = |status, operation| JoinedRow {
            seq: 1,
            attempt: Some(attempt(status, 5)),
            objects: vec![object("pi_2", "succeeded")],
            objects_total: 1,
            operation,
        };
        let classify_row = |status, operation| classify(row(status, operation), now(), &THRESHOLDS).category;
        let two_succeeded = OperationFacts { succeeded_attempts: 2, earlier_live_objects: 0 };
        assert_eq!(classify_row(AttemptStatus::Succeeded, two_succeeded), Category::DoubleCharge);
        let earlier_object = OperationFacts { succeeded_attempts: 1, earlier_live_objects: 1 };
        let classified = classify(row(AttemptStatus::Succeeded, earlier_object), now(), &THRESHOLDS);
        assert_eq!(classified.category, Category::DoubleCharge);
        assert!(classified.detail.contains("earlier attempts"), "{}", classified.detail);
        let alone = OperationFacts { succeeded_attempts: 1, earlier_live_objects: 0 };
        assert_eq!(classify_row(AttemptStatus::Succeeded, alone), Category::Matched);
    }

    #[test]
    fn amount_or_currency_differences_are_mismatches() {
        let mut more = object("pi_1", "succeeded");
        more.amount_minor = 1_500;
        check(
            Some(attempt(AttemptStatus::Succeeded, 5)),
            vec![more],
            Category::AmountMismatch,
        );
        let mut euros = object("pi_1", "succeeded");
        euros.currency = "eur".into();
        check(
            Some(attempt(AttemptStatus::Succeeded, 5)),
            vec![euros],
            Category::AmountMismatch,
        );
    }

    #[test]
    fn disagreeing_statuses_are_mismatches_once_decided_or_stale() {
        check(
            Some(attempt(AttemptStatus::Failed, 5)),
            vec![object("pi_1", "succeeded")],
            Category::StatusMismatch,
        );
        check(
            Some(attempt(AttemptStatus::Succeeded, 5)),
            vec![object("pi_1", "canceled")],
            Category::StatusMismatch,
        );
        check(
            Some(attempt(AttemptStatus::Succeeded, 5)),
            vec![object("pi_1", "requires_capture")],
            Category::StatusMismatch,
        );
        // Not recorded yet: in flight while young, a mismatch when old.
        check(
            Some(attempt(AttemptStatus::Pending, 5)),
            vec![object("pi_1", "succeeded")],
            Category::InProgress,
        );
        check(
            Some(attempt(AttemptStatus::Pending, 61)),
            vec![object("pi_1", "succeeded")],
            Category::StatusMismatch,
        );
    }

    #[test]
    fn our_success_without_an_object_is_missing_and_an_object_without_attempt_is_an_orphan() {
        check(
            Some(attempt(AttemptStatus::Succeeded, 5)),
            vec![],
            Category::MissingAtProvider,
        );
        check(None, vec![object("pi_9", "succeeded")], Category::Orphan);
    }

    #[test]
    fn unfinished_attempts_are_stale_past_their_threshold() {
        check(
            Some(attempt(AttemptStatus::Pending, 59)),
            vec![],
            Category::InProgress,
        );
        check(
            Some(attempt(AttemptStatus::Pending, 61)),
            vec![],
            Category::StaleUnfinished,
        );
        check(
            Some(attempt(AttemptStatus::Pending, 61)),
            vec![object("pi_1", "processing")],
            Category::StaleUnfinished,
        );
        check(
            Some(attempt(AttemptStatus::RequiresAction, 24 * 60)),
            vec![object("pi_1", "requires_action")],
            Category::InProgress,
        );
        check(
            Some(attempt(AttemptStatus::RequiresAction, 26 * 60)),
            vec![],
            Category::StaleUnfinished,
        );
    }

    #[test]
    fn expired_attempts_are_their_own_category() {
        let mut expired = attempt(AttemptStatus::Failed, 2 * 24 * 60);
        expired.failure_code = Some("expired".into());
        check(Some(expired.clone()), vec![], Category::Expired);
        check(
            Some(expired.clone()),
            vec![object("pi_1", "canceled")],
            Category::Expired,
        );
        // Money the provider holds outranks our belief that nothing happened.
        check(
            Some(expired),
            vec![object("pi_1", "succeeded")],
            Category::StatusMismatch,
        );
    }

    #[test]
    fn a_failed_attempt_whose_object_holds_money_is_named_succeeded_after_failure() {
        let row = |status: &str| JoinedRow {
            seq: 1,
            attempt: Some(attempt(AttemptStatus::Failed, 5)),
            objects: vec![object("pi_1", status)],
            objects_total: 1,
            operation: OperationFacts::default(),
        };
        let paid = classify(row("succeeded"), now(), &THRESHOLDS);
        assert_eq!(paid.category, Category::StatusMismatch);
        assert!(
            paid.detail.starts_with("succeeded_after_failure: provider object pi_1 is succeeded")
                && paid.detail.contains("received 10.00 usd"),
            "{}",
            paid.detail
        );
        let canceled = classify(row("canceled"), now(), &THRESHOLDS);
        assert_eq!(canceled.category, Category::Matched);
        let mismatch = classify(
            JoinedRow {
                seq: 1,
                attempt: Some(attempt(AttemptStatus::Succeeded, 5)),
                objects: vec![object("pi_1", "canceled")],
                objects_total: 1,
                operation: OperationFacts::default(),
            },
            now(),
            &THRESHOLDS,
        );
        assert!(!mismatch.detail.contains("succeeded_after_failure"), "{}", mismatch.detail);
    }

    #[test]
    fn only_matched_and_in_progress_are_clean_and_names_round_trip() {
        for category in Category::ALL {
            assert_eq!(Category::parse(category.as_str()), Some(category));
            let clean = matches!(category, Category::Matched | Category::InProgress);
            assert_eq!(category.is_discrepancy(), !clean, "{category:?}");
        }
    }

    fn refunded(mut object: ProviderObject, refunded_minor: i64) -> ProviderObject {
        object.refunded_minor = refunded_minor;
        object
    }

    fn classify_one(attempt: AttemptFacts, objects: Vec<ProviderObject>) -> ReportRow {
        let objects_total = objects.len() as u32;
        classify(JoinedRow { seq: 1, attempt: Some(attempt), objects, objects_total, operation: OperationFacts::default() }, now(), &THRESHOLDS)
    }

    #[test]
    fn refunds_recorded_as_the_provider_has_them_are_matched() {
        let mut charge = attempt(AttemptStatus::Succeeded, 5);
        charge.ours_refunded_minor = 400;
        check(Some(charge), vec![refunded(object("pi_1", "succeeded"), 400)], Category::Matched);
    }

    #[test]
    fn a_provider_refund_beyond_our_record_is_named_with_both_sums() {
        let mut charge = attempt(AttemptStatus::Succeeded, 5);
        charge.ours_refunded_minor = 400;
        let row = classify_one(charge, vec![refunded(object("pi_1", "succeeded"), 1_000)]);
        assert_eq!(row.category, Category::RefundedBeyondRecord);
        assert!(row.detail.contains("refunded 10.00 usd") && row.detail.contains("recorded 4.00 usd"), "{}", row.detail);
    }

    #[test]
    fn an_orphan_refund_outranks_the_sum_and_a_mismatch_outranks_both() {
        let mut charge = attempt(AttemptStatus::Succeeded, 5);
        charge.refunds.orphans = vec![ProviderRefund { id: "re_9".into(), status: "succeeded".into(), amount_minor: 300 }];
        charge.refunds.orphans_total = 2;
        let row = classify_one(charge.clone(), vec![refunded(object("pi_1", "succeeded"), 300)]);
        assert_eq!(row.category, Category::OrphanRefund);
        assert!(row.detail.contains("re_9 (succeeded, 3.00 usd)") && row.detail.contains("first 1 of 2"), "{}", row.detail);

        charge.refunds.mismatches = vec![RefundMismatch {
            attempt_id: "a-1".into(),
            provider_refund_id: Some("re_1".into()),
            amount_minor: 400,
            provider_status: Some("failed".into()),
        }];
        charge.refunds.mismatches_total = 1;
        let row = classify_one(charge.clone(), vec![object("pi_1", "succeeded")]);
        assert_eq!(row.category, Category::RefundMismatch);
        assert!(row.detail.contains("re_1") && row.detail.contains("has it failed"), "{}", row.detail);
        charge.refunds.mismatches[0].provider_status = None;
        let row = classify_one(charge, vec![object("pi_1", "succeeded")]);
        assert!(row.detail.contains("does not list it"), "{}", row.detail);
    }

    #[test]
    fn a_dispute_reason_makes_a_matched_charge_disputed_and_nothing_else() {
        let mut charge = attempt(AttemptStatus::Succeeded, 5);
        charge.review_reason = Some("amount differs; dispute: dp_1 on charge ch_1 is needs_response: reason fraudulent, 10.00 usd".into());
        let row = classify_one(charge.clone(), vec![object("pi_1", "succeeded")]);
        assert_eq!(row.category, Category::Disputed);
        assert_eq!(row.detail, "dispute: dp_1 on charge ch_1 is needs_response: reason fraudulent, 10.00 usd");
        // Earlier categories keep their meaning: a disputed double charge is a double charge.
        check(
            Some(charge),
            vec![object("pi_1", "succeeded"), object("pi_2", "succeeded")],
            Category::DoubleCharge,
        );
        let mut other = attempt(AttemptStatus::Succeeded, 5);
        other.review_reason = Some("second provider object: not a dispute".into());
        check(Some(other), vec![object("pi_1", "succeeded")], Category::Matched);
    }
}
