//! The service's time source. Everything that compares instants (key windows, leases, backoff)
//! reads this, so tests can jump the service's clock as they jump the simulator's.

use std::sync::atomic::{AtomicI64, Ordering};

use chrono::{DateTime, Duration, Utc};

pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> DateTime<Utc>;

    /// How far this clock has been moved together with every other clock of the system (the
    /// database's, the provider's): zero for a real clock. The store adds it to the database's
    /// own reading, so that a test that jumps time jumps it everywhere at once.
    fn shift(&self) -> Duration {
        Duration::zero()
    }
}

#[derive(Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// Real time plus an adjustable offset: time keeps flowing, and a test can jump it forward.
/// By default a jump moves the whole system's time (`shift`): the database's reading moves with
/// it. Beside a database whose own clock the test moves for real, only the process's clock is
/// this clock's to move.
#[derive(Debug, Default)]
pub struct OffsetClock {
    offset_ms: AtomicI64,
    database_moves_itself: bool,
}

impl OffsetClock {
    /// For a database whose clock the test moves itself (a cluster under libfaketime).
    pub fn beside_a_moving_database() -> Self {
        Self { offset_ms: AtomicI64::new(0), database_moves_itself: true }
    }

    pub fn advance(&self, by: Duration) {
        self.offset_ms.fetch_add(by.num_milliseconds(), Ordering::SeqCst);
    }
}

impl OffsetClock {
    fn offset(&self) -> Duration {
        Duration::milliseconds(self.offset_ms.load(Ordering::SeqCst))
    }
}

impl Clock for OffsetClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now() + self.offset()
    }

    fn shift(&self) -> Duration {
        if self.database_moves_itself { Duration::zero() } else { self.offset() }
    }
}
