//! Clocks for [`MemoryStore`](crate::MemoryStore). Leases, backoff, deadlines
//! and retention are measured on the *store's* clock, never a worker's; a
//! [`ManualClock`] lets tests move that clock without sleeping.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use time::OffsetDateTime;

/// A source of the current instant.
///
/// ```
/// use taskfence::clock::{Clock, SystemClock};
/// let now = SystemClock.now();
/// assert!(now.year() >= 2024);
/// ```
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current instant.
    fn now(&self) -> OffsetDateTime;
}

/// The system's wall clock.
///
/// ```
/// let _ = taskfence::MemoryStore::with_clock(taskfence::clock::SystemClock);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> OffsetDateTime {
        OffsetDateTime::now_utc()
    }
}

/// A clock that only moves when told to. Clones share the same instant.
///
/// ```
/// use std::time::Duration;
/// use taskfence::clock::{Clock, ManualClock};
/// let clock = ManualClock::new(time::macros::datetime!(2026-01-01 0:00 UTC));
/// let before = clock.now();
/// clock.advance(Duration::from_secs(31));
/// assert_eq!(clock.now() - before, time::Duration::seconds(31));
/// ```
#[derive(Clone)]
pub struct ManualClock(Arc<Mutex<OffsetDateTime>>);

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: OffsetDateTime) -> Self {
        Self(Arc::new(Mutex::new(start)))
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        let mut now = self.0.lock().unwrap_or_else(|e| e.into_inner());
        *now += by;
    }

    /// Sets the clock to `at` (which may be in the past).
    pub fn set(&self, at: OffsetDateTime) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = at;
    }
}

impl Default for ManualClock {
    /// A clock standing at the current system time.
    fn default() -> Self {
        Self::new(OffsetDateTime::now_utc())
    }
}

impl Clock for ManualClock {
    fn now(&self) -> OffsetDateTime {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ManualClock").field(&self.now()).finish()
    }
}
