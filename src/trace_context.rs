//! [`TraceContext`]: the submitter's W3C trace context, a value stored with
//! each task (re-exported from [`trace`](crate::trace), which joins a
//! worker's span to it).

use std::fmt;
use std::str::FromStr;

use crate::error::InvalidInput;

/// Longest `tracestate` kept, in bytes: the W3C recommendation's 512.
pub const MAX_TRACESTATE_LEN: usize = 512;

/// A W3C trace context (`traceparent`, and `tracestate` when there is one),
/// stored with a task at submission.
///
/// ```
/// use taskfence::trace::TraceContext;
/// let cx = TraceContext::new("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "congo=t61rcWkgMzE")?;
/// assert_eq!(cx.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
/// assert!(TraceContext::new("not a traceparent", "").is_err());
/// # Ok::<(), taskfence::error::InvalidInput>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
// In its stored form, and checked on the way in like `new`.
#[cfg_attr(feature = "serde", serde(try_from = "String", into = "String"))]
pub struct TraceContext {
    traceparent: String,
    tracestate: String,
}

impl TraceContext {
    /// A context from its two headers; `tracestate` may be empty. A
    /// malformed `traceparent` (not `00-<32 hex>-<16 hex>-<2 hex>` with
    /// non-zero ids) or an oversized or non-printable `tracestate` is
    /// [`InvalidInput`].
    ///
    /// ```
    /// let cx = taskfence::trace::TraceContext::new("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "")?;
    /// assert_eq!(cx.tracestate(), "");
    /// # Ok::<(), taskfence::error::InvalidInput>(())
    /// ```
    pub fn new(traceparent: &str, tracestate: &str) -> Result<Self, InvalidInput> {
        let bad = || {
            InvalidInput::Inconsistent("traceparent must be 00-<32 hex>-<16 hex>-<2 hex> with non-zero ids")
        };
        let parts: Vec<&str> = traceparent.split('-').collect();
        let hex =
            |s: &str, len: usize| s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        let nonzero = |s: &str| s.bytes().any(|b| b != b'0');
        let valid = parts.len() == 4
            && parts[0] == "00"
            && hex(parts[1], 32)
            && nonzero(parts[1])
            && hex(parts[2], 16)
            && nonzero(parts[2])
            && hex(parts[3], 2);
        if !valid {
            return Err(bad());
        }
        if tracestate.len() > MAX_TRACESTATE_LEN || !tracestate.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return Err(InvalidInput::Inconsistent(
                "tracestate must be at most 512 bytes of printable ASCII",
            ));
        }
        Ok(Self {
            traceparent: traceparent.to_owned(),
            tracestate: tracestate.to_owned(),
        })
    }

    /// The `traceparent` header.
    ///
    /// ```
    /// # let cx = taskfence::trace::TraceContext::new("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "").unwrap();
    /// assert!(cx.traceparent().starts_with("00-4bf92f"));
    /// ```
    pub fn traceparent(&self) -> &str {
        &self.traceparent
    }

    /// The `tracestate` header (empty when there was none).
    ///
    /// ```
    /// # let cx = taskfence::trace::TraceContext::new("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "a=1").unwrap();
    /// assert_eq!(cx.tracestate(), "a=1");
    /// ```
    pub fn tracestate(&self) -> &str {
        &self.tracestate
    }

    /// The trace id, 32 lowercase hex digits.
    ///
    /// ```
    /// # let cx = taskfence::trace::TraceContext::new("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "").unwrap();
    /// assert_eq!(cx.trace_id().len(), 32);
    /// ```
    pub fn trace_id(&self) -> &str {
        &self.traceparent[3..35]
    }

    /// The submitting span's id, 16 lowercase hex digits.
    ///
    /// ```
    /// # let cx = taskfence::trace::TraceContext::new("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "").unwrap();
    /// assert_eq!(cx.span_id(), "00f067aa0ba902b7");
    /// ```
    pub fn span_id(&self) -> &str {
        &self.traceparent[36..52]
    }

    /// The trace flags (bit 0: sampled).
    ///
    /// ```
    /// # let cx = taskfence::trace::TraceContext::new("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "").unwrap();
    /// assert_eq!(cx.flags(), 1);
    /// ```
    pub fn flags(&self) -> u8 {
        u8::from_str_radix(&self.traceparent[53..55], 16).expect("validated hex")
    }
}

/// The stored form: `traceparent`, then `;` and `tracestate` when there is
/// one (a `traceparent` never holds a `;`, so the first one splits them).
impl fmt::Display for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.traceparent)?;
        if !self.tracestate.is_empty() {
            write!(f, ";{}", self.tracestate)?;
        }
        Ok(())
    }
}

impl FromStr for TraceContext {
    type Err = InvalidInput;

    /// Reads the stored form back (see [`Display`](fmt::Display)).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (traceparent, tracestate) = s.split_once(';').unwrap_or((s, ""));
        Self::new(traceparent, tracestate)
    }
}

impl TryFrom<String> for TraceContext {
    type Error = InvalidInput;

    fn try_from(stored: String) -> Result<Self, Self::Error> {
        stored.parse()
    }
}

impl From<TraceContext> for String {
    fn from(cx: TraceContext) -> Self {
        cx.to_string()
    }
}
