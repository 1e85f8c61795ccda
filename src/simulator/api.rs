//! `/v1` routes and their parameters, validated into typed operations. A request rejected here
//! never reaches the idempotency layer, so nothing is saved under its key (as Stripe does).

use std::collections::BTreeMap;

use super::PAGE_SIZE_MAX;
use super::faults::Endpoint;
use super::wire::{ApiError, Param, Params};

/// Stripe's largest amount (eight digits).
const AMOUNT_MAX: i64 = 99_999_999;
const METADATA_KEYS_MAX: usize = 50;
const METADATA_KEY_LENGTH_MAX: usize = 40;
const METADATA_VALUE_LENGTH_MAX: usize = 500;
const DESCRIPTION_LENGTH_MAX: usize = 1_000;
const LIST_LIMIT_DEFAULT: usize = 10;
/// Options of a confirmation (on create or on its own) accepted for compatibility and not
/// modelled; they still count for idempotency.
const CONFIRM_OPTIONS_UNMODELLED: [&str; 7] = [
    "payment_method_types",
    "off_session",
    "receipt_email",
    "setup_future_usage",
    "error_on_requires_action",
    "use_stripe_sdk",
    "payment_method_options",
];

/// Finds the endpoint of a `/v1` path; the second value is the object id in the path.
pub fn route(method: &http::Method, path: &str) -> Option<(Endpoint, Option<String>)> {
    let segments: Vec<&str> = path.strip_prefix("/v1/")?.split('/').collect();
    let get = method == http::Method::GET;
    let post = method == http::Method::POST;
    let endpoint = match segments.as_slice() {
        ["payment_intents"] if post => (Endpoint::CreatePaymentIntent, None),
        ["payment_intents"] if get => (Endpoint::ListPaymentIntents, None),
        ["payment_intents", "search"] if get => (Endpoint::SearchPaymentIntents, None),
        ["payment_intents", id] if get && !id.is_empty() => {
            (Endpoint::RetrievePaymentIntent, Some(*id))
        }
        ["payment_intents", id, "cancel"] if post && !id.is_empty() => {
            (Endpoint::CancelPaymentIntent, Some(*id))
        }
        ["payment_intents", id, "confirm"] if post && !id.is_empty() => {
            (Endpoint::ConfirmPaymentIntent, Some(*id))
        }
        ["refunds"] if post => (Endpoint::CreateRefund, None),
        ["refunds"] if get => (Endpoint::ListRefunds, None),
        ["refunds", id] if get && !id.is_empty() => (Endpoint::RetrieveRefund, Some(*id)),
        _ => return None,
    };
    Some((endpoint.0, endpoint.1.map(str::to_owned)))
}

#[derive(Debug, Clone)]
pub struct CreatePaymentIntent {
    pub amount: i64,
    pub currency: String,
    pub confirm: bool,
    pub payment_method: Option<String>,
    pub metadata: BTreeMap<String, String>,
    pub description: Option<String>,
    pub customer: Option<String>,
    pub capture_method: String,
    pub return_url: Option<String>,
}

