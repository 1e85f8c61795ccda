//! Decided outcomes kept in memory, so a duplicate of a decided operation is answered without a
//! database round trip. Duplicates come in storms (a queue redelivering a backlog), and each one
//! through the database costs more than the whole charge path of a gRPC call.
//!
//! Only terminal attempts are kept. Their status, provider object, failure, parameters and
//! fingerprint never change again (SEMANTICS.md, monotonic state), so what is served from here is
//! the stored outcome. What can still change on a terminal row — the review flag, `updated_at` —
//! is served at most `ttl` old; `GetAttempt` always reads the database. Each process keeps its
//! own entries, bounded by the approximate bytes they hold.

use std::sync::Arc;
use std::time::{Duration, Instant};

use quick_cache::sync::Cache;
use quick_cache::{Equivalent, Weighter};

use crate::domain::{Attempt, ConsumerName, OperationKey};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutcomeCacheSettings {
    /// How long an entry answers before the database is asked again. Zero turns the cache off.
    pub ttl: Duration,
    /// Approximate bytes all entries may hold together. Zero turns the cache off.
    pub bytes_max: u64,
}

/// What every entry costs before its strings: the `Attempt` and its `Arc` header, the key and
/// entry in the cache's slot, and the cache's own bookkeeping per item.
const ENTRY_FIXED_BYTES: u64 = (size_of::<Attempt>() + size_of::<CacheKey>() + size_of::<Entry>() + 96) as u64;
/// One allocated node of a `BTreeMap<String, String>`.
const BTREE_NODE_BYTES: u64 = 560;
/// A typical entry (a charge with a little metadata), to size the cache's table.
const TYPICAL_ENTRY_BYTES: u64 = 1_536;

pub struct OutcomeCache {
    entries: Option<Cache<CacheKey, Entry, ApproximateBytes>>,
    ttl: Duration,
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct CacheKey {
    consumer: ConsumerName,
    operation_key: OperationKey,
}

/// A lookup without cloning the strings; hashes exactly as `CacheKey` does.
#[derive(Hash)]
struct CacheKeyRef<'a> {
    consumer: &'a ConsumerName,
    operation_key: &'a OperationKey,
}

impl Equivalent<CacheKey> for CacheKeyRef<'_> {
    fn equivalent(&self, key: &CacheKey) -> bool {
        *self.consumer == key.consumer && *self.operation_key == key.operation_key
    }
}

#[derive(Clone)]
struct Entry {
    attempt: Arc<Attempt>,
    cached_at: Instant,
    /// Computed once: the cache asks for it on every eviction.
    bytes: u64,
}

#[derive(Clone)]
struct ApproximateBytes;

impl Weighter<CacheKey, Entry> for ApproximateBytes {
    fn weight(&self, _key: &CacheKey, entry: &Entry) -> u64 {
        entry.bytes
    }
}

impl OutcomeCache {
    pub fn new(settings: OutcomeCacheSettings) -> Self {
        let enabled = !settings.ttl.is_zero() && settings.bytes_max > 0;
        let entries = enabled.then(|| {
            let estimated_items = (settings.bytes_max / TYPICAL_ENTRY_BYTES).max(1) as usize;
            Cache::with_weighter(estimated_items, settings.bytes_max, ApproximateBytes)
        });
        Self { entries, ttl: settings.ttl }
    }

    /// The decided attempt of this consumer's operation, if this process saw it decided less
    /// than `ttl` ago.
    pub fn get(&self, consumer: &ConsumerName, operation_key: &OperationKey) -> Option<Attempt> {
        let entries = self.entries.as_ref()?;
        let key = CacheKeyRef { consumer, operation_key };
        let entry = entries.get(&key);
        let fresh = entry.filter(|entry| entry.cached_at.elapsed() < self.ttl);
        let result = if fresh.is_some() { "hit" } else { "miss" };
        metrics::counter!("chargeguard_outcome_cache_lookups_total", "result" => result).increment(1);
        fresh.map(|entry| Attempt::clone(&entry.attempt))
    }

    /// Keeps a terminal attempt as read from (or just written to) the database; anything else
    /// is not an outcome and is ignored.
    pub fn remember(&self, attempt: &Attempt) {
        let Some(entries) = &self.entries else { return };
        if !attempt.status.is_terminal() {
            return;
        }
        let key = CacheKey {
            consumer: attempt.consumer.clone(),
            operation_key: attempt.operation_key.clone(),
        };
        let entry = Entry {
            attempt: Arc::new(attempt.clone()),
            cached_at: Instant::now(),
            bytes: approximate_bytes(attempt),
        };
        // An entry heavier than the whole cache is refused by the cache itself.
        entries.insert(key, entry);
    }

    /// Drops the operation's entry: its row was just changed in this process (a webhook flagged
    /// it), so the next duplicate reads the database.
    pub fn forget(&self, consumer: &ConsumerName, operation_key: &OperationKey) {
        if let Some(entries) = &self.entries {
            entries.remove(&CacheKeyRef { consumer, operation_key });
        }
    }

