use sha2::{Digest, Sha256};

use super::{ConsumerName, OperationKey};

/// The key sent to the provider. Derived only from the operation's identity and the generation,
/// never from a delivery id, so every redelivery of one operation sends the same key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

/// Stripe accepts keys of at most 255 characters.
pub const IDEMPOTENCY_KEY_LENGTH_MAX: usize = 255;

impl IdempotencyKey {
    pub fn from_stored(value: String) -> Self {
        Self(value)
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// `cg1-<sha256(consumer, operation key)>-g<generation>`: fixed length whatever the operation
/// key holds, and different consumers can never collide on one key.
pub fn derive_idempotency_key(
    consumer: &ConsumerName,
    operation_key: &OperationKey,
    generation: u32,
) -> IdempotencyKey {
    let mut hasher = Sha256::new();
    for part in [consumer.as_str(), operation_key.as_str()] {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part.as_bytes());
    }
    let key = format!("cg1-{}-g{generation}", hex::encode(hasher.finalize()));
    debug_assert!(key.len() <= IDEMPOTENCY_KEY_LENGTH_MAX);
    IdempotencyKey(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(consumer: &str, operation: &str, generation: u32) -> IdempotencyKey {
        derive_idempotency_key(
            &ConsumerName::parse(consumer).unwrap(),
            &OperationKey::parse(operation).unwrap(),
            generation,
        )
    }

    #[test]
    fn deterministic_and_distinct() {
        assert_eq!(key("a", "order-1", 0), key("a", "order-1", 0));
        assert_ne!(key("a", "order-1", 0), key("b", "order-1", 0));
        assert_ne!(key("a", "order-1", 0), key("a", "order-2", 0));
        assert_ne!(key("a", "order-1", 0), key("a", "order-1", 1));
        // The length prefix keeps ("ab", "c") and ("a", "bc") apart.
        assert_ne!(key("ab", "c", 0), key("a", "bc", 0));
    }

    #[test]
    fn fits_the_provider_limit() {
        let longest = key(&"c".repeat(64), &"k".repeat(200), u32::MAX);
        assert!(longest.as_str().len() <= IDEMPOTENCY_KEY_LENGTH_MAX);
    }
}
