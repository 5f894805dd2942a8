//! Input limits every backend enforces before writing anything.
//!
//! The limits are deliberately conservative constants rather than per-store
//! settings: a key that one backend accepts must be accepted by all of them,
//! so that moving from [`MemoryStore`](crate::MemoryStore) to the PostgreSQL
//! backend never changes what a client may send.
//!
//! ```
//! use taskfence::limits;
//! assert_eq!(limits::MAX_KEY_LEN, 255);
//! ```

use std::time::Duration;

use crate::error::InvalidInput;
use crate::id::TaskId;
use crate::response::Response;

/// Longest scope, in bytes.
pub const MAX_SCOPE_LEN: usize = 255;
/// Longest operation name, in bytes.
pub const MAX_OPERATION_LEN: usize = 128;
/// Longest idempotency key, in bytes (the IETF draft's keys are UUIDs or similar).
pub const MAX_KEY_LEN: usize = 255;
/// Longest worker id, in bytes.
pub const MAX_WORKER_LEN: usize = 255;
/// Longest provider operation id, in bytes.
pub const MAX_OPERATION_ID_LEN: usize = 512;
/// Longest failure message or cancellation reason, in bytes (longer ones are rejected, not cut).
pub const MAX_MESSAGE_LEN: usize = 8 * 1024;
/// Largest payload, in bytes.
pub const MAX_PAYLOAD_LEN: usize = 1024 * 1024;
/// Largest saved response, in bytes.
pub const MAX_RESPONSE_LEN: usize = 1024 * 1024;
/// Longest lease or renewal.
pub const MAX_LEASE: Duration = Duration::from_secs(24 * 3600);
/// Longest backoff.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30 * 24 * 3600);
/// Longest elapsed-time deadline.
pub const MAX_DEADLINE: Duration = Duration::from_secs(366 * 24 * 3600);
/// Longest retention of a dedup record.
pub const MAX_RETENTION: Duration = Duration::from_secs(10 * 366 * 24 * 3600);
/// Most attempts a policy may allow.
pub const MAX_ATTEMPTS: u32 = 1000;
/// Longest effect name (`notify-user`), in bytes.
pub const MAX_EFFECT_NAME_LEN: usize = 64;

/// Checks an identifier-like string: not blank, at most `max` bytes, no control
/// characters (NUL included: PostgreSQL rejects it in text, and it would make
/// two backends disagree).
pub fn check_text(field: &'static str, value: &str, max: usize) -> Result<(), InvalidInput> {
    if value.trim().is_empty() {
        return Err(InvalidInput::Blank { field });
    }
    check_len(field, value.len(), max)?;
    check_free_text(field, value)
}

/// Checks free text (messages, reasons): no control characters but tab and newline.
pub fn check_free_text(field: &'static str, value: &str) -> Result<(), InvalidInput> {
    match value
        .chars()
        .find(|c| c.is_control() && !matches!(c, '\n' | '\t' | '\r'))
    {
        Some(c) => Err(InvalidInput::ControlCharacter {
            field,
            code: u32::from(c),
        }),
        None => Ok(()),
    }
}

/// Checks a byte length against `max`.
pub fn check_len(field: &'static str, len: usize, max: usize) -> Result<(), InvalidInput> {
    if len > max {
        return Err(InvalidInput::TooLong { field, len, max });
    }
    Ok(())
}

/// Checks a duration: positive and at most `max`.
pub fn check_duration(field: &'static str, value: Duration, max: Duration) -> Result<(), InvalidInput> {
    if value.is_zero() {
        return Err(InvalidInput::ZeroDuration { field });
    }
    if value > max {
        return Err(InvalidInput::DurationTooLong { field, value, max });
    }
    Ok(())
}

/// Checks a response's size.
pub fn check_response(response: &Response) -> Result<(), InvalidInput> {
    check_len("response", response.len(), MAX_RESPONSE_LEN)
}

/// Checks a provider operation id.
pub fn check_operation_id(id: &str) -> Result<(), InvalidInput> {
    check_text("operation_id", id, MAX_OPERATION_ID_LEN)
}

