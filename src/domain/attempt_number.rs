//! Attempts of one operation (issue 16): which attempt a request is, and whether a new attempt
//! may start. The operation stays the unit of "at most once": attempt n + 1 starts only when
//! attempt n is known not to have charged, and it reaches the provider so that the provider
//! itself keeps the operation to one charge where it can (a re-confirmed intent succeeds at most
//! once).

use super::{Attempt, AttemptId, AttemptStatus, ChargeParams, InvalidField, SUCCEEDED_AFTER_FAILURE};

/// The most attempts one operation may have. A customer who fixes a card a hundred times is a
/// fraud signal, not a checkout; the bound also keeps the generation small.
pub const ATTEMPT_NUMBER_MAX: u32 = 100;

/// The provider status of an intent that can no longer be paid.
const PROVIDER_STATUS_CANCELED: &str = "canceled";

/// Which attempt of its operation a request is, 1-based, from 1 to [`ATTEMPT_NUMBER_MAX`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AttemptNumber(u32);

impl AttemptNumber {
    pub const FIRST: AttemptNumber = AttemptNumber(1);

    /// `None` (the field absent) is the first attempt, so callers that never send a number are
    /// unchanged.
    pub fn parse(value: Option<u32>) -> Result<Self, InvalidField> {
        match value {
            None => Ok(Self::FIRST),
            Some(0) => Err(InvalidField::new("attempt", "is 1-based: the first attempt is 1")),
            Some(number) if number > ATTEMPT_NUMBER_MAX => Err(InvalidField::new(
                "attempt",
                format!("must be at most {ATTEMPT_NUMBER_MAX}"),
            )),
            Some(number) => Ok(Self(number)),
        }
    }

    pub fn get(self) -> u32 {
        self.0
    }

    /// The generation of the attempt's key: attempt 1 is generation 0.
    pub fn generation(self) -> u32 {
        self.0 - 1
    }
}

/// Whether a new attempt of an operation may be written, given the operation's latest attempt
/// before it (none for a first attempt).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Write the row. `confirms_payment_id`: the earlier attempt's intent, still payable, that
    /// this attempt confirms again with its own payment method and key; `None` creates a new
    /// intent.
    Insert { confirms_payment_id: Option<String> },
    /// The latest attempt is not decided yet: a second concurrent charge could succeed beside
    /// it. Safe to retry once it is.
    PreviousInProgress { attempt_id: AttemptId },
    /// The operation is paid (or the provider reported money moved for an attempt we answered
    /// failed): no attempt may follow.
    AlreadySucceeded { attempt_id: AttemptId },
    /// The requested attempt does not follow the latest one.
    OutOfOrder { latest_attempt: Option<u32> },
    /// The latest attempt's intent is still payable but the new attempt changes what it pays
    /// (amount, currency or customer, which a confirm cannot change): that intent must be
    /// canceled, and the cancel recorded on the latest attempt, before a new intent is created.
    CancelPrevious { attempt_id: AttemptId, provider_payment_id: String },
}

/// Whether the failed attempt's intent could still be confirmed (and so charge) by anyone holding
/// a key for it. Unknown provider status with a known object counts as payable: the safe side.
fn payable_intent(attempt: &Attempt) -> Option<&str> {
    let id = attempt.provider_payment_id.as_deref()?;
    (attempt.provider_status.as_deref() != Some(PROVIDER_STATUS_CANCELED)).then_some(id)
}

/// What a confirm of the earlier intent cannot change: the intent keeps its own amount,
/// currency and customer.
fn confirm_keeps(previous: &ChargeParams, next: &ChargeParams) -> bool {
    previous.amount_minor == next.amount_minor
        && previous.currency == next.currency
        && previous.customer == next.customer
}

/// The rule of issue 16. `latest` is the operation's latest charge attempt below the requested
/// generation, as the inserting statement read it (locked). The PostgreSQL function
/// `insert_pending_attempt` (migration 20261204000002) applies the same rule in SQL; the store
/// classifies what it returned with this function, so the two are checked against each other.
pub fn admit(latest: Option<&Attempt>, requested: AttemptNumber, params: &ChargeParams) -> Admission {
    let Some(latest) = latest else {
        return if requested == AttemptNumber::FIRST {
            Admission::Insert { confirms_payment_id: None }
        } else {
            Admission::OutOfOrder { latest_attempt: None }
        };
    };
    let money_moved = latest.status == AttemptStatus::Succeeded
        || latest.review_reason.as_deref().is_some_and(|reason| reason.contains(SUCCEEDED_AFTER_FAILURE));
    if money_moved {
        return Admission::AlreadySucceeded { attempt_id: latest.id };
    }
    if latest.generation + 1 != requested.generation() {
        return Admission::OutOfOrder { latest_attempt: Some(latest.attempt_number()) };
    }
    if !latest.status.is_terminal() {
        return Admission::PreviousInProgress { attempt_id: latest.id };
    }
    match payable_intent(latest) {
        None => Admission::Insert { confirms_payment_id: None },
        Some(intent) if confirm_keeps(&latest.params, params) => {
            Admission::Insert { confirms_payment_id: Some(intent.to_owned()) }
        }
        Some(intent) => Admission::CancelPrevious { attempt_id: latest.id, provider_payment_id: intent.to_owned() },
    }
}

#[cfg(test)]
mod tests {
    use chrono::{TimeZone, Utc};

    use super::*;
    use crate::domain::{Currency, CustomerId, Failure, PaymentMethodId};

