//! proto ⇄ domain. Parsing into domain types is where validation happens: a value that leaves
//! this module is valid, and an invalid one names its field.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::proto;
use crate::domain::{
    Attempt, AttemptId, AttemptKind, AttemptNumber, AttemptStatus, ChargeParams, ChargeRequest,
    ChargeSelector, Currency, CustomerId, Description, InvalidField, Metadata, OperationKey,
    PaymentMethodId, RefundReason, RefundRequest,
};
use crate::orchestrator::{AttemptSelector, ChargeOutcome};
use crate::store::{ListFilter, RefundTotals};

pub fn charge_request(request: &proto::ChargeRequest, amount_minor_max: i64) -> Result<ChargeRequest, InvalidField> {
    let operation_key = OperationKey::parse(&request.operation_key)?;
    let attempt = AttemptNumber::parse(request.attempt)?;
    let currency = Currency::parse(&request.currency)?;
    let payment_method = PaymentMethodId::parse(&request.payment_method)?;
    let customer = request.customer.as_deref().map(CustomerId::parse).transpose()?;
    let description = request.description.as_deref().map(Description::parse).transpose()?;
    let metadata = Metadata::parse(&request.metadata)?;
    let params = ChargeParams::new(
        request.amount_minor,
        amount_minor_max,
        currency,
        payment_method,
        customer,
        description,
        metadata,
    )?;
    Ok(ChargeRequest { operation_key, attempt, params })
}

pub fn refund_request(request: &proto::RefundRequest) -> Result<RefundRequest, InvalidField> {
    use proto::refund_request::Charge;
    let operation_key = OperationKey::parse(&request.operation_key)?;
    let renamed = |field: &'static str| move |error: InvalidField| InvalidField { field, ..error };
    let charge = match &request.charge {
        Some(Charge::ChargeAttemptId(id)) => {
            attempt_id(id).map(ChargeSelector::AttemptId).map_err(renamed("charge_attempt_id"))?
        }
        Some(Charge::ChargeOperationKey(key)) => OperationKey::parse(key)
            .map(ChargeSelector::OperationKey)
            .map_err(renamed("charge_operation_key"))?,
        None => return Err(InvalidField::new("charge", "set charge_attempt_id or charge_operation_key")),
    };
    let reason = request
        .reason
        .as_deref()
        .map(|reason| {
            RefundReason::parse(reason).ok_or_else(|| {
                InvalidField::new("reason", "must be duplicate, fraudulent or requested_by_customer")
            })
        })
        .transpose()?;
    let metadata = Metadata::parse(&request.metadata)?;
    RefundRequest::new(operation_key, charge, request.amount_minor, reason, metadata)
}

pub fn attempt_id(value: &str) -> Result<AttemptId, InvalidField> {
    Uuid::parse_str(value)
        .map(AttemptId::from_uuid)
        .map_err(|_| InvalidField::new("attempt_id", "must be a UUID"))
}

pub fn selector(request: &proto::GetAttemptRequest) -> Result<AttemptSelector, InvalidField> {
    use proto::get_attempt_request::Selector;
    match &request.selector {
        Some(Selector::AttemptId(id)) => attempt_id(id).map(AttemptSelector::Id),
        Some(Selector::OperationKey(key)) => OperationKey::parse(key).map(AttemptSelector::OperationKey),
        None => Err(InvalidField::new("selector", "set attempt_id or operation_key")),
    }
}

pub(super) fn time_from_proto(field: &'static str, value: &prost_types::Timestamp) -> Result<DateTime<Utc>, InvalidField> {
    let nanos = u32::try_from(value.nanos).map_err(|_| InvalidField::new(field, "nanos must not be negative"))?;
    DateTime::from_timestamp(value.seconds, nanos).ok_or_else(|| InvalidField::new(field, "out of range"))
}

pub fn time_to_proto(value: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp { seconds: value.timestamp(), nanos: value.timestamp_subsec_nanos() as i32 }
}

pub fn list_filter(request: &proto::ListAttemptsRequest) -> Result<ListFilter, InvalidField> {
    let status = match proto::AttemptStatus::try_from(request.status) {
        Ok(proto::AttemptStatus::Unspecified) => None,
        Ok(proto::AttemptStatus::Pending) => Some(AttemptStatus::Pending),
        Ok(proto::AttemptStatus::Succeeded) => Some(AttemptStatus::Succeeded),
        Ok(proto::AttemptStatus::Failed) => Some(AttemptStatus::Failed),
        Ok(proto::AttemptStatus::RequiresAction) => Some(AttemptStatus::RequiresAction),
        Err(_) => return Err(InvalidField::new("status", format!("unknown value {}", request.status))),
    };
    let created_from = request.created_from.as_ref().map(|t| time_from_proto("created_from", t)).transpose()?;
    let created_to = request.created_to.as_ref().map(|t| time_from_proto("created_to", t)).transpose()?;
    if let (Some(from), Some(to)) = (created_from, created_to)
        && from >= to
    {
        return Err(InvalidField::new("created_to", "must be after created_from"));
    }
    let operation_key = match request.operation_key.as_str() {
        "" => None,
        key => Some(OperationKey::parse(key)?),
    };
    let kind = match proto::AttemptKind::try_from(request.kind) {
        Ok(proto::AttemptKind::Unspecified) => None,
        Ok(proto::AttemptKind::Charge) => Some(AttemptKind::Charge),
        Ok(proto::AttemptKind::Refund) => Some(AttemptKind::Refund),
        Err(_) => return Err(InvalidField::new("kind", format!("unknown value {}", request.kind))),
    };
    Ok(ListFilter { status, operation_key, kind, created_from, created_to })
}