/// Checks an effect name: not blank, at most [`MAX_EFFECT_NAME_LEN`] bytes,
/// only ASCII letters, digits, `-`, `_` and `.` — it becomes part of the
/// [`EffectKey`](crate::effect::EffectKey), which providers take in headers
/// and restricted fields.
///
/// ```
/// use taskfence::limits::check_effect_name;
/// assert!(check_effect_name("notify-user").is_ok());
/// assert!(check_effect_name("notify user").is_err());
/// ```
pub fn check_effect_name(name: &str) -> Result<(), InvalidInput> {
    check_name("effect", name, MAX_EFFECT_NAME_LEN)
}

/// Checks a name that will travel in keys, headers and URL paths (an
/// effect's, a service's conversation or tenant ids): not blank, at most
/// `max` bytes, only ASCII letters, digits, `-`, `_` and `.`, so it needs no
/// escaping anywhere.
///
/// ```
/// use taskfence::error::InvalidInput;
/// use taskfence::limits::check_name;
/// assert!(check_name("conversation_id", "conv-7.b_2", 128).is_ok());
/// assert!(matches!(check_name("conversation_id", "", 128), Err(InvalidInput::Blank { .. })));
/// assert!(matches!(check_name("conversation_id", "conv 7", 128), Err(InvalidInput::NotAllowed { .. })));
/// assert!(matches!(check_name("conversation_id", "c".repeat(129).as_str(), 128), Err(InvalidInput::TooLong { .. })));
/// ```
pub fn check_name(field: &'static str, name: &str, max: usize) -> Result<(), InvalidInput> {
    if name.is_empty() {
        return Err(InvalidInput::Blank { field });
    }
    check_len(field, name.len(), max)?;
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err(InvalidInput::NotAllowed {
            field,
            allowed: "ASCII letters, digits, '-', '_' and '.'",
        });
    }
    Ok(())
}

/// Checks a cancellation reason (may be empty).
pub fn check_reason(reason: &str) -> Result<(), InvalidInput> {
    check_len("reason", reason.len(), MAX_MESSAGE_LEN)?;
    check_free_text("reason", reason)
}

/// Checks a renewal length.
pub fn check_extension(extend_by: Duration) -> Result<(), InvalidInput> {
    check_duration("extend_by", extend_by, MAX_LEASE)
}

/// Largest `limit` of a scan (`due`, `purge_expired`).
pub const MAX_SCAN_LIMIT: usize = 100_000;

/// Checks a scan limit: `1..=MAX_SCAN_LIMIT`.
pub fn check_scan_limit(limit: usize) -> Result<(), InvalidInput> {
    check_limit(limit, MAX_SCAN_LIMIT)
}

/// A `limit` argument must be `1..=max`.
fn check_limit(limit: usize, max: usize) -> Result<(), InvalidInput> {
    check_range("limit", limit, 1, max)
}

/// Checks a number against `min..=max`: [`InvalidInput::OutOfRange`]
/// naming the field and the bounds otherwise.
///
/// ```
/// use taskfence::limits::check_range;
/// assert!(check_range("burst", 5_u32, 1, 10).is_ok());
/// assert!(check_range("burst", 0_u32, 1, 10).is_err());
/// ```
pub fn check_range<T: PartialOrd + std::fmt::Display>(
    field: &'static str,
    value: T,
    min: T,
    max: T,
) -> Result<(), InvalidInput> {
    if min <= value && value <= max {
        return Ok(());
    }
    Err(InvalidInput::OutOfRange {
        field,
        value: value.to_string(),
        min: min.to_string(),
        max: max.to_string(),
    })
}

/// Largest page of [`Inspect::list`](crate::inspect::Inspect::list) and
/// [`Inspect::stranded`](crate::inspect::Inspect::stranded): an operator's
/// page, not an export (follow the cursor for more).
pub const MAX_PAGE: usize = 1000;

