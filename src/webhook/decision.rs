//! What one event means for chargeguard's records, decided from the event and the attempt it
//! names. Pure: the worker reads, this decides, the store writes (with the database's own
//! monotonic guard, so a decision made on a stale read cannot move a row backwards).

use crate::domain::{
    Attempt, AttemptKind, PaymentSnapshot, ProviderPaymentStatus, dispute_reason,
    resolve_refund_snapshot, resolve_snapshot, succeeded_after_failure_reason,
};
use crate::store::inbox::{InboxOutcome, PaymentUpdate, RefundUpdate, Settlement};
use crate::domain::review;

use super::event::{DisputeFacts, EventError, RefundSubject};

/// The settlement of an event whose object could not be read.
pub fn unreadable(error: &EventError) -> Settlement {
    Settlement::Record {
        outcome: InboxOutcome::Unreadable,
        detail: Some(error.to_string()),
    }
}

/// The settlement of an event about an object chargeguard keeps no record of.
pub fn untracked(event_type: &str) -> Settlement {
    Settlement::Record {
        outcome: InboxOutcome::UnknownObject,
        detail: Some(format!(
            "chargeguard keeps no records for {event_type} events"
        )),
    }
}

/// The settlement of a payment event, given the attempt found for its object (by provider id,
/// else by the attempt id in its metadata).
pub fn for_payment(
    event_id: &str,
    snapshot: &PaymentSnapshot,
    attempt: Option<&Attempt>,
) -> Settlement {
    let Some(attempt) = attempt else {
        return Settlement::Record {
            outcome: InboxOutcome::UnknownObject,
            detail: Some(format!("no attempt for provider object {}", snapshot.id)),
        };
    };
    if let Some(adopted) = attempt
        .provider_payment_id
        .as_deref()
        .filter(|adopted| *adopted != snapshot.id)
    {
        // Two provider objects for one attempt: whatever this one is, a person must look; the
        // attempt keeps the object it adopted.
        let prefix = if snapshot.status == ProviderPaymentStatus::Succeeded {
            review::DOUBLE_CHARGE
        } else {
            review::SECOND_PROVIDER_OBJECT
        };
        return Settlement::Flag {
            attempt_id: attempt.id,
            review_reason: format!(
                "{prefix}: event {event_id} reports provider object {} ({}) for attempt {}, which adopted {adopted}",
                snapshot.id,
                snapshot.status.as_str(),
                attempt.id
            ),
        };
    }
    if awaits_own_confirm(attempt, snapshot) {
        return Settlement::Record {
            outcome: InboxOutcome::Stale,
            detail: Some(format!(
                "provider object {} waits for a payment method: an earlier attempt's decline, or this \
                 attempt's own, which its round records; attempt {} confirms it again and is not moved",
                snapshot.id, attempt.id
            )),
        };
    }
    let resolution = resolve_snapshot(snapshot, &attempt.params);
    Settlement::Apply(PaymentUpdate {
        attempt_id: attempt.id,
        provider_payment_id: snapshot.id.clone(),
        provider_status: snapshot.status.as_str().to_owned(),
        status: resolution.status,
        failure: resolution.failure,
        next_action: resolution.next_action,
        review_reason: resolution.review_reason,
        // Whatever the attempt looked like when read: the database decides whether it is
        // failed, in the same transaction that refuses the move.
        review_reason_if_failed: succeeded_after_failure_reason(snapshot),
    })
}

/// An attempt that confirms an earlier attempt's intent again (issue 16) and has no answer
/// recorded yet, shown that intent waiting for a payment method: the event is older news (the
/// earlier attempt's decline arriving late) or this attempt's own decline, which its round
/// records from the confirm's answer or a read of the intent. Either way the event cannot show
/// that *this* attempt failed, so it must not move it.
fn awaits_own_confirm(attempt: &Attempt, snapshot: &PaymentSnapshot) -> bool {
    attempt.provider_payment_id.is_none()
        && attempt.confirms_payment_id.as_deref() == Some(snapshot.id.as_str())
        && snapshot.status == ProviderPaymentStatus::RequiresPaymentMethod
}

