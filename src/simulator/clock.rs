//! The simulator clock: wall time plus an offset that only a control call moves (forward).

use std::sync::atomic::{AtomicI64, Ordering};

/// The sim clock never moves by more than this in one call (100 years), so the offset cannot
/// overflow whatever a client sends.
pub const ADVANCE_SECONDS_MAX: u64 = 100 * 365 * 24 * 60 * 60;

#[derive(Debug, Default)]
pub struct SimClock {
    offset_seconds: AtomicI64,
}

impl SimClock {
    /// Unix seconds of the sim clock.
    pub fn now(&self) -> i64 {
        wall_clock_seconds() + self.offset_seconds.load(Ordering::SeqCst)
    }

    /// Moves the clock forward; returns the new time.
    pub fn advance(&self, seconds: u64) -> Result<i64, String> {
        if seconds > ADVANCE_SECONDS_MAX {
            return Err(format!(
                "cannot advance the clock by more than {ADVANCE_SECONDS_MAX} s"
            ));
        }
        let seconds = i64::try_from(seconds).map_err(|_| "advance out of range".to_owned())?;
        self.offset_seconds
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |offset| {
                offset.checked_add(seconds)
            })
            .map_err(|_| "the clock cannot move that far".to_owned())?;
        Ok(self.now())
    }
}

/// Real unix seconds (used for webhook signatures, which receivers check against their clock).
pub fn wall_clock_seconds() -> i64 {
    chrono::Utc::now().timestamp()
}
