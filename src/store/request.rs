//! What a caller asks of the store: who claims and for how long, a batch
//! claim, a reopening.

use std::time::Duration;

#[cfg(doc)]
use super::TaskStore;
use crate::error::InvalidInput;
use crate::limits;
use crate::policy::RetryPolicy;

/// What a [`TaskStore::claim_next`] asks for: who claims, for how long, how
/// many at most, and optionally which operations and scopes (one
/// deployment's several queues).
///
/// ```
/// use std::time::Duration;
/// use taskfence::ClaimNext;
/// let next = ClaimNext::new("worker-7", Duration::from_secs(30), 16).operation("chat.reply");
/// assert!(next.validate().is_ok());
/// assert!(ClaimNext::new("worker-7", Duration::from_secs(30), 0).validate().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClaimNext {
    /// The worker's id, recorded with each attempt.
    pub worker: String,
    /// Lease length of each claimed task, measured on the store's clock.
    pub lease_duration: Duration,
    /// At most this many leases (`1..=`[`limits::MAX_BATCH`]).
    pub limit: usize,
    /// Only tasks of these operations; empty: any.
    pub operations: Vec<String>,
    /// Only tasks of these scopes; empty: any.
    pub scopes: Vec<String>,
}

impl ClaimNext {
    /// Up to `limit` due tasks for `worker`, each for a lease of `lease_duration`.
    pub fn new(worker: impl Into<String>, lease_duration: Duration, limit: usize) -> Self {
        Self {
            worker: worker.into(),
            lease_duration,
            limit,
            operations: Vec::new(),
            scopes: Vec::new(),
        }
    }

    /// Adds an operation to claim from (call once per operation).
    ///
    /// ```
    /// # use std::time::Duration;
    /// let next = taskfence::ClaimNext::new("w", Duration::from_secs(30), 8).operation("a").operation("b");
    /// assert_eq!(next.operations, ["a", "b"]);
    /// ```
    pub fn operation(mut self, operation: impl Into<String>) -> Self {
        self.operations.push(operation.into());
        self
    }

    /// Adds a scope to claim from (call once per scope).
    ///
    /// ```
    /// # use std::time::Duration;
    /// let next = taskfence::ClaimNext::new("w", Duration::from_secs(30), 8).scope("tenant-7");
    /// assert_eq!(next.scopes, ["tenant-7"]);
    /// ```
    pub fn scope(mut self, scope: impl Into<String>) -> Self {
        self.scopes.push(scope.into());
        self
    }

    /// The claim each task gets: the same worker and lease.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let next = taskfence::ClaimNext::new("w", Duration::from_secs(30), 8);
    /// assert_eq!(next.request(), taskfence::ClaimRequest::new("w", Duration::from_secs(30)));
    /// ```
    pub fn request(&self) -> ClaimRequest {
        ClaimRequest::new(self.worker.clone(), self.lease_duration)
    }

    /// Checks the worker, the lease, the limit and each operation and scope
    /// against [`limits`].
    pub fn validate(&self) -> Result<(), InvalidInput> {
        self.request().validate()?;
        limits::check_claim_limit(self.limit)?;
        limits::check_filters("operations", self.operations.len())?;
        limits::check_filters("scopes", self.scopes.len())?;
        for operation in &self.operations {
            limits::check_text("operation", operation, limits::MAX_OPERATION_LEN)?;
        }
        for scope in &self.scopes {
            limits::check_text("scope", scope, limits::MAX_SCOPE_LEN)?;
        }
        Ok(())
    }
}

/// Who is claiming and for how long.
///
/// ```
/// use std::time::Duration;
/// use taskfence::ClaimRequest;
/// let req = ClaimRequest::new("worker-7", Duration::from_secs(30));
/// assert!(req.validate().is_ok());
/// assert!(ClaimRequest::new("", Duration::from_secs(30)).validate().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClaimRequest {
    /// The worker's id, recorded with the attempt.
    pub worker: String,
    /// Lease length, measured on the store's clock.
    pub lease_duration: Duration,
}

impl ClaimRequest {
    /// A claim by `worker` for a lease of `lease_duration`.
    pub fn new(worker: impl Into<String>, lease_duration: Duration) -> Self {
        Self {
            worker: worker.into(),
            lease_duration,
        }
    }

    /// Checks the worker id and the lease length against [`limits`].
    pub fn validate(&self) -> Result<(), InvalidInput> {
        limits::check_text("worker", &self.worker, limits::MAX_WORKER_LEN)?;
        limits::check_duration("lease", self.lease_duration, limits::MAX_LEASE)
    }
}

/// Who reopens a task with [`TaskStore::reopen`], why, and the budget it gets.
///
/// ```
/// use std::time::Duration;
/// use taskfence::RetryPolicy;
/// use taskfence::store::ReopenRequest;
/// let request = ReopenRequest::new("alice@ops", "quota raised")
///     .policy(RetryPolicy::default().max_attempts(3).deadline(Duration::from_secs(3600)));
/// assert!(request.validate().is_ok());
/// assert!(ReopenRequest::new("", "why").validate().is_err());
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ReopenRequest {
    /// Who asked (an operator, a tool): recorded with the reopening.
    pub by: String,
    /// Why: recorded with the reopening.
    pub reason: String,
    /// The policy of the fresh budget; `None` keeps the task's stored policy.
    pub policy: Option<RetryPolicy>,
    /// The fresh budget's attempts, over the policy above (or the stored
    /// one): the one setting an operator most often changes, decided in the
    /// store's own write without reading the policy first.
    pub max_attempts: Option<u32>,
}

impl ReopenRequest {
    /// A reopening by `by` for `reason`, under the task's stored policy.
    pub fn new(by: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            by: by.into(),
            reason: reason.into(),
            policy: None,
            max_attempts: None,
        }
    }

    /// Gives the fresh budget this policy instead of the stored one.
    pub fn policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// Gives the fresh budget `n` attempts, keeping every other setting of
    /// the policy (the stored one, or the one given to [`policy`](Self::policy)).
    ///
    /// ```
    /// let request = taskfence::store::ReopenRequest::new("alice@ops", "provider back").max_attempts(10);
    /// assert_eq!(request.max_attempts, Some(10));
    /// assert!(taskfence::store::ReopenRequest::new("alice@ops", "none").max_attempts(0).validate().is_err());
    /// ```
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = Some(n);
        self
    }

    /// The policy of the fresh budget for a task whose stored policy is `stored`.
    ///
    /// ```
    /// use taskfence::{RetryPolicy, store::ReopenRequest};
    /// let stored = RetryPolicy::default().max_attempts(3);
    /// assert_eq!(ReopenRequest::new("ops", "why").policy_for(&stored), stored);
    /// assert_eq!(ReopenRequest::new("ops", "why").max_attempts(9).policy_for(&stored).max_attempts, 9);
    /// ```
    pub fn policy_for(&self, stored: &RetryPolicy) -> RetryPolicy {
        let mut policy = self.policy.unwrap_or(*stored);
        if let Some(n) = self.max_attempts {
            policy.max_attempts = n;
        }
        policy
    }

    /// Checks who, why and the policy against [`limits`].
    pub fn validate(&self) -> Result<(), InvalidInput> {
        limits::check_text("by", &self.by, limits::MAX_WORKER_LEN)?;
        limits::check_reason(&self.reason)?;
        self.policy.as_ref().map_or(Ok(()), RetryPolicy::validate)?;
        match self.max_attempts {
            Some(n) => RetryPolicy::default().max_attempts(n).validate(),
            None => Ok(()),
        }
    }
}