/// The update one provider refund asks of its refund attempt, or the settlement that replaces
/// it (no attempt; an attempt bound to another refund; a status we cannot read).
fn refund_update(
    event_id: &str,
    subject: &RefundSubject,
    attempt: Option<&Attempt>,
) -> Result<RefundUpdate, Box<Settlement>> {
    let refund = &subject.snapshot;
    let Some(attempt) = attempt.filter(|attempt| attempt.kind == AttemptKind::Refund) else {
        return Err(Box::new(Settlement::Record {
            outcome: InboxOutcome::UnknownObject,
            detail: Some(format!("no refund attempt for provider refund {}", refund.id)),
        }));
    };
    if let Some(bound) = attempt
        .provider_payment_id
        .as_deref()
        .filter(|bound| *bound != refund.id)
    {
        return Err(Box::new(Settlement::Flag {
            attempt_id: attempt.id,
            review_reason: format!(
                "{}: event {event_id} reports refund {} ({}) for refund attempt {}, which recorded {bound}",
                review::SECOND_PROVIDER_REFUND, refund.id, refund.status, attempt.id
            ),
        }));
    }
    // Read exactly as a refund round reads the provider's answer.
    let resolution = resolve_refund_snapshot(refund, &attempt.params);
    Ok(RefundUpdate {
        attempt_id: attempt.id,
        provider_refund_id: refund.id.clone(),
        provider_status: refund.status.clone(),
        status: resolution.status,
        failure: resolution.failure,
        review_reason: resolution.review_reason,
    })
}

/// The settlement of a refund event, given the attempt found for its refund (by refund id, else
/// by the attempt id in its metadata).
pub fn for_refund(event_id: &str, subject: &RefundSubject, attempt: Option<&Attempt>) -> Settlement {
    match refund_update(event_id, subject, attempt) {
        Ok(update) => Settlement::Refunds(vec![update]),
        Err(settlement) => *settlement,
    }
}

/// The settlement of `charge.refunded`: each listed refund with the attempt found for it. A
/// payload without a refunds list (current API versions) is only recorded: its refunds settle
/// through their own `refund.*` events.
pub fn for_charge_refunded(
    event_id: &str,
    charge_id: &str,
    charge_attempt: Option<&Attempt>,
    refunds: &[(RefundSubject, Option<Attempt>)],
) -> Settlement {
    let updates: Vec<RefundUpdate> = refunds
        .iter()
        .filter_map(|(subject, attempt)| refund_update(event_id, subject, attempt.as_ref()).ok())
        .collect();
    if !updates.is_empty() {
        return Settlement::Refunds(updates);
    }
    match (refunds.is_empty(), charge_attempt) {
        // Nothing to apply here: the refunds of a charge we made settle by their own events.
        (true, Some(_)) => Settlement::Record {
            outcome: InboxOutcome::Stale,
            detail: Some(format!(
                "charge {charge_id} lists no refunds; its refunds settle by their own refund events"
            )),
        },
        (true, None) => Settlement::Record {
            outcome: InboxOutcome::UnknownObject,
            detail: Some(format!("no charge attempt for charge {charge_id}")),
        },
        (false, _) => Settlement::Record {
            outcome: InboxOutcome::UnknownObject,
            detail: Some(format!(
                "no refund attempt for the {} refunds of charge {charge_id}",
                refunds.len()
            )),
        },
    }
}

