//! Waits between the retries of `*_until_decided`.

use std::time::Duration;

/// Exponential backoff with full jitter: the wait before retry `n` (0-based) is uniform in
/// `[0, min(max, initial × multiplier^n)]`, so many consumers retrying after one outage spread
/// out instead of arriving together.
#[derive(Clone, Debug, PartialEq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
    pub multiplier: f64,
    /// Retries after the first call; `*_until_decided` makes at most `max_retries + 1` calls.
    pub max_retries: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { initial: Duration::from_millis(100), max: Duration::from_secs(10), multiplier: 2.0, max_retries: 8 }
    }
}

impl Backoff {
    /// The upper bound of the wait before retry `retry`: `min(max, initial × multiplier^retry)`.
    pub fn ceiling(&self, retry: u32) -> Duration {
        let exponent = i32::try_from(retry).unwrap_or(i32::MAX);
        let seconds = self.initial.as_secs_f64() * self.multiplier.powi(exponent);
        // An overflow (inf) or a nonsensical multiplier (NaN) is capped like a large wait.
        if !seconds.is_finite() || seconds >= self.max.as_secs_f64() {
            return self.max;
        }
        Duration::from_secs_f64(seconds.max(0.0)).min(self.max)
    }

    /// The wait before retry `retry` (0-based): uniform in `[0, ceiling(retry)]`.
    pub fn delay(&self, retry: u32, rng: &mut impl rand::Rng) -> Duration {
        let ceiling_nanos = u64::try_from(self.ceiling(retry).as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(rng.gen_range(0..=ceiling_nanos))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn the_ceiling_grows_by_the_multiplier_up_to_max() {
        let backoff = Backoff::default();
        assert_eq!(backoff.ceiling(0), Duration::from_millis(100));
        assert_eq!(backoff.ceiling(1), Duration::from_millis(200));
        assert_eq!(backoff.ceiling(3), Duration::from_millis(800));
        assert_eq!(backoff.ceiling(6), Duration::from_millis(6_400));
        assert_eq!(backoff.ceiling(7), Duration::from_secs(10));
        assert_eq!(backoff.ceiling(u32::MAX), Duration::from_secs(10));
        for retry in 0..64 {
            assert!(backoff.ceiling(retry) <= backoff.ceiling(retry + 1), "retry {retry}");
        }
    }

    #[test]
    fn a_delay_is_within_zero_and_the_ceiling_and_spreads() {
        let backoff = Backoff::default();
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for retry in [0, 1, 4, 7, 30, u32::MAX] {
            let ceiling = backoff.ceiling(retry);
            let delays: Vec<_> = (0..1_000).map(|_| backoff.delay(retry, &mut rng)).collect();
            assert!(delays.iter().all(|delay| *delay <= ceiling), "retry {retry}");
            assert!(delays.iter().all(|delay| *delay <= backoff.max), "retry {retry}");
            // Full jitter: both halves of [0, ceiling] are used.
            assert!(delays.iter().any(|delay| *delay < ceiling / 2), "retry {retry}");
            assert!(delays.iter().any(|delay| *delay > ceiling / 2), "retry {retry}");
        }
    }

    #[test]
    fn a_zero_initial_or_a_huge_multiplier_stays_bounded() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let zero = Backoff { initial: Duration::ZERO, ..Backoff::default() };
        assert_eq!(zero.delay(5, &mut rng), Duration::ZERO);
        let huge = Backoff { multiplier: f64::MAX, ..Backoff::default() };
        assert_eq!(huge.ceiling(2), huge.max);
        assert!(huge.delay(2, &mut rng) <= huge.max);
    }
}
