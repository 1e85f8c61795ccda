//! Stripe's idempotency layer: a response is saved per (secret key, idempotency key) once
//! execution begins; a retry replays it; different parameters are an `idempotency_error`; a
//! retry while the first is still executing gets 409; keys are pruned once at least the TTL old.

use std::collections::{HashMap, VecDeque};

use sha2::{Digest, Sha256};

use super::wire::{ApiError, ErrorType, StoredResponse};

/// Stripe's limit on the key length.
pub const KEY_LENGTH_MAX: usize = 255;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Scope {
    api_key: String,
    key: String,
}

#[derive(Debug)]
enum Slot {
    Executing,
    Done(StoredResponse),
}

#[derive(Debug)]
struct Entry {
    /// SHA-256 of the method, path and parameters of the first request: only compared, never
    /// shown, and far smaller than their text in a store that keeps a key per object made.
    fingerprint: [u8; 32],
    created_at: i64,
    slot: Slot,
}

/// What to do with a request that carries a key.
#[derive(Debug)]
pub enum Admission {
    /// First use (or the old entry was pruned): execute, then [`IdempotencyStore::complete`].
    Execute,
    /// Replay the saved response.
    Replay(StoredResponse),
    /// Answer with this error (mismatch, key in use, store full); nothing is saved.
    Reject(ApiError),
}

#[derive(Debug)]
pub struct IdempotencyStore {
    entries: HashMap<Scope, Entry>,
    /// Keys in creation order, for pruning; may hold scopes already removed.
    by_age: VecDeque<(i64, Scope)>,
    ttl_seconds: i64,
    keys_max: usize,
}

impl IdempotencyStore {
    pub fn new(ttl_seconds: u64, keys_max: usize) -> Self {
        Self {
            entries: HashMap::new(),
            by_age: VecDeque::new(),
            ttl_seconds: i64::try_from(ttl_seconds).unwrap_or(i64::MAX),
            keys_max,
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Removes keys at least the TTL old at `now` (sim clock).
    pub fn prune(&mut self, now: i64) {
        while let Some((created_at, _)) = self.by_age.front() {
            if now.saturating_sub(*created_at) < self.ttl_seconds {
                break;
            }
            let Some((created_at, scope)) = self.by_age.pop_front() else {
                break;
            };
            if self
                .entries
                .get(&scope)
                .is_some_and(|entry| entry.created_at == created_at)
            {
                self.entries.remove(&scope);
            }
        }
    }

    pub fn admit(&mut self, api_key: &str, key: &str, fingerprint: &str, now: i64) -> Admission {
        self.prune(now);
        let scope = Scope {
            api_key: api_key.to_owned(),
            key: key.to_owned(),
        };
        let fingerprint: [u8; 32] = Sha256::digest(fingerprint.as_bytes()).into();
        if let Some(entry) = self.entries.get(&scope) {
            return match &entry.slot {
                Slot::Executing => Admission::Reject(
                    ApiError::new(
                        409,
                        ErrorType::InvalidRequest,
                        format!(
                            "There is currently another in-progress request using this Idempotent Key \
                             (that probably means you submitted twice, and the other request is still going \
                             through): {key}. Please try again later."
                        ),
                    )
                    .with_code("idempotency_key_in_use"),
                ),
                Slot::Done(_) if entry.fingerprint != fingerprint => Admission::Reject(ApiError::new(
                    400,
                    ErrorType::Idempotency,
                    format!(
                        "Keys for idempotent requests can only be used with the same parameters they were \
                         first used with. Try using a key other than '{key}' if you meant to execute a \
                         different request."
                    ),
                )),
                Slot::Done(response) => Admission::Replay(response.clone()),
            };
        }
        if self.entries.len() >= self.keys_max {
            return Admission::Reject(ApiError::new(
                429,
                ErrorType::InvalidRequest,
                "The simulator holds its maximum number of idempotency keys; advance the clock past their \
                 TTL or raise idempotency_keys_max.",
            )
            .with_code("rate_limit"));
        }
        self.entries.insert(
            scope.clone(),
            Entry {
                fingerprint,
                created_at: now,
                slot: Slot::Executing,
            },
        );
        self.by_age.push_back((now, scope));
        Admission::Execute
    }

    /// Saves the response of an executed request.
    pub fn complete(&mut self, api_key: &str, key: &str, response: StoredResponse) {
        let scope = Scope {
            api_key: api_key.to_owned(),
            key: key.to_owned(),
        };
        if let Some(entry) = self.entries.get_mut(&scope) {
            entry.slot = Slot::Done(response);
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn done(store: &mut IdempotencyStore, key: &str, fingerprint: &str, now: i64) {
        assert!(matches!(
            store.admit("sk", key, fingerprint, now),
            Admission::Execute
        ));
        store.complete("sk", key, StoredResponse::ok(&json!({"id": key})));
    }

    #[test]
    fn replays_rejects_mismatch_and_in_use() {
        let mut store = IdempotencyStore::new(100, 10);
        done(&mut store, "a", "f1", 0);
        assert!(matches!(
            store.admit("sk", "a", "f1", 1),
            Admission::Replay(_)
        ));
        assert!(matches!(store.admit("sk", "a", "f2", 1), Admission::Reject(e) if e.status == 400));
        assert!(matches!(
            store.admit("other", "a", "f2", 1),
            Admission::Execute
        ));
        assert!(
            matches!(store.admit("other", "a", "f2", 1), Admission::Reject(e) if e.status == 409)
        );
    }

    #[test]
    fn prunes_at_ttl_and_bounds_keys() {
        let mut store = IdempotencyStore::new(100, 1);
        done(&mut store, "a", "f1", 0);
        assert!(
            matches!(store.admit("sk", "b", "f1", 99), Admission::Reject(e) if e.status == 429)
        );
        assert!(matches!(
            store.admit("sk", "a", "f1", 99),
            Admission::Replay(_)
        ));
        assert!(matches!(
            store.admit("sk", "a", "f2", 100),
            Admission::Execute
        ));
        assert_eq!(store.len(), 1);
    }
}