    fn attempt(number: u32, status: AttemptStatus) -> Attempt {
        let mut attempt = crate::domain::fixtures::pending_attempt(Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap());
        attempt.generation = number - 1;
        attempt.status = status;
        attempt
    }

    fn declined(number: u32) -> Attempt {
        let mut attempt = attempt(number, AttemptStatus::Failed);
        attempt.failure = Some(Failure { code: "card_declined".into(), message: "declined".into() });
        attempt.provider_payment_id = Some("pi_1".into());
        attempt.provider_status = Some("requires_payment_method".into());
        attempt
    }

    fn number(value: u32) -> AttemptNumber {
        AttemptNumber::parse(Some(value)).unwrap()
    }

    fn another_card(of: &Attempt) -> ChargeParams {
        ChargeParams { payment_method: PaymentMethodId::parse("pm_card_mastercard").unwrap(), ..of.params.clone() }
    }

    #[test]
    fn the_number_is_one_based_and_bounded() {
        assert_eq!(AttemptNumber::parse(None).unwrap(), AttemptNumber::FIRST);
        assert_eq!(AttemptNumber::parse(None).unwrap().generation(), 0);
        assert_eq!(AttemptNumber::parse(Some(0)).unwrap_err().field, "attempt");
        assert_eq!(AttemptNumber::parse(Some(ATTEMPT_NUMBER_MAX + 1)).unwrap_err().field, "attempt");
        assert_eq!(number(ATTEMPT_NUMBER_MAX).generation(), ATTEMPT_NUMBER_MAX - 1);
        assert_eq!(number(3).generation(), 2);
    }

    #[test]
    fn a_first_attempt_needs_nothing_before_it_and_a_later_one_does() {
        let params = attempt(1, AttemptStatus::Pending).params;
        assert_eq!(admit(None, AttemptNumber::FIRST, &params), Admission::Insert { confirms_payment_id: None });
        assert_eq!(admit(None, number(2), &params), Admission::OutOfOrder { latest_attempt: None });
    }

    #[test]
    fn after_a_decline_the_same_intent_is_confirmed_again() {
        let previous = declined(1);
        assert_eq!(
            admit(Some(&previous), number(2), &another_card(&previous)),
            Admission::Insert { confirms_payment_id: Some("pi_1".into()) }
        );
    }

    #[test]
    fn an_intent_whose_status_is_unknown_counts_as_payable() {
        let mut previous = declined(1);
        previous.provider_status = None;
        assert_eq!(
            admit(Some(&previous), number(2), &previous.params),
            Admission::Insert { confirms_payment_id: Some("pi_1".into()) }
        );
    }

    #[test]
    fn no_object_or_a_canceled_intent_creates_a_new_intent() {
        let mut expired = attempt(1, AttemptStatus::Failed);
        expired.failure = Some(Failure::expired());
        assert_eq!(admit(Some(&expired), number(2), &expired.params), Admission::Insert { confirms_payment_id: None });
        let mut canceled = declined(1);
        canceled.provider_status = Some("canceled".into());
        let mut more = canceled.params.clone();
        more.amount_minor += 1;
        assert_eq!(admit(Some(&canceled), number(2), &more), Admission::Insert { confirms_payment_id: None });
    }

    #[test]
    fn a_change_a_confirm_cannot_make_cancels_the_payable_intent_first() {
        let previous = declined(1);
        let cancel = Admission::CancelPrevious { attempt_id: previous.id, provider_payment_id: "pi_1".into() };
        let mut amount = previous.params.clone();
        amount.amount_minor += 1;
        assert_eq!(admit(Some(&previous), number(2), &amount), cancel);
        let mut currency = previous.params.clone();
        currency.currency = Currency::parse("eur").unwrap();
        assert_eq!(admit(Some(&previous), number(2), &currency), cancel);
        let mut customer = previous.params.clone();
        customer.customer = Some(CustomerId::parse("cus_2").unwrap());
        assert_eq!(admit(Some(&previous), number(2), &customer), cancel);
    }

    #[test]
    fn an_undecided_attempt_blocks_the_next() {
        for status in [AttemptStatus::Pending, AttemptStatus::RequiresAction] {
            let previous = attempt(1, status);
            assert_eq!(
                admit(Some(&previous), number(2), &previous.params),
                Admission::PreviousInProgress { attempt_id: previous.id }
            );
        }
    }

    #[test]
    fn a_paid_operation_takes_no_further_attempt() {
        let paid = attempt(1, AttemptStatus::Succeeded);
        for requested in [2, 3] {
            assert_eq!(
                admit(Some(&paid), number(requested), &paid.params),
                Admission::AlreadySucceeded { attempt_id: paid.id }
            );
        }
        let mut flagged = declined(1);
        flagged.review_reason = Some(format!("{SUCCEEDED_AFTER_FAILURE}: provider object pi_1 is succeeded"));
        assert_eq!(
            admit(Some(&flagged), number(2), &flagged.params),
            Admission::AlreadySucceeded { attempt_id: flagged.id }
        );
    }

    #[test]
    fn an_attempt_that_skips_one_is_out_of_order() {
        let previous = declined(1);
        assert_eq!(
            admit(Some(&previous), number(3), &previous.params),
            Admission::OutOfOrder { latest_attempt: Some(1) }
        );
        let pending = attempt(1, AttemptStatus::Pending);
        assert_eq!(
            admit(Some(&pending), number(3), &pending.params),
            Admission::OutOfOrder { latest_attempt: Some(1) },
            "skipping is the caller's bug whatever state the latest attempt is in"
        );
    }
}