pub fn page_size(requested: u32, default: u32, max: u32) -> Result<u32, InvalidField> {
    match requested {
        0 => Ok(default),
        size if size > max => Err(InvalidField::new("page_size", format!("must be at most {max}"))),
        size => Ok(size),
    }
}

pub(super) fn status_to_proto(status: AttemptStatus) -> proto::AttemptStatus {
    match status {
        AttemptStatus::Pending => proto::AttemptStatus::Pending,
        AttemptStatus::RequiresAction => proto::AttemptStatus::RequiresAction,
        AttemptStatus::Succeeded => proto::AttemptStatus::Succeeded,
        AttemptStatus::Failed => proto::AttemptStatus::Failed,
    }
}

pub fn outcome_to_proto(outcome: ChargeOutcome) -> proto::ChargeOutcome {
    match outcome {
        ChargeOutcome::Applied => proto::ChargeOutcome::Applied,
        ChargeOutcome::Duplicate => proto::ChargeOutcome::Duplicate,
        ChargeOutcome::Reconciled => proto::ChargeOutcome::Reconciled,
    }
}

pub fn attempt_to_proto(attempt: &Attempt) -> proto::Attempt {
    let kind = match attempt.kind {
        AttemptKind::Charge => proto::AttemptKind::Charge,
        AttemptKind::Refund => proto::AttemptKind::Refund,
    };
    proto::Attempt {
        attempt_id: attempt.id.to_string(),
        consumer: attempt.consumer.to_string(),
        operation_key: attempt.operation_key.to_string(),
        kind: kind as i32,
        amount_minor: attempt.params.amount_minor,
        currency: attempt.params.currency.code().to_owned(),
        status: status_to_proto(attempt.status) as i32,
        provider: attempt.provider.clone(),
        provider_payment_id: attempt.provider_payment_id.clone().unwrap_or_default(),
        idempotency_key: attempt.idempotency_key.as_str().to_owned(),
        generation: attempt.generation,
        failure_code: attempt.failure.as_ref().map(|f| f.code.clone()).unwrap_or_default(),
        failure_message: attempt.failure.as_ref().map(|f| f.message.clone()).unwrap_or_default(),
        next_action: attempt.next_action.as_ref().map(|action| proto::NextAction {
            r#type: action.kind.clone(),
            redirect_url: action.redirect_url.clone().unwrap_or_default(),
        }),
        created_at: Some(time_to_proto(attempt.created_at)),
        updated_at: Some(time_to_proto(attempt.updated_at)),
        provider_calls: attempt.provider_calls,
        payment_method: attempt.params.payment_method.as_str().to_owned(),
        customer: attempt.params.customer.as_ref().map(|c| c.as_str().to_owned()),
        description: attempt.params.description.as_ref().map(|d| d.as_str().to_owned()),
        metadata: attempt.params.metadata.entries().iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        needs_review: attempt.review_reason.is_some(),
        review_reason: attempt.review_reason.clone().unwrap_or_default(),
        provider_status: attempt.provider_status.clone().unwrap_or_default(),
        attempt_number: attempt.attempt_number(),
        parent_attempt_id: attempt.parent_attempt_id.map(|id| id.to_string()).unwrap_or_default(),
        refund_reason: attempt.refund_reason.map(|reason| reason.as_str().to_owned()).unwrap_or_default(),
        // A charge's refund totals come from `attempt_with_refunds`.
        refunded_minor: 0,
        refund_pending_minor: 0,
        refund_failed_after_success: attempt.failed_after_success_at.is_some(),
    }
}

/// An attempt with its refunds summed (a charge's; a refund or an unrefunded charge has none).
pub fn attempt_with_refunds(attempt: &Attempt, totals: Option<&RefundTotals>) -> proto::Attempt {
    let totals = totals.copied().unwrap_or_default();
    proto::Attempt {
        refunded_minor: totals.refunded_minor,
        refund_pending_minor: totals.pending_minor,
        ..attempt_to_proto(attempt)
    }
}
