//! A work function's failure made fit to report: a panic as the retryable
//! failure it counts as, a message cut to the limits; and a provider's
//! `Retry-After` passed on to the task's rate bucket.

use crate::limits;
use crate::policy::Failure;
use crate::store::{Lease, TaskStore};

/// A failure asking for a delay (a provider's `429` with `Retry-After`) on
/// a task naming a rate bucket drains the bucket for that long
/// ([`TaskStore::drain_bucket`]) before the failure is reported: the
/// provider's limit is the bucket's, so every worker waits, instead of each
/// learning it from a `429` of its own and spending an attempt on it. A
/// drain that fails is logged; the failure is reported all the same.
pub(crate) async fn drain_bucket(store: &dyn TaskStore, lease: &Lease, failure: &Failure) {
    let (Some(bucket), Some(retry_after)) = (&lease.task().limits.bucket, failure.retry_after) else {
        return;
    };
    if let Err(error) = store.drain_bucket(bucket, retry_after).await {
        tracing::warn!(task_id = %lease.task_id(), bucket, %error, "draining the rate bucket failed");
    }
}

/// `message` within the failure message's limits: control characters but
/// newlines and tabs replaced, cut at a character boundary.
pub(crate) fn fit(message: &str) -> String {
    let mut out: String = message
        .chars()
        .map(|c| {
            if c.is_control() && !matches!(c, '\n' | '\t') {
                ' '
            } else {
                c
            }
        })
        .collect();
    if out.len() > limits::MAX_MESSAGE_LEN {
        let mut end = limits::MAX_MESSAGE_LEN;
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        out.truncate(end);
    }
    out
}

/// A panic of the work function as the retryable failure it counts as
/// (the message kept within the limit).
pub(crate) fn panic_failure(payload: Box<dyn std::any::Any + Send>) -> Failure {
    let text = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-text panic".into());
    Failure::retryable(fit(&format!("the work function panicked: {text}")))
}
