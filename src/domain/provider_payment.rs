use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use super::{AttemptStatus, ChargeParams, Failure, NextAction};

/// The provider's payment object as chargeguard needs it, whatever the provider.
#[derive(Debug, Clone, PartialEq)]
pub struct PaymentSnapshot {
    pub id: String,
    pub status: ProviderPaymentStatus,
    pub amount_minor: i64,
    pub amount_received_minor: i64,
    /// Lowercase ISO 4217 code.
    pub currency: String,
    pub created: DateTime<Utc>,
    pub metadata: BTreeMap<String, String>,
    pub last_error: Option<Failure>,
    pub next_action: Option<NextAction>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderPaymentStatus {
    Succeeded,
    Processing,
    RequiresAction,
    RequiresPaymentMethod,
    RequiresConfirmation,
    RequiresCapture,
    Canceled,
    Other(String),
}

impl ProviderPaymentStatus {
    pub fn as_str(&self) -> &str {
        match self {
            ProviderPaymentStatus::Succeeded => "succeeded",
            ProviderPaymentStatus::Processing => "processing",
            ProviderPaymentStatus::RequiresAction => "requires_action",
            ProviderPaymentStatus::RequiresPaymentMethod => "requires_payment_method",
            ProviderPaymentStatus::RequiresConfirmation => "requires_confirmation",
            ProviderPaymentStatus::RequiresCapture => "requires_capture",
            ProviderPaymentStatus::Canceled => "canceled",
            ProviderPaymentStatus::Other(other) => other,
        }
    }

    pub fn parse(value: &str) -> Self {
        match value {
            "succeeded" => ProviderPaymentStatus::Succeeded,
            "processing" => ProviderPaymentStatus::Processing,
            "requires_action" => ProviderPaymentStatus::RequiresAction,
            "requires_payment_method" => ProviderPaymentStatus::RequiresPaymentMethod,
            "requires_confirmation" => ProviderPaymentStatus::RequiresConfirmation,
            "requires_capture" => ProviderPaymentStatus::RequiresCapture,
            "canceled" => ProviderPaymentStatus::Canceled,
            other => ProviderPaymentStatus::Other(other.to_owned()),
        }
    }
}

/// What an attempt becomes given what the provider holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution {
    pub status: AttemptStatus,
    pub failure: Option<Failure>,
    pub next_action: Option<NextAction>,
    /// Set when a person must look: the provider object disagrees with our request, or is in a
    /// state chargeguard never asks for.
    pub review_reason: Option<String>,
}

/// Maps the provider's object to the attempt's next state. `requested` is what we asked for,
/// checked against what the provider holds.
pub fn resolve_snapshot(snapshot: &PaymentSnapshot, requested: &ChargeParams) -> Resolution {
    let mut resolution = match &snapshot.status {
        ProviderPaymentStatus::Succeeded => Resolution::plain(AttemptStatus::Succeeded),
        // Settles later, announced by webhook; until then the attempt is not decided.
        ProviderPaymentStatus::Processing => Resolution::plain(AttemptStatus::Pending),
        ProviderPaymentStatus::RequiresAction => Resolution {
            next_action: snapshot.next_action.clone(),
            ..Resolution::plain(AttemptStatus::RequiresAction)
        },
        ProviderPaymentStatus::RequiresPaymentMethod => Resolution {
            failure: Some(snapshot.last_error.clone().unwrap_or_else(|| Failure {
                code: "requires_payment_method".to_owned(),
                message: "the provider needs another payment method".to_owned(),
            })),
            ..Resolution::plain(AttemptStatus::Failed)
        },
        ProviderPaymentStatus::Canceled => Resolution {
            failure: Some(Failure {
                code: "canceled".to_owned(),
                message: "the payment was canceled at the provider".to_owned(),
            }),
            ..Resolution::plain(AttemptStatus::Failed)
        },
        // chargeguard creates with confirm=true and automatic capture, so these mean someone
        // changed the object outside chargeguard: keep the attempt open and ask a person.
        ProviderPaymentStatus::RequiresConfirmation
        | ProviderPaymentStatus::RequiresCapture
        | ProviderPaymentStatus::Other(_) => Resolution {
            review_reason: Some(format!(
                "provider object {} {} {:?}",
                snapshot.id,
                super::review::UNEXPECTED_STATUS,
                snapshot.status.as_str()
            )),
            ..Resolution::plain(AttemptStatus::Pending)
        },
    };
    resolution.flag_other_amount("provider object", &snapshot.id, snapshot.amount_minor, &snapshot.currency, requested);
    resolution
}

impl Resolution {
    pub(super) fn plain(status: AttemptStatus) -> Self {
        Self { status, failure: None, next_action: None, review_reason: None }
    }

    /// A provider object (`noun` says which kind) for another amount or currency than the
    /// attempt asked for: whatever its status, a person must look.
    pub(super) fn flag_other_amount(
        &mut self,
        noun: &str,
        id: &str,
        amount_minor: i64,
        currency: &str,
        requested: &ChargeParams,
    ) {
        if amount_minor != requested.amount_minor || currency != requested.currency.code() {
            self.review_reason = Some(format!(
                "{noun} {id} is for {amount_minor} {currency}, {} {} {}",
                super::review::OTHER_AMOUNT,
                requested.amount_minor,
                requested.currency.code()
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;
    use crate::domain::{Currency, Metadata, PaymentMethodId};

    fn requested() -> ChargeParams {
        ChargeParams::new(
            500,
            1_000,
            Currency::parse("usd").unwrap(),
            PaymentMethodId::parse("pm_card_visa").unwrap(),
            None,
            None,
            Metadata::default(),
        )
        .unwrap()
    }

    fn snapshot(status: ProviderPaymentStatus) -> PaymentSnapshot {
        PaymentSnapshot {
            id: "pi_1".into(),
            status,
            amount_minor: 500,
            amount_received_minor: 0,
            currency: "usd".into(),
            created: Utc.timestamp_opt(0, 0).unwrap(),
            metadata: BTreeMap::new(),
            last_error: None,
            next_action: None,
        }
    }

    #[test]
    fn maps_each_provider_state() {
        let status = |s| resolve_snapshot(&snapshot(s), &requested()).status;
        assert_eq!(status(ProviderPaymentStatus::Succeeded), AttemptStatus::Succeeded);
        assert_eq!(status(ProviderPaymentStatus::Processing), AttemptStatus::Pending);
        assert_eq!(status(ProviderPaymentStatus::RequiresAction), AttemptStatus::RequiresAction);
        assert_eq!(status(ProviderPaymentStatus::RequiresPaymentMethod), AttemptStatus::Failed);
        assert_eq!(status(ProviderPaymentStatus::Canceled), AttemptStatus::Failed);
        let odd = resolve_snapshot(&snapshot(ProviderPaymentStatus::RequiresCapture), &requested());
        assert_eq!(odd.status, AttemptStatus::Pending, "never guessed terminal");
        assert!(odd.review_reason.is_some());
    }

    #[test]
    fn a_different_amount_at_the_provider_is_flagged() {
        let mut other = snapshot(ProviderPaymentStatus::Succeeded);
        other.amount_minor = 600;
        let resolution = resolve_snapshot(&other, &requested());
        assert!(resolution.review_reason.unwrap().contains("600"));
    }
}
