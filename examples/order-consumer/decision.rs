//! What to do with a delivery once chargeguard answered: pure, so every branch is tested
//! without a broker.

use std::time::Duration;

use chargeguard_client::proto::{AttemptStatus, ChargeOutcome};
use chargeguard_client::{Answer, Backoff, ChargeResponse};

/// A delivery's fate. Only `Record` and `DeadLetter` end it; both write the consumer's table
/// before the broker hears anything, so a crash in between only causes a redelivery that finds
/// the row.
#[derive(Debug, Clone, PartialEq)]
pub enum Disposition {
    /// chargeguard decided the charge: record it, then ack.
    Record(Decided),
    /// Not decided yet (or not reachable): requeue to be delivered again after `after`.
    Retry { after: Duration, class: String },
    /// chargeguard refused the request itself; the same request would be refused again. Record
    /// the refusal, then dead-letter the message for a person.
    DeadLetter { code: String, message: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrderStatus {
    Paid,
    Declined,
    /// The customer must act (3-D Secure): the order service asks them; the payment's webhook
    /// or a later read decides it.
    RequiresAction,
    /// Dead-lettered: chargeguard refused the request (or the event was not one).
    Rejected,
}

impl OrderStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Paid => "paid",
            Self::Declined => "declined",
            Self::RequiresAction => "requires_action",
            Self::Rejected => "rejected",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Decided {
    pub status: OrderStatus,
    pub attempt_id: String,
    pub provider_payment_id: String,
    /// APPLIED, DUPLICATE or RECONCILED: which call decided it (a figure, not a state).
    pub outcome: &'static str,
    pub failure_code: String,
}

/// Retries of one message before it is dead-lettered as `retries_exhausted`. With the backoff's
/// 30 s ceiling this is over an hour of trying; chargeguard's sweep completes the attempt
/// meanwhile, and a person reading the dead letter finds the answer with `GetAttempt`.
pub const RETRIES_MAX: u32 = 150;

/// The delay before retry number `retries` (0-based): the client's backoff with jitter, never
/// shorter than the server's hint.
pub fn retry_delay(backoff: &Backoff, retries: u32, hint: Duration, rng: &mut impl rand::Rng) -> Duration {
    backoff.delay(retries, rng).max(hint)
}

pub fn decide(answer: Answer<ChargeResponse>, retries: u32, backoff: &Backoff, rng: &mut impl rand::Rng) -> Disposition {
    match answer {
        Answer::Done(response) => from_response(response, retries, backoff, rng),
        Answer::RetryLater(later) if retries >= RETRIES_MAX => Disposition::DeadLetter {
            code: "retries_exhausted".to_owned(),
            message: format!("{} retries, the last answer {}: {}", retries, later.code, later.message),
        },
        Answer::RetryLater(later) => Disposition::Retry {
            after: retry_delay(backoff, retries, later.after, rng),
            class: later.class.to_string(),
        },
        Answer::Reject(rejection) => Disposition::DeadLetter { code: rejection.code, message: rejection.message },
    }
}

fn from_response(response: ChargeResponse, retries: u32, backoff: &Backoff, rng: &mut impl rand::Rng) -> Disposition {
    let outcome = match ChargeOutcome::try_from(response.outcome) {
        Ok(ChargeOutcome::Applied) => "applied",
        Ok(ChargeOutcome::Duplicate) => "duplicate",
        Ok(ChargeOutcome::Reconciled) => "reconciled",
        _ => "unspecified",
    };
    let Some(attempt) = response.attempt else {
        return Disposition::DeadLetter { code: "malformed_answer".to_owned(), message: "a charge answer without its attempt".to_owned() };
    };
    let status = match AttemptStatus::try_from(attempt.status) {
        Ok(AttemptStatus::Succeeded) => OrderStatus::Paid,
        Ok(AttemptStatus::Failed) => OrderStatus::Declined,
        Ok(AttemptStatus::RequiresAction) => OrderStatus::RequiresAction,
        // chargeguard answers a charge only once it is decided; a pending one is asked again.
        _ => {
            return Disposition::Retry { after: retry_delay(backoff, retries, Duration::ZERO, rng), class: "pending".to_owned() };
        }
    };
    Disposition::Record(Decided {
        status,
        attempt_id: attempt.attempt_id,
        provider_payment_id: attempt.provider_payment_id,
        outcome,
        failure_code: attempt.failure_code,
    })
}

#[cfg(test)]
mod tests {
    use chargeguard_client::proto::Attempt;
    use chargeguard_client::{RetryClass, RetryLater, Rejection};
    use rand::SeedableRng;

    use super::*;

    fn rng() -> rand::rngs::StdRng {
        rand::rngs::StdRng::seed_from_u64(7)
    }

    fn done(status: AttemptStatus, outcome: ChargeOutcome) -> Answer<ChargeResponse> {
        let attempt = Attempt { attempt_id: "a1".into(), status: status as i32, provider_payment_id: "pi_1".into(), ..Default::default() };
        Answer::Done(ChargeResponse { attempt: Some(attempt), outcome: outcome as i32 })
    }

    fn later(class: RetryClass, after: Duration) -> Answer<ChargeResponse> {
        Answer::RetryLater(RetryLater { after, class, code: "outcome_unknown".into(), message: "m".into() })
    }

    #[test]
    fn a_decided_charge_is_recorded_whichever_call_decided_it() {
        let backoff = Backoff::default();
        for (status, expected) in [
            (AttemptStatus::Succeeded, OrderStatus::Paid),
            (AttemptStatus::Failed, OrderStatus::Declined),
            (AttemptStatus::RequiresAction, OrderStatus::RequiresAction),
        ] {
            for outcome in [ChargeOutcome::Applied, ChargeOutcome::Duplicate, ChargeOutcome::Reconciled] {
                let Disposition::Record(decided) = decide(done(status, outcome), 0, &backoff, &mut rng()) else {
                    panic!("{status:?} {outcome:?} not recorded");
                };
                assert_eq!(decided.status, expected);
                assert_eq!(decided.attempt_id, "a1");
            }
        }
    }

    #[test]
    fn a_pending_answer_is_asked_again_not_recorded() {
        let disposition = decide(done(AttemptStatus::Pending, ChargeOutcome::Applied), 0, &Backoff::default(), &mut rng());
        assert!(matches!(disposition, Disposition::Retry { ref class, .. } if class == "pending"), "{disposition:?}");
    }

    #[test]
    fn retry_later_waits_at_least_the_servers_hint_and_gives_up_after_the_bound() {
        let backoff = Backoff::default();
        let hint = Duration::from_secs(3);
        let Disposition::Retry { after, class } = decide(later(RetryClass::ResourceExhausted, hint), 0, &backoff, &mut rng()) else {
            panic!("not retried");
        };
        assert!(after >= hint);
        assert_eq!(class, RetryClass::ResourceExhausted.to_string());
        let exhausted = decide(later(RetryClass::OutcomeUnknown, Duration::ZERO), RETRIES_MAX, &backoff, &mut rng());
        assert!(matches!(exhausted, Disposition::DeadLetter { ref code, .. } if code == "retries_exhausted"));
    }

    #[test]
    fn a_rejection_is_dead_lettered_with_its_code() {
        let rejection = Rejection {
            grpc_code: tonic::Code::FailedPrecondition,
            code: "operation_mismatch".into(),
            message: "different amount".into(),
            attempt_id: None,
        };
        let disposition = decide(Answer::Reject(rejection), 0, &Backoff::default(), &mut rng());
        assert_eq!(disposition, Disposition::DeadLetter { code: "operation_mismatch".into(), message: "different amount".into() });
    }
}
