//! [`WorkerConfig`]: how a [`Worker`](super::Worker) claims and keeps its leases.

use std::time::Duration;

#[cfg(doc)]
use super::{Disposition, WorkContext, Worker};
use crate::error::InvalidInput;
use crate::error::Result;
use crate::store::ClaimRequest;

/// How a [`Worker`] claims and keeps its leases.
///
/// ```
/// use std::time::Duration;
/// use taskfence::runtime::WorkerConfig;
/// let config = WorkerConfig::new("worker-1", Duration::from_secs(30));
/// assert_eq!(config.renew_every, Duration::from_secs(10)); // a third of the lease
/// assert!(config.validate().is_ok());
/// assert!(WorkerConfig::new("worker-1", Duration::from_secs(30)).renew_every(Duration::from_secs(30)).validate().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerConfig {
    /// Recorded with every attempt, for tracing.
    pub worker_id: String,
    /// Lease length asked for at claim and at every renewal (store clock).
    pub lease_duration: Duration,
    /// Renewal interval: shorter than the lease, so a late renewal still lands
    /// in time. Defaults to a third of the lease.
    pub renew_every: Duration,
    /// After the lease is lost, how long the work function may take to notice
    /// [`WorkContext::lease_lost`] and return before it is dropped. Default 5 s.
    pub stop_grace: Duration,
    /// The shortest [`Disposition::RetryAfter`] delay, so that a wait already
    /// over (or clock skew between worker and store) never turns into a hot
    /// redelivery loop. Default 1 s.
    pub min_retry_delay: Duration,
}

impl WorkerConfig {
    /// A config for `worker_id` with leases of `lease_duration`, renewed every third of it.
    pub fn new(worker_id: impl Into<String>, lease_duration: Duration) -> Self {
        Self {
            worker_id: worker_id.into(),
            lease_duration,
            renew_every: lease_duration / 3,
            stop_grace: Duration::from_secs(5),
            min_retry_delay: Duration::from_secs(1),
        }
    }

    /// Sets `renew_every`.
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.renew_every = every;
        self
    }

    /// Sets `stop_grace`.
    pub fn stop_grace(mut self, grace: Duration) -> Self {
        self.stop_grace = grace;
        self
    }

    /// Sets `min_retry_delay`.
    pub fn min_retry_delay(mut self, delay: Duration) -> Self {
        self.min_retry_delay = delay;
        self
    }

    /// Checks the worker id and lease like a claim would, and that renewals
    /// come strictly before the lease runs out.
    pub fn validate(&self) -> Result<(), InvalidInput> {
        ClaimRequest::new(self.worker_id.clone(), self.lease_duration).validate()?;
        crate::limits::check_duration("renew_every", self.renew_every, self.lease_duration)?;
        if self.renew_every >= self.lease_duration {
            return Err(InvalidInput::Inconsistent(
                "renew_every must be shorter than the lease",
            ));
        }
        Ok(())
    }
}
