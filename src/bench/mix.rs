//! Which operation a load-generator call sends: a new operation key, or a duplicate — the key of
//! an operation that was already charged, re-sent the way a queue redelivers an event.

use std::sync::Arc;

use rand::Rng;

/// What one call is meant to exercise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallKind {
    /// A key never sent before: insert, provider call, record.
    New,
    /// A key whose charge already finished: the stored outcome comes back.
    Duplicate,
}

impl CallKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CallKind::New => "new",
            CallKind::Duplicate => "duplicate",
        }
    }
}

/// Share of duplicates in the mix, in percent (0–100).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DuplicatePercent(u8);

impl DuplicatePercent {
    pub const MAX: u8 = 100;

    pub fn new(percent: u8) -> Option<Self> {
        (percent <= Self::MAX).then_some(Self(percent))
    }

    pub fn get(self) -> u8 {
        self.0
    }

    /// Draws the next call's kind. A duplicate needs a charged key: while none exists, the call
    /// is new (so a 100 % duplicate run without priming starts by charging one key).
    pub fn choose(self, rng: &mut impl Rng, pool_is_empty: bool) -> CallKind {
        if pool_is_empty || self.0 == 0 {
            return CallKind::New;
        }
        if rng.gen_range(0..u32::from(Self::MAX)) < u32::from(self.0) {
            CallKind::Duplicate
        } else {
            CallKind::New
        }
    }
}

/// Keys of operations that were charged, bounded: once full, a new key replaces a random old
/// one, so duplicates keep hitting a spread of rows however long the run.
#[derive(Debug)]
pub struct KeyPool {
    keys: Vec<Arc<str>>,
    capacity: usize,
}

impl KeyPool {
    pub fn new(capacity: usize) -> Self {
        assert!(capacity > 0, "a key pool holds at least one key");
        Self {
            keys: Vec::with_capacity(capacity.min(1 << 16)),
            capacity,
        }
    }

    pub fn insert(&mut self, key: Arc<str>, rng: &mut impl Rng) {
        if self.keys.len() < self.capacity {
            self.keys.push(key);
        } else {
            let slot = rng.gen_range(0..self.keys.len());
            self.keys[slot] = key;
        }
    }

    pub fn pick(&self, rng: &mut impl Rng) -> Option<Arc<str>> {
        if self.keys.is_empty() {
            return None;
        }
        Some(self.keys[rng.gen_range(0..self.keys.len())].clone())
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    use super::*;

    #[test]
    fn the_mix_follows_the_percentage() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let percent = DuplicatePercent::new(30).unwrap();
        let duplicates = (0..10_000)
            .filter(|_| percent.choose(&mut rng, false) == CallKind::Duplicate)
            .count();
        assert!((2_700..3_300).contains(&duplicates), "{duplicates}");
    }

    #[test]
    fn no_duplicate_without_a_charged_key_and_none_at_zero_percent() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let all = DuplicatePercent::new(100).unwrap();
        assert_eq!(all.choose(&mut rng, true), CallKind::New);
        assert_eq!(all.choose(&mut rng, false), CallKind::Duplicate);
        let none = DuplicatePercent::new(0).unwrap();
        assert!((0..1_000).all(|_| none.choose(&mut rng, false) == CallKind::New));
        assert!(DuplicatePercent::new(101).is_none());
    }

    #[test]
    fn the_pool_stays_within_its_capacity_and_keeps_recent_keys() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut pool = KeyPool::new(3);
        assert!(pool.pick(&mut rng).is_none());
        for n in 0..100 {
            pool.insert(Arc::from(format!("k{n}")), &mut rng);
        }
        assert_eq!(pool.len(), 3);
        let picked = pool.pick(&mut rng).unwrap();
        assert!(picked.starts_with('k'));
    }
}
