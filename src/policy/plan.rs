//! [`Plan`]: what the policy decided for a failed attempt.

use std::time::Duration;

use super::StopReason;

/// What [`rules::plan`](crate::backend::rules::plan) decided for a failed attempt:
/// a value of the policy, beneath the backends that act on it.
///
/// ```
/// use std::time::Duration;
/// use taskfence::backend::Plan;
/// use taskfence::policy::StopReason;
/// fn describe(plan: Plan) -> String {
///     match plan {
///         Plan::RetryAfter(delay) => format!("again in {delay:?}"),
///         Plan::Stop(reason) => format!("failed: {}", reason.as_str()),
///     }
/// }
/// assert_eq!(describe(Plan::Stop(StopReason::Permanent)), "failed: permanent failure");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Schedule another attempt after this delay (the store still checks the deadline).
    RetryAfter(Duration),
    /// Make the task terminally `Failed`.
    Stop(StopReason),
}
