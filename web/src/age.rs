//! Ages such as `90s`, `15m`, `1h30m`, `2d`: how far back a filter reaches
//! (`older_than`, `newer_than`, stranded after). The dashboard and the
//! command line read them here alike, bounded by [`MAX_AGE`], so that
//! "now minus the age" is always a date: `100000000y` is refused, not a
//! panic in the date arithmetic.

use std::time::Duration;

use time::OffsetDateTime;

/// The longest age accepted: 100 years (of 365 days), further back than
/// any task.
pub const MAX_AGE: Duration = Duration::from_secs(100 * 365 * 86_400);

/// Why a text is not an age.
///
/// ```
/// use taskfence_web::age::{AgeError, parse_age};
/// assert!(matches!(parse_age("100000000y"), Err(AgeError::TooLong { .. })));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AgeError {
    /// Not a duration at all.
    #[error("not a duration: expected e.g. 90s, 15m, 1h30m or 2d")]
    NotADuration,
    /// Zero: no task is younger than that.
    #[error("must be a positive duration")]
    Zero,
    /// Longer than [`MAX_AGE`].
    #[error("out of range: at most {} (100 years)", humantime::format_duration(*max))]
    TooLong {
        /// The limit ([`MAX_AGE`]).
        max: Duration,
    },
}

/// A positive age of at most [`MAX_AGE`], in the command line's syntax
/// (`90s`, `15m`, `1h30m`, `2d`, `1h 5m`).
///
/// ```
/// use std::time::Duration;
/// use taskfence_web::age::parse_age;
/// assert_eq!(parse_age("1h30m"), Ok(Duration::from_secs(5400)));
/// assert!(parse_age("0s").is_err() && parse_age("soon").is_err());
/// ```
pub fn parse_age(text: &str) -> Result<Duration, AgeError> {
    let age = humantime::parse_duration(text.trim()).map_err(|_| AgeError::NotADuration)?;
    check_age(age)
}

/// `age` when it is positive and at most [`MAX_AGE`].
///
/// ```
/// use std::time::Duration;
/// use taskfence_web::age::check_age;
/// assert!(check_age(Duration::from_secs(60)).is_ok());
/// assert!(check_age(Duration::MAX).is_err());
/// ```
pub fn check_age(age: Duration) -> Result<Duration, AgeError> {
    if age.is_zero() {
        return Err(AgeError::Zero);
    }
    if age > MAX_AGE {
        return Err(AgeError::TooLong { max: MAX_AGE });
    }
    Ok(age)
}

/// `now` minus `age`: the instant a filter compares with, or
/// [`AgeError::TooLong`] when that is before the earliest date (never a panic).
///
/// ```
/// use std::time::Duration;
/// use taskfence_web::age::cutoff;
/// let now = time::OffsetDateTime::now_utc();
/// assert_eq!(cutoff(now, Duration::from_secs(60)).unwrap(), now - Duration::from_secs(60));
/// assert!(cutoff(now, Duration::MAX).is_err());
/// ```
pub fn cutoff(now: OffsetDateTime, age: Duration) -> Result<OffsetDateTime, AgeError> {
    let age = check_age(age)?;
    time::Duration::try_from(age)
        .ok()
        .and_then(|age| now.checked_sub(age))
        .ok_or(AgeError::TooLong { max: MAX_AGE })
}
