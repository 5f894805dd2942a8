//! [`IdempotencyKey`]: the `Idempotency-Key` request header.
//!
//! The IETF draft (draft-ietf-httpapi-idempotency-key-header) defines the
//! value as a Structured Field String: `Idempotency-Key: "8e03978e-40d5-43e8"`.
//! Many deployed clients send the key unquoted, so a bare value of visible
//! ASCII is accepted too; both spell the same key. Anything else — no header,
//! two headers, an empty key, a key over [`taskfence::limits::MAX_KEY_LEN`]
//! bytes, bytes outside printable ASCII, parameters — is a 400.

use axum::extract::FromRequestParts;
use axum::http::StatusCode;
use axum::http::request::Parts;

use crate::problem::Problem;

/// The header's name.
pub const HEADER: &str = "idempotency-key";

/// A validated idempotency key: the client's id for one press of Send (or
/// Regenerate), reused verbatim when it retries that press.
///
/// ```
/// use chat_api::IdempotencyKey;
/// assert_eq!(IdempotencyKey::parse(br#""req-1""#).unwrap().as_str(), "req-1");
/// assert_eq!(IdempotencyKey::parse(b"req-1").unwrap().as_str(), "req-1");
/// assert!(IdempotencyKey::parse(br#""""#).is_err());
/// assert!(IdempotencyKey::parse(br#""a";exp=1"#).is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// Parses one header value; the error says what is wrong with it.
    pub fn parse(value: &[u8]) -> Result<Self, String> {
        let value = trim_ows(value);
        let key = match value.first() {
            Some(b'"') => parse_sf_string(value)?,
            _ => parse_bare(value)?,
        };
        taskfence::limits::check_text("Idempotency-Key", &key, taskfence::limits::MAX_KEY_LEN)
            .map_err(|e| e.to_string())?;
        Ok(Self(key))
    }

    /// The key.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn trim_ows(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

/// RFC 8941 §4.2.5: `"` then printable ASCII with `\"` and `\\` escapes, then `"`, then nothing.
fn parse_sf_string(value: &[u8]) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut bytes = value[1..].iter();
    while let Some(&b) = bytes.next() {
        match b {
            b'\\' => match bytes.next() {
                Some(&c @ (b'"' | b'\\')) => out.push(char::from(c)),
                _ => {
                    return Err(
                        "Idempotency-Key has an invalid escape (only \\\" and \\\\ are allowed)".into(),
                    );
                }
            },
            b'"' => {
                return if bytes.as_slice().is_empty() {
                    Ok(out)
                } else {
                    Err("Idempotency-Key must be a single string, without parameters".into())
                };
            }
            0x20..=0x7e => out.push(char::from(b)),
            _ => return Err("Idempotency-Key must be printable ASCII".into()),
        }
    }
    Err("Idempotency-Key string is not terminated".into())
}

fn parse_bare(value: &[u8]) -> Result<String, String> {
    if value.is_empty() {
        return Err("Idempotency-Key is empty".into());
    }
    match value
        .iter()
        .find(|&&b| !(0x21..=0x7e).contains(&b) || matches!(b, b'"' | b'\\' | b',' | b';'))
    {
        Some(_) => Err(
            "Idempotency-Key must be a quoted string, or visible ASCII without spaces, quotes, commas or semicolons"
                .into(),
        ),
        None => Ok(String::from_utf8_lossy(value).into_owned()),
    }
}

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Problem> {
        let mut values = parts.headers.get_all(HEADER).iter();
        let (Some(value), None) = (values.next(), values.next()) else {
            let detail = if parts.headers.contains_key(HEADER) {
                "send exactly one Idempotency-Key header"
            } else {
                "this operation requires an Idempotency-Key header: a new unique value for each press of \
                 Send, reused verbatim when that request is retried"
            };
            let slug = if parts.headers.contains_key(HEADER) {
                "idempotency-key-malformed"
            } else {
                "idempotency-key-missing"
            };
            return Err(Problem::new(StatusCode::BAD_REQUEST, slug, detail));
        };
        Self::parse(value.as_bytes())
            .map_err(|detail| Problem::new(StatusCode::BAD_REQUEST, "idempotency-key-malformed", detail))
    }
}
