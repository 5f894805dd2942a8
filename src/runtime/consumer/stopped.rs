//! [`Stopped`]: what a consumer did, and the counters it is read from.

use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(doc)]
use super::Consumer;
use crate::runtime::{AckReason, Disposition, RetryReason};

/// What a [`Consumer`] did, counted when it stopped.
///
/// ```
/// # fn f(stopped: taskfence::runtime::Stopped) {
/// println!("{} completed, {} released at the stop", stopped.completed, stopped.released);
/// # }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stopped {
    /// Responses this consumer saved.
    pub completed: u64,
    /// Failures it reported (a panicking work function's included).
    pub failed: u64,
    /// Leases it gave back at the stop.
    pub released: u64,
    /// Of those, the ones it gave back before their work started (a
    /// prefetched task at the stop), which the store accepted: their
    /// claims cost no attempt.
    pub returned_unstarted: u64,
    /// Leases it lost while the work ran (taken over, cancelled, expired).
    pub lost: u64,
    /// Deliveries settled without a saved response or a release: done,
    /// busy or backing off when claimed, or settled by a failure or a lost
    /// lease.
    pub skipped: u64,
}

/// The counters a [`Stopped`] is read from, shared by every run.
#[derive(Default)]
pub(super) struct Tally {
    pub(super) completed: AtomicU64,
    pub(super) failed: AtomicU64,
    pub(super) released: AtomicU64,
    pub(super) unstarted: AtomicU64,
    pub(super) lost: AtomicU64,
    pub(super) skipped: AtomicU64,
}

impl Tally {
    pub(super) fn add(&self, disposition: &Disposition) {
        let counter = match disposition {
            Disposition::Ack(AckReason::Completed) => &self.completed,
            Disposition::RetryAfter {
                reason: RetryReason::Released,
                ..
            } => &self.released,
            _ => &self.skipped,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn stopped(&self) -> Stopped {
        Stopped {
            completed: self.completed.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            released: self.released.load(Ordering::Relaxed),
            returned_unstarted: self.unstarted.load(Ordering::Relaxed),
            lost: self.lost.load(Ordering::Relaxed),
            skipped: self.skipped.load(Ordering::Relaxed),
        }
    }
}
