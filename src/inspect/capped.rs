//! [`CappedCounts`]: tasks per status counted up to a cap, so an overview
//! costs the same on a table of a thousand tasks or a billion.

use std::fmt;

use crate::task::Status;

/// Every status, in the order counts list them.
pub(crate) const STATUSES: [Status; 5] = [
    Status::Pending,
    Status::Running,
    Status::Completed,
    Status::Failed,
    Status::Cancelled,
];

/// A count that stops at a cap: exact below it, "at least" from it on.
///
/// ```
/// use taskfence::inspect::Count;
/// assert_eq!(Count::up_to(7, 10_000), Count::Exact(7));
/// assert_eq!(Count::up_to(10_000, 10_000), Count::AtLeast(10_000));
/// assert_eq!(Count::AtLeast(10_000).to_string(), "10000+");
/// assert_eq!(Count::Exact(3) + Count::AtLeast(10), Count::AtLeast(13));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Count {
    /// Exactly this many.
    Exact(u64),
    /// This many or more: counting stopped here.
    AtLeast(u64),
}

impl Count {
    /// The count of `n` entries found by a scan that stopped at `cap`:
    /// exact below the cap, [`AtLeast`](Self::AtLeast) at it.
    ///
    /// ```
    /// assert!(taskfence::inspect::Count::up_to(9, 10).is_exact());
    /// ```
    pub fn up_to(n: u64, cap: u64) -> Self {
        if n >= cap {
            Self::AtLeast(n)
        } else {
            Self::Exact(n)
        }
    }

    /// The number counted (a lower bound when [`AtLeast`](Self::AtLeast)).
    ///
    /// ```
    /// assert_eq!(taskfence::inspect::Count::AtLeast(10).value(), 10);
    /// ```
    pub fn value(self) -> u64 {
        match self {
            Self::Exact(n) | Self::AtLeast(n) => n,
        }
    }

    /// Whether this is the exact count.
    ///
    /// ```
    /// assert!(!taskfence::inspect::Count::AtLeast(10).is_exact());
    /// ```
    pub fn is_exact(self) -> bool {
        matches!(self, Self::Exact(_))
    }
}

impl Default for Count {
    fn default() -> Self {
        Self::Exact(0)
    }
}

impl std::ops::Add for Count {
    type Output = Count;
    /// Exact only if both are.
    fn add(self, other: Count) -> Count {
        let n = self.value().saturating_add(other.value());
        if self.is_exact() && other.is_exact() {
            Count::Exact(n)
        } else {
            Count::AtLeast(n)
        }
    }
}

impl fmt::Display for Count {
    /// `1234`, or `10000+` for a count that stopped at its cap.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exact(n) => write!(f, "{n}"),
            Self::AtLeast(n) => write!(f, "{n}+"),
        }
    }
}

/// Tasks per status, each counted up to a cap ([`Inspect::counts_up_to`](super::Inspect::counts_up_to)).
///
/// ```
/// use taskfence::inspect::{CappedCounts, Count};
/// use taskfence::Status;
/// let mut counts = CappedCounts::default();
/// counts.set(Status::Failed, Count::Exact(2));
/// counts.set(Status::Completed, Count::AtLeast(10_000));
/// assert_eq!(counts.get(Status::Failed), Count::Exact(2));
/// assert_eq!(counts.total(), Count::AtLeast(10_002));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct CappedCounts {
    /// Waiting for a claim.
    pub pending: Count,
    /// Held by a worker.
    pub running: Count,
    /// Saved a response.
    pub completed: Count,
    /// Failed terminally.
    pub failed: Count,
    /// Cancelled.
    pub cancelled: Count,
}

impl CappedCounts {
    /// The count of one status.
    ///
    /// ```
    /// use taskfence::{inspect::{CappedCounts, Count}, Status};
    /// assert_eq!(CappedCounts::default().get(Status::Pending), Count::Exact(0));
    /// ```
    pub fn get(&self, status: Status) -> Count {
        *self.slot(status)
    }

    /// Sets the count of `status` (a backend's answer).
    ///
    /// ```
    /// use taskfence::{inspect::{CappedCounts, Count}, Status};
    /// let mut counts = CappedCounts::default();
    /// counts.set(Status::Running, Count::Exact(4));
    /// assert_eq!(counts.running, Count::Exact(4));
    /// ```
    pub fn set(&mut self, status: Status, count: Count) {
        *self.slot_mut(status) = count;
    }

    /// All tasks: exact only if every status is.
    ///
    /// ```
    /// assert_eq!(taskfence::inspect::CappedCounts::default().total(), taskfence::inspect::Count::Exact(0));
    /// ```
    pub fn total(&self) -> Count {
        self.pending + self.running + self.completed + self.failed + self.cancelled
    }

    fn slot(&self, status: Status) -> &Count {
        match status {
            Status::Pending => &self.pending,
            Status::Running => &self.running,
            Status::Completed => &self.completed,
            Status::Failed => &self.failed,
            Status::Cancelled => &self.cancelled,
        }
    }

    fn slot_mut(&mut self, status: Status) -> &mut Count {
        match status {
            Status::Pending => &mut self.pending,
            Status::Running => &mut self.running,
            Status::Completed => &mut self.completed,
            Status::Failed => &mut self.failed,
            Status::Cancelled => &mut self.cancelled,
        }
    }
}
