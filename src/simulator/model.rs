//! The simulator's objects and their Stripe JSON. Every rendering carries the fields
//! async-stripe requires (non-`Option` fields of its generated types).

use std::collections::{BTreeMap, VecDeque};

use serde_json::{Value, json};

use super::wire::{ApiError, ErrorType};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaymentIntentStatus {
    RequiresPaymentMethod,
    RequiresConfirmation,
    RequiresAction,
    Processing,
    Succeeded,
    Canceled,
}

impl PaymentIntentStatus {
    pub const ALL: [Self; 6] = [
        Self::RequiresPaymentMethod,
        Self::RequiresConfirmation,
        Self::RequiresAction,
        Self::Processing,
        Self::Succeeded,
        Self::Canceled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::RequiresPaymentMethod => "requires_payment_method",
            Self::RequiresConfirmation => "requires_confirmation",
            Self::RequiresAction => "requires_action",
            Self::Processing => "processing",
            Self::Succeeded => "succeeded",
            Self::Canceled => "canceled",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == name)
    }
}

/// How a payment method behaves when a payment intent is confirmed with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CardBehaviour {
    Succeeds,
    Declines {
        code: &'static str,
        decline_code: &'static str,
        message: &'static str,
    },
    RequiresAction,
    /// `processing`, then settles after the configured delay.
    Processing {
        settles: Settlement,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    Succeeds,
    Fails,
}

/// Stripe's test payment methods that the simulator knows, plus two of its own for
/// asynchronous settlement.
pub fn test_payment_method(name: &str) -> Option<CardBehaviour> {
    const DECLINED: &str = "Your card was declined.";
    Some(match name {
        // The charge of `pm_card_refundFail` succeeds; its refunds fail later (state.rs).
        "pm_card_visa" | "pm_card_visa_debit" | "pm_card_mastercard" | "pm_card_amex"
        | REFUND_FAIL_PAYMENT_METHOD => CardBehaviour::Succeeds,
        "pm_card_chargeDeclined" => CardBehaviour::Declines {
            code: "card_declined",
            decline_code: "generic_decline",
            message: DECLINED,
        },
        "pm_card_chargeDeclinedInsufficientFunds" => CardBehaviour::Declines {
            code: "card_declined",
            decline_code: "insufficient_funds",
            message: "Your card has insufficient funds.",
        },
        "pm_card_chargeDeclinedFraudulent" => CardBehaviour::Declines {
            code: "card_declined",
            decline_code: "fraudulent",
            message: DECLINED,
        },
        "pm_card_chargeDeclinedExpiredCard" => CardBehaviour::Declines {
            code: "expired_card",
            decline_code: "expired_card",
            message: "Your card has expired.",
        },
        "pm_card_authenticationRequired" | "pm_card_threeDSecure2Required" => {
            CardBehaviour::RequiresAction
        }
        "pm_sim_processing_succeeds" => CardBehaviour::Processing {
            settles: Settlement::Succeeds,
        },
        "pm_sim_processing_fails" => CardBehaviour::Processing {
            settles: Settlement::Fails,
        },
        _ => return None,
    })
}

/// How an object came to exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// Through `/v1`.
    Api,
    /// Seeded through `/_sim` (never through the idempotency layer).
    Control,
}

/// Confirmations kept per intent (the oldest are dropped; `confirmations_total` counts all).
pub const CONFIRMATIONS_KEPT_MAX: usize = 32;

/// One confirmation of an intent (a create with `confirm=true`, or `/confirm`): what the
/// ledger shows of each payment attempted on it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Confirmation {
    /// The key of the confirming request (`None`: none was sent).
    pub idempotency_key: Option<String>,
    pub payment_method: String,
    /// The intent's status right after it.
    pub status: String,
    /// Sim clock.
    pub created: i64,
}