/// `POST /v1/payment_intents/{id}/confirm`: Stripe's way to pay an intent that has no
/// successful payment yet (after a decline, or one created without `confirm=true`).
#[derive(Debug, Clone)]
pub struct ConfirmPaymentIntent {
    pub id: String,
    /// Replaces the intent's payment method; absent, the intent's own is used.
    pub payment_method: Option<String>,
    pub return_url: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct CreatedRange {
    pub gt: Option<i64>,
    pub gte: Option<i64>,
    pub lt: Option<i64>,
    pub lte: Option<i64>,
}

impl CreatedRange {
    pub fn contains(&self, created: i64) -> bool {
        self.gt.is_none_or(|bound| created > bound)
            && self.gte.is_none_or(|bound| created >= bound)
            && self.lt.is_none_or(|bound| created < bound)
            && self.lte.is_none_or(|bound| created <= bound)
    }
}

#[derive(Debug, Clone)]
pub struct ListQuery {
    pub created: CreatedRange,
    pub limit: usize,
    pub starting_after: Option<String>,
    pub ending_before: Option<String>,
    /// Refunds only.
    pub payment_intent: Option<String>,
}

#[derive(Debug, Clone)]
pub struct SearchQuery {
    pub query: super::search::Query,
    pub limit: usize,
    pub page: Option<String>,
}

#[derive(Debug, Clone)]
pub struct CreateRefund {
    pub payment_intent: Option<String>,
    pub charge: Option<String>,
    pub amount: Option<i64>,
    pub metadata: BTreeMap<String, String>,
    pub reason: Option<String>,
}

#[derive(Debug, Clone)]
pub enum Operation {
    CreatePaymentIntent(CreatePaymentIntent),
    RetrievePaymentIntent(String),
    CancelPaymentIntent { id: String, reason: Option<String> },
    ConfirmPaymentIntent(ConfirmPaymentIntent),
    ListPaymentIntents(ListQuery),
    SearchPaymentIntents(SearchQuery),
    CreateRefund(CreateRefund),
    RetrieveRefund(String),
    ListRefunds(ListQuery),
}

impl Operation {
    pub fn parse(
        endpoint: Endpoint,
        id: Option<String>,
        mut params: Params,
    ) -> Result<Self, ApiError> {
        params.ignore("expand");
        let id = || id.clone().unwrap_or_default();
        let operation = match endpoint {
            Endpoint::CreatePaymentIntent => {
                Self::CreatePaymentIntent(parse_create_payment_intent(&mut params)?)
            }
            Endpoint::RetrievePaymentIntent => {
                params.ignore("client_secret");
                Self::RetrievePaymentIntent(id())
            }
            Endpoint::CancelPaymentIntent => {
                let reason = params.take_string("cancellation_reason")?;
                if let Some(reason) = &reason
                    && ![
                        "duplicate",
                        "fraudulent",
                        "requested_by_customer",
                        "abandoned",
                    ]
                    .contains(&reason.as_str())
                {
                    return Err(invalid_enum("cancellation_reason", reason));
                }
                Self::CancelPaymentIntent { id: id(), reason }
            }
            Endpoint::ConfirmPaymentIntent => {
                Self::ConfirmPaymentIntent(parse_confirm_payment_intent(id(), &mut params)?)
            }
            Endpoint::ListPaymentIntents => {
                params.ignore("customer");
                Self::ListPaymentIntents(parse_list(&mut params)?)
            }
            Endpoint::SearchPaymentIntents => {
                let raw = params.take_required_string("query")?;
                let query = super::search::Query::parse(&raw).map_err(|reason| {
                    ApiError::invalid_request(
                        Some("query"),
                        format!("Invalid search query: {reason}."),
                    )
                })?;
                let limit = parse_limit(&mut params)?;
                let page = params.take_string("page")?;
                Self::SearchPaymentIntents(SearchQuery { query, limit, page })
            }
            Endpoint::CreateRefund => Self::CreateRefund(parse_create_refund(&mut params)?),
            Endpoint::RetrieveRefund => Self::RetrieveRefund(id()),
            Endpoint::ListRefunds => {
                let mut query = parse_list(&mut params)?;
                query.payment_intent = params.take_string("payment_intent")?;
                Self::ListRefunds(query)
            }
        };
        params.finish()?;
        Ok(operation)
    }
}

fn invalid_enum(param: &str, value: &str) -> ApiError {
    ApiError::invalid_request(
        Some(param),
        format!("Invalid {param}: must be one of the documented values, not {value:?}."),
    )
}

fn parse_amount(params: &mut Params, name: &str) -> Result<Option<i64>, ApiError> {
    let Some(amount) = params.take_i64(name)? else {
        return Ok(None);
    };
    if amount < 1 {
        return Err(ApiError::invalid_request(
            Some(name),
            "Amount must be at least 1 (the smallest currency unit).",
        )
        .with_code("amount_too_small"));
    }
    if amount > AMOUNT_MAX {
        return Err(ApiError::invalid_request(
            Some(name),
            format!("Amount must be no more than {AMOUNT_MAX}."),
        )
        .with_code("amount_too_large"));
    }
    Ok(Some(amount))
}

fn parse_metadata(params: &mut Params) -> Result<BTreeMap<String, String>, ApiError> {
    let metadata = params.take_string_map("metadata")?.unwrap_or_default();
    if metadata.len() > METADATA_KEYS_MAX {
        return Err(ApiError::invalid_request(
            Some("metadata"),
            format!("You can only specify up to {METADATA_KEYS_MAX} keys in metadata."),
        ));
    }
    for (key, value) in &metadata {
        if key.is_empty() || key.chars().count() > METADATA_KEY_LENGTH_MAX {
            return Err(ApiError::invalid_request(
                Some("metadata"),
                format!("Metadata keys must be 1 to {METADATA_KEY_LENGTH_MAX} characters long."),
            ));
        }
        if value.chars().count() > METADATA_VALUE_LENGTH_MAX {
            return Err(ApiError::invalid_request(
                Some(&format!("metadata[{key}]")),
                format!("Metadata values can have up to {METADATA_VALUE_LENGTH_MAX} characters."),
            ));
        }
    }
    // An empty value unsets a key; on create that means "absent".
    Ok(metadata
        .into_iter()
        .filter(|(_, value)| !value.is_empty())
        .collect())
}

fn parse_create_payment_intent(params: &mut Params) -> Result<CreatePaymentIntent, ApiError> {
    let amount = parse_amount(params, "amount")?.ok_or_else(|| ApiError::missing("amount"))?;
    let currency = params.take_required_string("currency")?;
    if currency.len() != 3 || !currency.chars().all(|c| c.is_ascii_alphabetic()) {
        return Err(ApiError::invalid_request(
            Some("currency"),
            format!("Invalid currency: {currency}."),
        ));
    }
    let confirm = params.take_bool("confirm")?.unwrap_or(false);
    let payment_method = params
        .take_string("payment_method")?
        .filter(|pm| !pm.is_empty());
    if confirm && payment_method.is_none() {
        return Err(ApiError::invalid_request(
            Some("payment_method"),
            "You cannot confirm this PaymentIntent because it's missing a payment method. Pass payment_method \
             with confirm=true.",
        )
        .with_code("parameter_missing"));
    }
    let capture_method = params
        .take_string("capture_method")?
        .unwrap_or_else(|| "automatic_async".into());
    if capture_method != "automatic" && capture_method != "automatic_async" {
        return Err(ApiError::invalid_request(
            Some("capture_method"),
            "The simulator supports capture_method automatic and automatic_async only.",
        ));
    }
    let description = params.take_string("description")?;
    if description
        .as_ref()
        .is_some_and(|text| text.chars().count() > DESCRIPTION_LENGTH_MAX)
    {
        return Err(ApiError::invalid_request(
            Some("description"),
            "The description is too long.",
        ));
    }
    for name in CONFIRM_OPTIONS_UNMODELLED.into_iter().chain([
        "automatic_payment_methods",
        "confirmation_method",
        "statement_descriptor",
        "statement_descriptor_suffix",
    ]) {
        params.ignore(name);
    }
    Ok(CreatePaymentIntent {
        amount,
        currency: currency.to_ascii_lowercase(),
        confirm,
        payment_method,
        metadata: parse_metadata(params)?,
        description,
        customer: params.take_string("customer")?,
        capture_method,
        return_url: params.take_string("return_url")?,
    })
}

fn parse_confirm_payment_intent(
    id: String,
    params: &mut Params,
) -> Result<ConfirmPaymentIntent, ApiError> {
    for name in CONFIRM_OPTIONS_UNMODELLED {
        params.ignore(name);
    }
    Ok(ConfirmPaymentIntent {
        id,
        payment_method: params
            .take_string("payment_method")?
            .filter(|pm| !pm.is_empty()),
        return_url: params.take_string("return_url")?,
    })
}

fn parse_limit(params: &mut Params) -> Result<usize, ApiError> {
    match params.take_i64("limit")? {
        None => Ok(LIST_LIMIT_DEFAULT),
        Some(limit) => usize::try_from(limit)
            .ok()
            .filter(|limit| (1..=PAGE_SIZE_MAX).contains(limit))
            .ok_or_else(|| {
                ApiError::invalid_request(
                    Some("limit"),
                    format!("This value must be between 1 and {PAGE_SIZE_MAX}."),
                )
            }),
    }
}

fn parse_timestamp(raw: &str, param: &str) -> Result<i64, ApiError> {
    raw.parse::<i64>().map_err(|_| {
        ApiError::invalid_request(
            Some(param),
            format!("Invalid timestamp: {param} must be a unix timestamp."),
        )
    })
}

fn parse_list(params: &mut Params) -> Result<ListQuery, ApiError> {
    let mut created = CreatedRange::default();
    match params.take_param("created") {
        None => {}
        Some(Param::Value(raw)) => {
            let exact = parse_timestamp(&raw, "created")?;
            created.gte = Some(exact);
            created.lte = Some(exact);
        }
        Some(Param::Map(bounds)) => {
            for (name, value) in bounds {
                let param = format!("created[{name}]");
                let Param::Value(raw) = value else {
                    return Err(ApiError::invalid_request(
                        Some(&param),
                        "Invalid timestamp.",
                    ));
                };
                let bound = Some(parse_timestamp(&raw, &param)?);
                match name.as_str() {
                    "gt" => created.gt = bound,
                    "gte" => created.gte = bound,
                    "lt" => created.lt = bound,
                    "lte" => created.lte = bound,
                    _ => {
                        return Err(ApiError::invalid_request(
                            Some(&param),
                            format!("Received unknown parameter: {param}"),
                        )
                        .with_code("parameter_unknown"));
                    }
                }
            }
        }
    }
    let limit = parse_limit(params)?;
    let starting_after = params.take_string("starting_after")?;
    let ending_before = params.take_string("ending_before")?;
    if starting_after.is_some() && ending_before.is_some() {
        return Err(ApiError::invalid_request(
            Some("ending_before"),
            "You may only specify one of these parameters: starting_after, ending_before.",
        )
        .with_code("parameters_exclusive"));
    }
    Ok(ListQuery {
        created,
        limit,
        starting_after,
        ending_before,
        payment_intent: None,
    })
}

fn parse_create_refund(params: &mut Params) -> Result<CreateRefund, ApiError> {
    let payment_intent = params
        .take_string("payment_intent")?
        .filter(|id| !id.is_empty());
    let charge = params.take_string("charge")?.filter(|id| !id.is_empty());
    match (&payment_intent, &charge) {
        (None, None) => return Err(ApiError::missing("payment_intent")),
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid_request(
                Some("charge"),
                "You may only specify one of these parameters: charge, payment_intent.",
            )
            .with_code("parameters_exclusive"));
        }
        _ => {}
    }
    let reason = params.take_string("reason")?;
    if let Some(reason) = &reason
        && !["duplicate", "fraudulent", "requested_by_customer"].contains(&reason.as_str())
    {
        return Err(invalid_enum("reason", reason));
    }
    Ok(CreateRefund {
        payment_intent,
        charge,
        amount: parse_amount(params, "amount")?,
        metadata: parse_metadata(params)?,
        reason,
    })
}
