use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use super::{AttemptNumber, Currency, InvalidField, OperationKey};

pub const PAYMENT_METHOD_LENGTH_MAX: usize = 255;
pub const CUSTOMER_LENGTH_MAX: usize = 255;
pub const DESCRIPTION_LENGTH_MAX: usize = 1000;
/// Stripe allows 50 metadata keys; chargeguard keeps 3 of them for itself.
pub const METADATA_KEYS_MAX: usize = 47;
pub const METADATA_KEY_LENGTH_MAX: usize = 40;
pub const METADATA_VALUE_LENGTH_MAX: usize = 500;
/// Metadata keys the caller may not set: chargeguard writes them to find objects again.
pub const RESERVED_METADATA_PREFIX: &str = "chargeguard_";

fn is_provider_id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// A provider payment method id such as `pm_card_visa`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentMethodId(String);

impl PaymentMethodId {
    pub fn parse(value: &str) -> Result<Self, InvalidField> {
        parse_provider_id("payment_method", value, PAYMENT_METHOD_LENGTH_MAX).map(Self)
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A provider customer id such as `cus_123`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CustomerId(String);

impl CustomerId {
    pub fn parse(value: &str) -> Result<Self, InvalidField> {
        parse_provider_id("customer", value, CUSTOMER_LENGTH_MAX).map(Self)
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn parse_provider_id(
    field: &'static str,
    value: &str,
    length_max: usize,
) -> Result<String, InvalidField> {
    if value.is_empty() {
        return Err(InvalidField::new(field, "is required"));
    }
    if value.len() > length_max {
        return Err(InvalidField::new(field, format!("must be at most {length_max} characters")));
    }
    if !value.chars().all(is_provider_id_char) {
        return Err(InvalidField::new(field, "may contain only A-Z a-z 0-9 _"));
    }
    Ok(value.to_owned())
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Description(String);

impl Description {
    pub fn parse(value: &str) -> Result<Self, InvalidField> {
        if value.chars().count() > DESCRIPTION_LENGTH_MAX {
            return Err(InvalidField::new(
                "description",
                format!("must be at most {DESCRIPTION_LENGTH_MAX} characters"),
            ));
        }
        if value.chars().any(char::is_control) {
            return Err(InvalidField::new("description", "must not contain control characters"));
        }
        Ok(Self(value.to_owned()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Caller metadata, sorted by key so that equal maps hash equally.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Metadata(BTreeMap<String, String>);

impl Metadata {
    pub fn parse<'a>(
        entries: impl IntoIterator<Item = (&'a String, &'a String)>,
    ) -> Result<Self, InvalidField> {
        let mut map = BTreeMap::new();
        for (key, value) in entries {
            if map.len() == METADATA_KEYS_MAX {
                return Err(InvalidField::new(
                    "metadata",
                    format!("at most {METADATA_KEYS_MAX} keys"),
                ));
            }
            if key.is_empty() || key.len() > METADATA_KEY_LENGTH_MAX {
                return Err(InvalidField::new(
                    "metadata",
                    format!("key {key:?} must be 1-{METADATA_KEY_LENGTH_MAX} characters"),
                ));
            }
            if key.contains(['[', ']']) || key.chars().any(char::is_control) {
                return Err(InvalidField::new(
                    "metadata",
                    format!("key {key:?} must not contain brackets or control characters"),
                ));
            }
            if key.starts_with(RESERVED_METADATA_PREFIX) {
                return Err(InvalidField::new(
                    "metadata",
                    format!("key {key:?} uses the reserved prefix {RESERVED_METADATA_PREFIX:?}"),
                ));
            }
            if value.chars().count() > METADATA_VALUE_LENGTH_MAX {
                return Err(InvalidField::new(
                    "metadata",
                    format!("value of {key:?} must be at most {METADATA_VALUE_LENGTH_MAX} characters"),
                ));
            }
            map.insert(key.clone(), value.clone());
        }
        Ok(Self(map))
    }

    /// Rebuilds metadata that was validated before it was stored.
    pub fn from_stored(map: BTreeMap<String, String>) -> Self {
        Self(map)
    }

    pub fn entries(&self) -> &BTreeMap<String, String> {
        &self.0
    }
}

/// Everything that must match when an operation is requested again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChargeParams {
    pub amount_minor: i64,
    pub currency: Currency,
    pub payment_method: PaymentMethodId,
    pub customer: Option<CustomerId>,
    pub description: Option<Description>,
    pub metadata: Metadata,
}

impl ChargeParams {
    /// Checks the amount against the configured maximum; the other parts arrive validated.
    pub fn new(
        amount_minor: i64,
        amount_minor_max: i64,
        currency: Currency,
        payment_method: PaymentMethodId,
        customer: Option<CustomerId>,
        description: Option<Description>,
        metadata: Metadata,
    ) -> Result<Self, InvalidField> {
        if amount_minor <= 0 {
            return Err(InvalidField::new("amount_minor", "must be greater than 0"));
        }
        if amount_minor > amount_minor_max {
            return Err(InvalidField::new(
                "amount_minor",
                format!("must be at most {amount_minor_max}"),
            ));
        }
        Ok(Self { amount_minor, currency, payment_method, customer, description, metadata })
    }

    /// A hash of every parameter; two requests for one operation must have the same one.
    pub fn fingerprint(&self) -> Fingerprint {
        let mut hasher = Sha256::new();
        // Length-prefixed fields, so that no two different requests share an encoding.
        let mut field = |bytes: &[u8]| {
            hasher.update((bytes.len() as u64).to_be_bytes());
            hasher.update(bytes);
        };
        field(b"charge.v1");
        field(&self.amount_minor.to_be_bytes());
        field(self.currency.code().as_bytes());
        field(self.payment_method.as_str().as_bytes());
        field(self.customer.as_ref().map_or("\0none", |c| c.as_str()).as_bytes());
        field(self.description.as_ref().map_or("\0none", |d| d.as_str()).as_bytes());
        field(&(self.metadata.entries().len() as u64).to_be_bytes());
        for (key, value) in self.metadata.entries() {
            field(key.as_bytes());
            field(value.as_bytes());
        }
        Fingerprint(hex::encode(hasher.finalize()))
    }

    /// The names of the fields whose values differ, for an error a person can act on.
    pub fn differing_fields(&self, other: &ChargeParams) -> Vec<&'static str> {
        let mut fields = Vec::new();
        if self.amount_minor != other.amount_minor {
            fields.push("amount_minor");
        }
        if self.currency != other.currency {
            fields.push("currency");
        }
        if self.payment_method != other.payment_method {
            fields.push("payment_method");
        }
        if self.customer != other.customer {
            fields.push("customer");
        }
        if self.description != other.description {
            fields.push("description");
        }
        if self.metadata != other.metadata {
            fields.push("metadata");
        }
        fields
    }
}

/// A hex SHA-256 of the request parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint(String);

impl Fingerprint {
    pub fn from_stored(value: String) -> Self {
        Self(value)
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A validated charge request: the operation, which attempt of it this is, and its parameters.
/// The operation and the attempt number identify the request; the parameters must match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChargeRequest {
    pub operation_key: OperationKey,
    pub attempt: AttemptNumber,
    pub params: ChargeParams,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(amount_minor: i64) -> ChargeParams {
        ChargeParams::new(
            amount_minor,
            1_000_000,
            Currency::parse("usd").unwrap(),
            PaymentMethodId::parse("pm_card_visa").unwrap(),
            None,
            None,
            Metadata::default(),
        )
        .unwrap()
    }

    #[test]
    fn fingerprint_is_stable_and_sensitive() {
        assert_eq!(params(100).fingerprint(), params(100).fingerprint());
        assert_ne!(params(100).fingerprint(), params(101).fingerprint());
        let mut with_description = params(100);
        with_description.description = Some(Description::parse("x").unwrap());
        assert_ne!(params(100).fingerprint(), with_description.fingerprint());
    }

    #[test]
    fn differing_fields_names_each_field() {
        let mut other = params(200);
        other.currency = Currency::parse("eur").unwrap();
        assert_eq!(params(100).differing_fields(&other), vec!["amount_minor", "currency"]);
        assert!(params(100).differing_fields(&params(100)).is_empty());
    }

    #[test]
    fn amount_bounds() {
        let build = |amount| {
            ChargeParams::new(
                amount,
                500,
                Currency::parse("usd").unwrap(),
                PaymentMethodId::parse("pm_card_visa").unwrap(),
                None,
                None,
                Metadata::default(),
            )
        };
        assert_eq!(build(0).unwrap_err().field, "amount_minor");
        assert_eq!(build(-1).unwrap_err().field, "amount_minor");
        assert_eq!(build(501).unwrap_err().field, "amount_minor");
        assert!(build(500).is_ok());
    }

    #[test]
    fn metadata_rejects_reserved_and_oversized() {
        let reserved = [("chargeguard_attempt_id".to_string(), "x".to_string())];
        assert!(Metadata::parse(reserved.iter().map(|(k, v)| (k, v))).is_err());
        let long_value = [("k".to_string(), "v".repeat(501))];
        assert!(Metadata::parse(long_value.iter().map(|(k, v)| (k, v))).is_err());
        let too_many: Vec<(String, String)> =
            (0..48).map(|i| (format!("k{i}"), "v".to_string())).collect();
        assert!(Metadata::parse(too_many.iter().map(|(k, v)| (k, v))).is_err());
    }

    #[test]
    fn provider_ids_are_checked() {
        assert!(PaymentMethodId::parse("pm_card_visa").is_ok());
        assert_eq!(PaymentMethodId::parse("").unwrap_err().field, "payment_method");
        assert!(PaymentMethodId::parse("pm card").is_err());
        assert_eq!(CustomerId::parse("cus/1").unwrap_err().field, "customer");
    }
}