/// The settlement of a dispute event, given the charge attempt of the disputed payment: the
/// attempt is flagged with the dispute named, its state untouched (no dispute workflow).
pub fn for_dispute(dispute: &DisputeFacts, attempt: Option<&Attempt>) -> Settlement {
    let Some(attempt) = attempt.filter(|attempt| attempt.kind == AttemptKind::Charge) else {
        return Settlement::Record {
            outcome: InboxOutcome::UnknownObject,
            detail: Some(format!(
                "no charge attempt for dispute {} (payment {})",
                dispute.id,
                dispute.payment_intent.as_deref().unwrap_or("unknown")
            )),
        };
    };
    Settlement::Dispute {
        attempt_id: attempt.id,
        review_reason: dispute_reason(
            &dispute.id,
            dispute.charge.as_deref(),
            &dispute.reason,
            dispute.amount_minor,
            &dispute.currency,
            &dispute.status,
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use chrono::{TimeZone, Utc};

    use super::*;
    use crate::domain::{AttemptKind, AttemptStatus};

    fn attempt(provider_payment_id: Option<&str>) -> Attempt {
        let mut attempt = crate::domain::fixtures::pending_attempt(Utc.timestamp_opt(1_700_000_000, 0).unwrap());
        attempt.provider_payment_id = provider_payment_id.map(str::to_owned);
        attempt.provider_calls = 1;
        attempt
    }

    fn snapshot(id: &str, status: ProviderPaymentStatus, amount_minor: i64) -> PaymentSnapshot {
        PaymentSnapshot {
            id: id.into(),
            status,
            amount_minor,
            amount_received_minor: amount_minor,
            currency: "usd".into(),
            created: Utc.timestamp_opt(1_700_000_000, 0).unwrap(),
            metadata: BTreeMap::new(),
            last_error: None,
            next_action: None,
        }
    }

    #[test]
    fn a_reconfirmed_intent_moves_its_confirming_attempt_but_an_old_decline_does_not() {
        let mut confirming = attempt(None);
        confirming.generation = 1;
        confirming.confirms_payment_id = Some("pi_1".into());
        let declined = for_payment("evt_1", &snapshot("pi_1", ProviderPaymentStatus::RequiresPaymentMethod, 1000), Some(&confirming));
        assert!(matches!(declined, Settlement::Record { outcome: InboxOutcome::Stale, .. }), "{declined:?}");
        let Settlement::Apply(update) =
            for_payment("evt_2", &snapshot("pi_1", ProviderPaymentStatus::Succeeded, 1000), Some(&confirming))
        else {
            panic!("a success of the confirmed intent is the confirming attempt's")
        };
        assert_eq!(update.status, AttemptStatus::Succeeded);
        assert_eq!(update.attempt_id, confirming.id);
        let other = for_payment("evt_3", &snapshot("pi_9", ProviderPaymentStatus::RequiresPaymentMethod, 1000), Some(&confirming));
        assert!(matches!(other, Settlement::Apply(_)), "only the confirmed intent's own news is held back");
    }

    #[test]
    fn unknown_object_is_recorded_not_dropped() {
        let settlement = for_payment(
            "evt_1",
            &snapshot("pi_1", ProviderPaymentStatus::Succeeded, 1000),
            None,
        );
        assert!(matches!(
            settlement,
            Settlement::Record {
                outcome: InboxOutcome::UnknownObject,
                ..
            }
        ));
    }

    #[test]
    fn success_moves_to_succeeded_and_binds_the_object() {
        let Settlement::Apply(update) = for_payment(
            "evt_1",
            &snapshot("pi_1", ProviderPaymentStatus::Succeeded, 1000),
            Some(&attempt(None)),
        ) else {
            panic!("an update")
        };
        assert_eq!(update.status, AttemptStatus::Succeeded);
        assert_eq!(update.provider_payment_id, "pi_1");
        assert_eq!(update.provider_status, "succeeded");
        assert_eq!(update.review_reason, None);
    }

    #[test]
    fn an_event_showing_money_carries_the_flag_for_a_failed_attempt() {
        let mut failed = attempt(Some("pi_1"));
        failed.status = AttemptStatus::Failed;
        let Settlement::Apply(update) = for_payment(
            "evt_1",
            &snapshot("pi_1", ProviderPaymentStatus::Succeeded, 1000),
            Some(&failed),
        ) else {
            panic!("an update")
        };
        assert!(!update.status.allowed_sources().contains(&AttemptStatus::Failed));
        let reason = update.review_reason_if_failed.unwrap();
        assert!(reason.starts_with("succeeded_after_failure: provider object pi_1"), "{reason}");

        let Settlement::Apply(declined) = for_payment(
            "evt_2",
            &snapshot("pi_1", ProviderPaymentStatus::RequiresPaymentMethod, 0),
            Some(&failed),
        ) else {
            panic!("an update")
        };
        assert_eq!(declined.review_reason_if_failed, None);
    }

    #[test]
    fn processing_asks_for_pending_which_the_store_guard_never_allows() {
        let Settlement::Apply(update) = for_payment(
            "evt_1",
            &snapshot("pi_1", ProviderPaymentStatus::Processing, 1000),
            Some(&attempt(Some("pi_1"))),
        ) else {
            panic!("an update")
        };
        assert_eq!(update.status, AttemptStatus::Pending);
        assert!(update.status.allowed_sources().is_empty());
    }

    #[test]
    fn a_different_amount_is_flagged_for_review() {
        let Settlement::Apply(update) = for_payment(
            "evt_1",
            &snapshot("pi_1", ProviderPaymentStatus::Succeeded, 999),
            Some(&attempt(None)),
        ) else {
            panic!("an update")
        };
        assert!(update.review_reason.unwrap().contains("999"));
    }

    #[test]
    fn a_second_object_for_an_attempt_flags_it_and_changes_nothing_else() {
        let settlement = for_payment(
            "evt_9",
            &snapshot("pi_2", ProviderPaymentStatus::Succeeded, 1000),
            Some(&attempt(Some("pi_1"))),
        );
        let Settlement::Flag { review_reason, .. } = settlement else {
            panic!("a flag")
        };
        assert_eq!(review::ReviewKind::of(&review_reason), review::ReviewKind::DoubleCharge, "{review_reason}");
        assert!(
            review_reason.contains("pi_1")
                && review_reason.contains("pi_2")
                && review_reason.contains("evt_9")
        );
    }

    fn refund_attempt(provider_refund_id: Option<&str>) -> Attempt {
        let mut refund = attempt(provider_refund_id);
        refund.kind = AttemptKind::Refund;
        refund.parent_attempt_id = Some(crate::domain::AttemptId::from_uuid(uuid::Uuid::nil()));
        refund
    }

    fn refund_subject(status: &str, failure_reason: Option<&str>) -> RefundSubject {
        RefundSubject {
            snapshot: crate::domain::RefundSnapshot {
                id: "re_1".into(),
                payment_id: Some("pi_1".into()),
                status: status.into(),
                amount_minor: 1_000,
                currency: "usd".into(),
                created: Utc.timestamp_opt(1_700_000_000, 0).unwrap(),
                metadata: BTreeMap::new(),
                failure_reason: failure_reason.map(str::to_owned),
            },
            attempt_id: None,
        }
    }

    #[test]
    fn a_pending_refund_asks_for_pending_which_the_store_guard_never_allows() {
        let Settlement::Refunds(updates) =
            for_refund("evt_1", &refund_subject("pending", None), Some(&refund_attempt(None)))
        else {
            panic!("an update")
        };
        assert_eq!(updates[0].status, AttemptStatus::Pending);
        assert!(AttemptStatus::Pending.allowed_sources().is_empty());
    }

    #[test]
    fn a_refund_event_moves_its_refund_attempt_with_the_failure_reason() {
        let Settlement::Refunds(updates) = for_refund(
            "evt_1",
            &refund_subject("failed", Some("expired_or_canceled_card")),
            Some(&refund_attempt(Some("re_1"))),
        ) else {
            panic!("an update")
        };
        assert_eq!(updates.len(), 1);
        assert_eq!(updates[0].status, AttemptStatus::Failed);
        assert_eq!(updates[0].provider_refund_id, "re_1");
        assert_eq!(updates[0].failure.as_ref().unwrap().code, "expired_or_canceled_card");

        let Settlement::Refunds(updates) =
            for_refund("evt_2", &refund_subject("succeeded", None), Some(&refund_attempt(None)))
        else {
            panic!("an update")
        };
        assert_eq!((updates[0].status, updates[0].failure.clone()), (AttemptStatus::Succeeded, None));
    }

    #[test]
    fn refunds_without_a_refund_attempt_are_unknown_and_a_second_refund_is_flagged() {
        for attempt in [None, Some(attempt(Some("re_1")))] {
            assert!(matches!(
                for_refund("evt_1", &refund_subject("succeeded", None), attempt.as_ref()),
                Settlement::Record { outcome: InboxOutcome::UnknownObject, .. }
            ));
        }
        let Settlement::Flag { review_reason, .. } = for_refund(
            "evt_3",
            &refund_subject("succeeded", None),
            Some(&refund_attempt(Some("re_0"))),
        ) else {
            panic!("a flag")
        };
        assert!(review_reason.contains("re_0") && review_reason.contains("re_1"), "{review_reason}");
        assert_eq!(review::ReviewKind::of(&review_reason), review::ReviewKind::SecondProviderObject);
    }

    #[test]
    fn charge_refunded_settles_each_listed_refund_or_only_records() {
        assert!(matches!(
            for_charge_refunded("evt_1", "ch_1", None, &[]),
            Settlement::Record { outcome: InboxOutcome::UnknownObject, .. }
        ));
        assert!(matches!(
            for_charge_refunded("evt_1", "ch_1", Some(&attempt(Some("pi_1"))), &[]),
            Settlement::Record { outcome: InboxOutcome::Stale, .. }
        ));
        let listed = [
            (refund_subject("succeeded", None), Some(refund_attempt(None))),
            (refund_subject("succeeded", None), None),
        ];
        let Settlement::Refunds(updates) = for_charge_refunded("evt_1", "ch_1", None, &listed) else {
            panic!("updates")
        };
        assert_eq!(updates.len(), 1, "the unknown refund is left out");
    }

    #[test]
    fn a_dispute_flags_the_charge_attempt_naming_the_dispute() {
        let dispute = DisputeFacts {
            id: "dp_1".into(),
            charge: Some("ch_1".into()),
            payment_intent: Some("pi_1".into()),
            amount_minor: 1000,
            currency: "usd".into(),
            reason: "fraudulent".into(),
            status: "lost".into(),
        };
        let Settlement::Dispute { review_reason, .. } = for_dispute(&dispute, Some(&attempt(Some("pi_1"))))
        else {
            panic!("a dispute flag")
        };
        assert_eq!(review_reason, "dispute: dp_1 on charge ch_1 is lost: reason fraudulent, 10.00 usd");
        assert!(matches!(
            for_dispute(&dispute, None),
            Settlement::Record { outcome: InboxOutcome::UnknownObject, .. }
        ));
        assert!(matches!(
            for_dispute(&dispute, Some(&refund_attempt(Some("pi_1")))),
            Settlement::Record { outcome: InboxOutcome::UnknownObject, .. }
        ));
    }
}