#[derive(Debug, Clone)]
pub struct PaymentIntent {
    pub seq: u64,
    pub id: String,
    pub amount: i64,
    pub amount_received: i64,
    pub amount_refunded: i64,
    pub currency: String,
    pub status: PaymentIntentStatus,
    pub metadata: BTreeMap<String, String>,
    pub created: i64,
    pub description: Option<String>,
    pub customer: Option<String>,
    pub payment_method: Option<String>,
    pub capture_method: String,
    pub client_secret: String,
    pub return_url: Option<String>,
    pub next_action: Option<Value>,
    pub last_payment_error: Option<Value>,
    pub latest_charge: Option<String>,
    pub canceled_at: Option<i64>,
    pub cancellation_reason: Option<String>,
    /// The idempotency key of the request that created it.
    pub idempotency_key: Option<String>,
    pub origin: Origin,
    /// When a `processing` intent settles (sim clock), and how.
    pub settlement: Option<(i64, Settlement)>,
    /// The latest confirmations, oldest first (at most [`CONFIRMATIONS_KEPT_MAX`]).
    pub confirmations: VecDeque<Confirmation>,
    pub confirmations_total: u32,
    /// A dispute was opened on its charge (the charge's `disputed`).
    pub disputed: bool,
}

impl PaymentIntent {
    pub fn render(&self) -> Value {
        json!({
            "id": self.id,
            "object": "payment_intent",
            "amount": self.amount,
            "amount_capturable": 0,
            "amount_received": self.amount_received,
            "application": null,
            "application_fee_amount": null,
            "automatic_payment_methods": null,
            "canceled_at": self.canceled_at,
            "cancellation_reason": self.cancellation_reason,
            "capture_method": self.capture_method,
            "client_secret": self.client_secret,
            "confirmation_method": "automatic",
            "created": self.created,
            "currency": self.currency,
            "customer": self.customer,
            "description": self.description,
            "last_payment_error": self.last_payment_error,
            "latest_charge": self.latest_charge,
            "livemode": false,
            "metadata": self.metadata,
            "next_action": self.next_action,
            "on_behalf_of": null,
            "payment_method": self.payment_method,
            "payment_method_types": ["card"],
            "processing": null,
            "receipt_email": null,
            "review": null,
            "setup_future_usage": null,
            "shipping": null,
            "source": null,
            "statement_descriptor": null,
            "statement_descriptor_suffix": null,
            "status": self.status.as_str(),
            "transfer_data": null,
            "transfer_group": null,
        })
    }

    /// The charge behind a succeeded intent, as `charge.refunded` carries it.
    pub fn render_charge(&self) -> Option<Value> {
        let charge = self.latest_charge.as_ref()?;
        Some(json!({
            "id": charge,
            "object": "charge",
            "amount": self.amount,
            "amount_captured": self.amount_received,
            "amount_refunded": self.amount_refunded,
            "billing_details": {"address": null, "email": null, "name": null, "phone": null, "tax_id": null},
            "captured": self.amount_received > 0,
            "created": self.created,
            "currency": self.currency,
            "customer": self.customer,
            "description": self.description,
            "disputed": self.disputed,
            "livemode": false,
            "metadata": self.metadata,
            "paid": self.status == PaymentIntentStatus::Succeeded,
            "payment_intent": self.id,
            "payment_method": self.payment_method,
            "refunded": self.amount_refunded > 0 && self.amount_refunded >= self.amount_received,
            "status": if self.amount_received > 0 { "succeeded" } else { "failed" },
        }))
    }

    /// The card error of a decline: the 402 body carries the intent as it now is.
    pub fn decline_error(
        &self,
        code: &'static str,
        decline_code: &'static str,
        message: &str,
    ) -> ApiError {
        let mut error = ApiError::new(402, ErrorType::Card, message).with_code(code);
        error.decline_code = Some(decline_code);
        error.charge = self.latest_charge.clone();
        error.payment_intent = Some(Box::new(self.render()));
        error
    }

    /// `last_payment_error` of a decline (Stripe omits the intent itself there).
    pub fn set_declined(&mut self, code: &'static str, decline_code: &'static str, message: &str) {
        self.status = PaymentIntentStatus::RequiresPaymentMethod;
        self.amount_received = 0;
        let mut error = ApiError::new(402, ErrorType::Card, message).with_code(code);
        error.decline_code = Some(decline_code);
        error.charge = self.latest_charge.clone();
        self.last_payment_error = error.body().get("error").cloned();
    }

    pub fn set_succeeded(&mut self) {
        self.status = PaymentIntentStatus::Succeeded;
        self.amount_received = self.amount;
        self.next_action = None;
        self.last_payment_error = None;
    }