/// Checks a page size: `1..=MAX_PAGE`.
///
/// ```
/// assert!(taskfence::limits::check_page(50).is_ok());
/// assert!(taskfence::limits::check_page(0).is_err());
/// ```
pub fn check_page(limit: usize) -> Result<(), InvalidInput> {
    check_limit(limit, MAX_PAGE)
}

/// Largest cap of [`Inspect::counts_up_to`](crate::inspect::Inspect::counts_up_to):
/// a million index entries per status is still a fraction of a second's
/// read; beyond that, a count is an export, not an overview.
pub const MAX_COUNT_CAP: u64 = 1_000_000;

/// Checks a count's cap: `1..=MAX_COUNT_CAP`.
///
/// ```
/// assert!(taskfence::limits::check_count_cap(10_000).is_ok());
/// assert!(taskfence::limits::check_count_cap(0).is_err());
/// ```
pub fn check_count_cap(cap: u64) -> Result<(), InvalidInput> {
    if cap == 0 || cap > MAX_COUNT_CAP {
        return Err(InvalidInput::OutOfRange {
            field: "cap",
            value: cap.to_string(),
            min: "1".into(),
            max: MAX_COUNT_CAP.to_string(),
        });
    }
    Ok(())
}

/// Most tasks in one batch (`submit_many`, `claim_many`, `complete_many`).
pub const MAX_BATCH: usize = 1000;

/// Most operations or scopes a [`ClaimNext`](crate::ClaimNext) may name.
pub const MAX_FILTERS: usize = 64;

/// Checks the limit of a [`claim_next`](crate::TaskStore::claim_next): `1..=MAX_BATCH`.
///
/// ```
/// assert!(taskfence::limits::check_claim_limit(16).is_ok());
/// assert!(taskfence::limits::check_claim_limit(0).is_err());
/// ```
pub fn check_claim_limit(limit: usize) -> Result<(), InvalidInput> {
    check_limit(limit, MAX_BATCH)
}

/// Checks how many operations or scopes a [`ClaimNext`](crate::ClaimNext) names: at most [`MAX_FILTERS`].
///
/// ```
/// assert!(taskfence::limits::check_filters("scopes", 3).is_ok());
/// assert!(taskfence::limits::check_filters("scopes", 65).is_err());
/// ```
pub fn check_filters(field: &'static str, n: usize) -> Result<(), InvalidInput> {
    if n > MAX_FILTERS {
        return Err(InvalidInput::OutOfRange {
            field,
            value: n.to_string(),
            min: "0".into(),
            max: MAX_FILTERS.to_string(),
        });
    }
    Ok(())
}

/// Checks the size of a batch of submissions: at most [`MAX_BATCH`].
///
/// ```
/// assert!(taskfence::limits::check_batch_size(100).is_ok());
/// assert!(taskfence::limits::check_batch_size(taskfence::limits::MAX_BATCH + 1).is_err());
/// ```
pub fn check_batch_size(n: usize) -> Result<(), InvalidInput> {
    if n > MAX_BATCH {
        return Err(batch_too_large());
    }
    Ok(())
}

fn batch_too_large() -> InvalidInput {
    InvalidInput::OutOfRange {
        field: "batch size",
        value: format!("more than {MAX_BATCH}"),
        min: "0".into(),
        max: MAX_BATCH.to_string(),
    }
}

/// Checks a batch of task ids: at most [`MAX_BATCH`] of them, each once.
///
/// ```
/// use taskfence::{limits, TaskId};
/// let id = TaskId::new();
/// assert!(limits::check_batch([id, TaskId::new()]).is_ok());
/// assert!(limits::check_batch([id, id]).is_err());
/// ```
pub fn check_batch(ids: impl IntoIterator<Item = TaskId>) -> Result<(), InvalidInput> {
    let mut seen = std::collections::HashSet::new();
    for task in ids {
        if !seen.insert(task) {
            return Err(InvalidInput::DuplicateInBatch { task });
        }
        if seen.len() > MAX_BATCH {
            return Err(batch_too_large());
        }
    }
    Ok(())
}
