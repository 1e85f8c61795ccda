use std::collections::HashMap;

use sha2::{Digest, Sha256};
use tonic::metadata::MetadataMap;

use crate::config::ConsumerConfig;
use crate::domain::ConsumerName;

/// Maps bearer tokens to consumers. Holds only the tokens' SHA-256, so a dump of the process's
/// configuration never yields a usable token.
#[derive(Clone, Default)]
pub struct Authenticator {
    consumers_by_token_hash: HashMap<String, ConsumerName>,
}

/// Lowercase hex SHA-256 of a token, as configuration stores it.
pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Why a call was not authenticated. The message never repeats what the caller sent.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("missing authorization metadata: send \"authorization: Bearer <token>\"")]
    Missing,
    #[error("malformed authorization metadata: expected \"Bearer <token>\"")]
    Malformed,
    #[error("unknown bearer token")]
    Unknown,
}

impl Authenticator {
    pub fn from_config(consumers: &[ConsumerConfig]) -> Result<Self, crate::domain::InvalidField> {
        let mut consumers_by_token_hash = HashMap::new();
        for consumer in consumers {
            let name = ConsumerName::parse(&consumer.name)?;
            consumers_by_token_hash.insert(consumer.token_sha256.to_ascii_lowercase(), name);
        }
        Ok(Self { consumers_by_token_hash })
    }

    pub fn authenticate(&self, metadata: &MetadataMap) -> Result<ConsumerName, AuthError> {
        let token = bearer_token(metadata)?;
        self.consumers_by_token_hash.get(&hash_token(token)).cloned().ok_or(AuthError::Unknown)
    }
}

/// The token of the `authorization: Bearer <token>` metadata.
pub(super) fn bearer_token(metadata: &MetadataMap) -> Result<&str, AuthError> {
    let header = metadata.get("authorization").ok_or(AuthError::Missing)?;
    let header = header.to_str().map_err(|_| AuthError::Malformed)?;
    let token = header
        .strip_prefix("Bearer ")
        .or_else(|| header.strip_prefix("bearer "))
        .ok_or(AuthError::Malformed)?
        .trim();
    if token.is_empty() {
        return Err(AuthError::Malformed);
    }
    Ok(token)
}