    /// Entries held (expired ones included until they are evicted or replaced).
    pub fn len(&self) -> usize {
        self.entries.as_ref().map_or(0, Cache::len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Approximate bytes the entries hold.
    pub fn weight(&self) -> u64 {
        self.entries.as_ref().map_or(0, Cache::weight)
    }
}

/// What one entry costs in memory, counted the way the allocator sees it: the `Attempt` behind
/// its `Arc`, every non-empty string as its own allocation, the metadata map's nodes, and the
/// key's copies of the consumer and operation key. Checked once against the process's resident
/// size: 50,000 entries shaped like the benchmark's charges took 1,789 bytes each and were
/// estimated at 1,855.
fn approximate_bytes(attempt: &Attempt) -> u64 {
    let params = &attempt.params;
    let optional = |value: Option<&str>| value.map_or(0, heap_bytes);
    let metadata = params.metadata.entries();
    let metadata_strings: u64 = metadata.iter().map(|(key, value)| heap_bytes(key) + heap_bytes(value)).sum();
    // A B-tree leaf holds up to 11 pairs; allocated nodes are about half full.
    let metadata_nodes = (metadata.len() as u64).div_ceil(6) * BTREE_NODE_BYTES;
    let failure = attempt.failure.as_ref().map_or(0, |failure| heap_bytes(&failure.code) + heap_bytes(&failure.message));
    let next_action = attempt.next_action.as_ref().map_or(0, |action| {
        heap_bytes(&action.kind) + optional(action.redirect_url.as_deref())
    });
    let key = heap_bytes(attempt.consumer.as_str()) + heap_bytes(attempt.operation_key.as_str());
    ENTRY_FIXED_BYTES
        + key * 2
        + heap_bytes(&attempt.provider)
        + optional(attempt.provider_payment_id.as_deref())
        + optional(attempt.provider_status.as_deref())
        + heap_bytes(attempt.idempotency_key.as_str())
        + heap_bytes(attempt.fingerprint.as_str())
        + failure
        + next_action
        + optional(attempt.review_reason.as_deref())
        + optional(attempt.last_error.as_deref())
        + heap_bytes(params.payment_method.as_str())
        + optional(params.customer.as_ref().map(|customer| customer.as_str()))
        + optional(params.description.as_ref().map(|description| description.as_str()))
        + metadata_strings
        + metadata_nodes
}

/// A heap string's allocation: its bytes rounded up the way malloc does, plus malloc's header.
fn heap_bytes(value: &str) -> u64 {
    if value.is_empty() { 0 } else { (value.len() as u64).div_ceil(16) * 16 + 16 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::AttemptStatus;
    use crate::domain::fixtures::pending_attempt;

    fn attempt_with_status(status: AttemptStatus) -> Attempt {
        Attempt { status, ..pending_attempt(chrono::Utc::now()) }
    }

    fn settings(ttl: Duration, bytes_max: u64) -> OutcomeCacheSettings {
        OutcomeCacheSettings { ttl, bytes_max }
    }

    fn cache() -> OutcomeCache {
        OutcomeCache::new(settings(Duration::from_secs(60), 1 << 20))
    }

    #[test]
    fn a_terminal_attempt_is_answered_from_memory() {
        let cache = cache();
        for status in [AttemptStatus::Succeeded, AttemptStatus::Failed] {
            let attempt = attempt_with_status(status);
            cache.remember(&attempt);
            let cached = cache.get(&attempt.consumer, &attempt.operation_key).expect("cached");
            assert_eq!(cached.id, attempt.id);
            assert_eq!(cached.status, status);
        }
    }

    #[test]
    fn an_undecided_attempt_is_never_kept() {
        let cache = cache();
        for status in [AttemptStatus::Pending, AttemptStatus::RequiresAction] {
            let attempt = attempt_with_status(status);
            cache.remember(&attempt);
            assert!(cache.get(&attempt.consumer, &attempt.operation_key).is_none(), "{status:?}");
        }
        assert!(cache.is_empty());
    }

    #[test]
    fn another_consumer_does_not_see_the_entry() {
        let cache = cache();
        let attempt = attempt_with_status(AttemptStatus::Succeeded);
        cache.remember(&attempt);
        let other = ConsumerName::parse("another-service").unwrap();
        assert!(cache.get(&other, &attempt.operation_key).is_none());
        let other_operation = OperationKey::parse("another-operation").unwrap();
        assert!(cache.get(&attempt.consumer, &other_operation).is_none());
    }

    #[test]
    fn a_forgotten_entry_is_a_miss() {
        let cache = cache();
        let attempt = attempt_with_status(AttemptStatus::Succeeded);
        cache.remember(&attempt);
        cache.forget(&attempt.consumer, &attempt.operation_key);
        assert!(cache.get(&attempt.consumer, &attempt.operation_key).is_none());
    }

    #[test]
    fn an_entry_older_than_the_ttl_is_a_miss() {
        let cache = OutcomeCache::new(settings(Duration::from_millis(30), 1 << 20));
        let attempt = attempt_with_status(AttemptStatus::Succeeded);
        cache.remember(&attempt);
        std::thread::sleep(Duration::from_millis(60));
        assert!(cache.get(&attempt.consumer, &attempt.operation_key).is_none());
    }

    #[test]
    fn zero_ttl_or_zero_bytes_turns_it_off() {
        for off in [settings(Duration::ZERO, 1 << 20), settings(Duration::from_secs(60), 0)] {
            let cache = OutcomeCache::new(off);
            let attempt = attempt_with_status(AttemptStatus::Succeeded);
            cache.remember(&attempt);
            assert!(cache.get(&attempt.consumer, &attempt.operation_key).is_none());
            assert_eq!(cache.len(), 0);
        }
    }

    #[test]
    fn the_bytes_held_stay_within_the_bound() {
        let bytes_max = 64 * 1_024;
        let cache = OutcomeCache::new(settings(Duration::from_secs(60), bytes_max));
        for index in 0..1_000 {
            let mut attempt = attempt_with_status(AttemptStatus::Succeeded);
            attempt.operation_key = OperationKey::parse(&format!("order-{index}:charge")).unwrap();
            cache.remember(&attempt);
        }
        assert!(cache.weight() <= bytes_max, "{} > {bytes_max}", cache.weight());
        assert!(cache.len() < 1_000, "older entries are evicted");
        assert!(cache.len() > 10, "the bound holds many small entries");
    }
}

