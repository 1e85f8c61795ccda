use super::InvalidField;

/// The authenticated caller. Comes from configuration (the token's owner), never from a request
/// field a caller could set to another service's name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConsumerName(String);

pub const CONSUMER_NAME_LENGTH_MAX: usize = 64;

impl ConsumerName {
    pub fn parse(value: &str) -> Result<Self, InvalidField> {
        let valid_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        if value.is_empty() || value.len() > CONSUMER_NAME_LENGTH_MAX {
            return Err(InvalidField::new(
                "consumer",
                format!("must be 1-{CONSUMER_NAME_LENGTH_MAX} characters"),
            ));
        }
        if !value.chars().all(valid_char) {
            return Err(InvalidField::new("consumer", "may contain only A-Z a-z 0-9 - _ ."));
        }
        Ok(Self(value.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ConsumerName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The business operation a consumer wants done once, e.g. `order-1234:charge`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OperationKey(String);

pub const OPERATION_KEY_LENGTH_MAX: usize = 200;

impl OperationKey {
    pub fn parse(value: &str) -> Result<Self, InvalidField> {
        if value.is_empty() {
            return Err(InvalidField::new("operation_key", "is required"));
        }
        if value.len() > OPERATION_KEY_LENGTH_MAX {
            return Err(InvalidField::new(
                "operation_key",
                format!("must be at most {OPERATION_KEY_LENGTH_MAX} characters"),
            ));
        }
        // Printable ASCII only: the key appears in logs, provider metadata and reports, where
        // control characters and look-alike Unicode would hide real differences between keys.
        if !value.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
            return Err(InvalidField::new("operation_key", "must be printable ASCII"));
        }
        Ok(Self(value.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for OperationKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_key_bounds() {
        assert!(OperationKey::parse("order-1234:charge").is_ok());
        assert!(OperationKey::parse(&"k".repeat(200)).is_ok());
        assert_eq!(OperationKey::parse("").unwrap_err().field, "operation_key");
        assert!(OperationKey::parse(&"k".repeat(201)).is_err());
        assert!(OperationKey::parse("tab\there").is_err());
        assert!(OperationKey::parse("caf\u{e9}").is_err());
    }

    #[test]
    fn consumer_name_rejects_odd_characters() {
        assert!(ConsumerName::parse("orders-service").is_ok());
        assert!(ConsumerName::parse("orders service").is_err());
        assert!(ConsumerName::parse("").is_err());
    }
}
