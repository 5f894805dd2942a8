//! Simulated time. Every duration in the demo is written in *simulated* time
//! (a lease of 30 s, a provider call of 4 s); the timebase maps it onto the
//! store's clock.
//!
//! - [`Timebase::Virtual`] (the default, on `MemoryStore`): the simulation moves
//!   a [`ManualClock`] from event to event. Nothing sleeps, leases expire the
//!   instant the simulation says so, and the same seed replays the same run.
//! - [`Timebase::Real`] (PostgreSQL, or `--real-time`): the store reads a real
//!   clock, so the simulation sleeps until each event is due, with time running
//!   [`REAL_TIME_SCALE`] times faster than shown (a 30 s lease lasts 300 ms).
//!   Events can land a little late, so runs are not exactly reproducible; the
//!   guarantees hold all the same, because the store decides, not the timing.

use std::time::Duration;

use taskfence::clock::ManualClock;
use time::OffsetDateTime;

/// How many times faster than shown real time runs in [`Timebase::Real`].
pub const REAL_TIME_SCALE: u32 = 100;

/// Where simulated time comes from; see the module docs.
#[derive(Debug, Clone)]
pub enum Timebase {
    /// A manual store clock, moved by the simulation.
    Virtual {
        /// The clock the store reads.
        clock: ManualClock,
        /// The store instant of simulated time zero.
        start: OffsetDateTime,
    },
    /// Real time, scaled by [`REAL_TIME_SCALE`].
    Real {
        /// The monotonic instant of simulated time zero.
        start: tokio::time::Instant,
        /// The wall-clock instant of simulated time zero (stores report wall time).
        wall_start: OffsetDateTime,
    },
}

impl Timebase {
    /// A virtual timebase and the clock to give the store. It starts at a
    /// fixed instant so that a replay is identical, timestamps included.
    pub fn new_virtual() -> (Self, ManualClock) {
        let start = time::macros::datetime!(2026-01-01 09:00 UTC);
        let clock = ManualClock::new(start);
        (
            Self::Virtual {
                clock: clock.clone(),
                start,
            },
            clock,
        )
    }

    /// A real-time timebase starting now.
    pub fn new_real() -> Self {
        Self::Real {
            start: tokio::time::Instant::now(),
            wall_start: OffsetDateTime::now_utc(),
        }
    }

    /// The simulated time now.
    pub fn now(&self) -> Duration {
        match self {
            Self::Virtual { clock, start } => {
                use taskfence::clock::Clock;
                to_std(clock.now() - *start)
            }
            Self::Real { start, .. } => start.elapsed() * REAL_TIME_SCALE,
        }
    }

    /// Moves to simulated time `at`: sets the virtual clock, or sleeps until then.
    pub async fn advance_to(&self, at: Duration) {
        match self {
            Self::Virtual { clock, start } => clock.set(*start + at),
            Self::Real { start, .. } => tokio::time::sleep_until(*start + at / REAL_TIME_SCALE).await,
        }
    }

    /// A simulated duration as the store must see it (leases, backoffs).
    pub fn store_duration(&self, d: Duration) -> Duration {
        match self {
            Self::Virtual { .. } => d,
            Self::Real { .. } => d / REAL_TIME_SCALE,
        }
    }

    /// A store instant (`Busy { until }`, `Backoff { not_before }`) in simulated time.
    pub fn simulated_at(&self, at: OffsetDateTime) -> Duration {
        match self {
            Self::Virtual { start, .. } => to_std(at - *start),
            Self::Real { wall_start, .. } => to_std(at - *wall_start) * REAL_TIME_SCALE,
        }
    }
}

fn to_std(d: time::Duration) -> Duration {
    Duration::try_from(d).unwrap_or(Duration::ZERO)
}
