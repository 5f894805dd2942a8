//! A work function's failure made fit to report: a panic as the retryable
//! failure it counts as, a message cut to the limits.

use crate::limits;
use crate::policy::Failure;

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
