//! [`Call`]: what one call names, as [`Intercept::around`] sees it.

#[cfg(doc)]
use super::Intercept;
#[cfg(doc)]
use crate::inspect::Inspect;
use crate::store::Lease;
#[cfg(doc)]
use crate::store::TaskStore;
use crate::task::{RequestKey, TaskId};

/// One call as [`Intercept::around`] sees it: the operation and what it
/// names (never payloads or responses).
///
/// ```
/// use taskfence::intercept::Call;
/// let call = Call::new("claim").task(taskfence::TaskId::new());
/// assert_eq!(call.operation, "claim");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Call {
    /// The [`TaskStore`] or [`Inspect`] method's name: `submit`, `claim`,
    /// `claim_many`, `list`…
    pub operation: &'static str,
    /// The task the call names, by id or by lease.
    pub task_id: Option<TaskId>,
    /// The assignment version of a fenced write's lease.
    pub version: Option<u64>,
    /// The attempt number of a fenced write's lease.
    pub attempt: Option<u32>,
    /// The request key the call names: a submission's, a lookup's, a lease's task's.
    pub key: Option<RequestKey>,
    /// The scope a count or a listing is restricted to.
    pub scope: Option<String>,
    /// How many tasks a batch asks for.
    pub batch: Option<usize>,
}

impl Call {
    /// A call of `operation` naming nothing yet.
    ///
    /// ```
    /// let call = taskfence::intercept::Call::new("due");
    /// assert!(call.task_id.is_none());
    /// ```
    pub fn new(operation: &'static str) -> Self {
        Self {
            operation,
            task_id: None,
            version: None,
            attempt: None,
            key: None,
            scope: None,
            batch: None,
        }
    }

    /// Names the task.
    ///
    /// ```
    /// let call = taskfence::intercept::Call::new("get").task(taskfence::TaskId::new());
    /// assert!(call.task_id.is_some());
    /// ```
    pub fn task(mut self, id: TaskId) -> Self {
        self.task_id = Some(id);
        self
    }

    /// Names the lease: its task, version, attempt and key.
    ///
    /// ```
    /// # fn f(lease: &taskfence::Lease) {
    /// let call = taskfence::intercept::Call::new("renew").lease(lease);
    /// assert_eq!((call.task_id, call.version), (Some(lease.task_id()), Some(lease.version())));
    /// # }
    /// ```
    pub fn lease(mut self, lease: &Lease) -> Self {
        self.task_id = Some(lease.task_id());
        self.version = Some(lease.version());
        self.attempt = Some(lease.attempt());
        self.key = Some(lease.task().key.clone());
        self
    }

    /// Names the request key.
    ///
    /// ```
    /// let key = taskfence::RequestKey::new("u", "op", "k");
    /// let call = taskfence::intercept::Call::new("find").key(&key);
    /// assert_eq!(call.key, Some(key));
    /// ```
    pub fn key(mut self, key: &RequestKey) -> Self {
        self.key = Some(key.clone());
        self
    }

    /// Names the scope.
    ///
    /// ```
    /// let call = taskfence::intercept::Call::new("counts").scope(Some("tenant-7"));
    /// assert_eq!(call.scope.as_deref(), Some("tenant-7"));
    /// ```
    pub fn scope(mut self, scope: Option<&str>) -> Self {
        self.scope = scope.map(str::to_owned);
        self
    }

    /// Names the batch's size.
    ///
    /// ```
    /// let call = taskfence::intercept::Call::new("claim_many").batch(10);
    /// assert_eq!(call.batch, Some(10));
    /// ```
    pub fn batch(mut self, n: usize) -> Self {
        self.batch = Some(n);
        self
    }
}