    /// Records a confirmation that just ran, with the status it left.
    pub fn record_confirmation(&mut self, idempotency_key: Option<String>, now: i64) {
        if self.confirmations.len() >= CONFIRMATIONS_KEPT_MAX {
            self.confirmations.pop_front();
        }
        self.confirmations.push_back(Confirmation {
            idempotency_key,
            payment_method: self.payment_method.clone().unwrap_or_default(),
            status: self.status.as_str().to_owned(),
            created: now,
        });
        self.confirmations_total = self.confirmations_total.saturating_add(1);
    }

    pub fn refundable(&self) -> i64 {
        self.amount_received - self.amount_refunded
    }
}

/// Stripe's refund states the simulator models (`requires_action` and `canceled` are not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefundStatus {
    /// Created while pending mode is on; counts against the refundable amount until it
    /// settles (`/_sim/refunds/{id}/settle`) or fails.
    Pending,
    Succeeded,
    /// Failed, before or after it succeeded: the money is back on the charge.
    Failed,
}

impl RefundStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
        }
    }

    /// Whether the refund holds part of the charge (not refundable again).
    pub fn holds_amount(self) -> bool {
        matches!(self, Self::Pending | Self::Succeeded)
    }
}

/// The test payment method whose refunds succeed, then fail later (Stripe's card
/// 4000000000005126).
pub const REFUND_FAIL_PAYMENT_METHOD: &str = "pm_card_refundFail";
/// The `failure_reason` a refund of [`REFUND_FAIL_PAYMENT_METHOD`] fails with, and the
/// default of the fail control.
pub const REFUND_FAILURE_REASON_DEFAULT: &str = "expired_or_canceled_card";

#[derive(Debug, Clone)]
pub struct Refund {
    pub seq: u64,
    pub id: String,
    pub amount: i64,
    pub currency: String,
    pub charge: Option<String>,
    pub payment_intent: String,
    pub metadata: BTreeMap<String, String>,
    pub reason: Option<String>,
    pub status: RefundStatus,
    pub failure_reason: Option<String>,
    pub created: i64,
    pub idempotency_key: Option<String>,
    /// When (sim clock) the refund fails by itself (refunds of `pm_card_refundFail`).
    pub fails_at: Option<i64>,
}

impl Refund {
    pub fn render(&self) -> Value {
        json!({
            "id": self.id,
            "object": "refund",
            "amount": self.amount,
            "balance_transaction": null,
            "charge": self.charge,
            "created": self.created,
            "currency": self.currency,
            "failure_reason": self.failure_reason,
            "metadata": self.metadata,
            "payment_intent": self.payment_intent,
            "reason": self.reason,
            "receipt_number": null,
            "source_transfer_reversal": null,
            "status": self.status.as_str(),
            "transfer_reversal": null,
        })
    }
}

/// Stripe's dispute states the simulator reaches: opened `needs_response`, closed `won` or
/// `lost` by a control call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DisputeStatus {
    NeedsResponse,
    Won,
    Lost,
}

impl DisputeStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NeedsResponse => "needs_response",
            Self::Won => "won",
            Self::Lost => "lost",
        }
    }
}

/// Stripe's dispute reasons.
pub const DISPUTE_REASONS: [&str; 15] = [
    "bank_cannot_process",
    "check_returned",
    "credit_not_processed",
    "customer_initiated",
    "debit_not_authorized",
    "duplicate",
    "fraudulent",
    "general",
    "incorrect_account_details",
    "insufficient_funds",
    "noncompliant",
    "product_not_received",
    "product_unacceptable",
    "subscription_canceled",
    "unrecognized",
];

#[derive(Debug, Clone)]
pub struct Dispute {
    pub seq: u64,
    pub id: String,
    pub amount: i64,
    pub currency: String,
    pub charge: String,
    pub payment_intent: String,
    pub reason: String,
    pub status: DisputeStatus,
    pub created: i64,
}

impl Dispute {
    pub fn render(&self) -> Value {
        json!({
            "id": self.id,
            "object": "dispute",
            "amount": self.amount,
            "balance_transactions": [],
            "charge": self.charge,
            "created": self.created,
            "currency": self.currency,
            "enhanced_eligibility_types": [],
            "evidence": { "enhanced_evidence": {} },
            "evidence_details": {
                "due_by": null,
                "enhanced_eligibility": {},
                "has_evidence": false,
                "past_due": false,
                "submission_count": 0,
            },
            "is_charge_refundable": false,
            "livemode": false,
            "metadata": {},
            "payment_intent": self.payment_intent,
            "reason": self.reason,
            "status": self.status.as_str(),
        })
    }
}
