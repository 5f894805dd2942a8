//! [`IdempotencyKey`]: the `Idempotency-Key` request header, and
//! [`IdempotencyKeyRejection`]: why a request has no usable one.
//!
//! The IETF draft (draft-ietf-httpapi-idempotency-key-header) defines the
//! value as a Structured Field String: `Idempotency-Key: "8e03978e-40d5-43e8"`.
//! Many deployed clients send the key unquoted, so a bare value of visible
//! ASCII is accepted too; both spell the same key. Anything else — no header,
//! two headers, an empty key, a key over [`taskfence::limits::MAX_KEY_LEN`]
//! bytes, bytes outside printable ASCII, parameters — is a 400.

use std::fmt;

use axum::extract::{FromRequestParts, OptionalFromRequestParts};
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use http::request::Parts;
use taskfence::limits;

use crate::problem::{Problem, ProblemTypes};

/// The header's name (lowercase, as HTTP/2 and `http` spell it).
///
/// ```
/// assert_eq!(taskfence_axum::IDEMPOTENCY_KEY, "idempotency-key");
/// ```
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The response header on every replay, with the value `true`: this answer
/// was given before, to the first request with this key, and nothing ran
/// again. The draft defines no such header; Stripe's name is the one
/// clients already know. The status is the first response's (a created
/// task replays as `201`), so a client reads "replayed" here, never from
/// the status.
///
/// ```
/// assert_eq!(taskfence_axum::IDEMPOTENT_REPLAYED, "idempotent-replayed");
/// ```
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// A validated idempotency key: the client's id for one request (one press of
/// Send, say), reused verbatim when it retries that request.
///
/// As an axum extractor it reads the single `Idempotency-Key` header and
/// rejects the request with an [`IdempotencyKeyRejection`] (a 400
/// problem+json) when it is missing or malformed. Use it as the request key
/// of the submission: `RequestKey::new(user, operation, key.as_str())`.
///
/// ```
/// use taskfence_axum::IdempotencyKey;
/// assert_eq!(IdempotencyKey::parse(br#""req-1""#).unwrap().as_str(), "req-1");
/// assert_eq!(IdempotencyKey::parse(b"req-1").unwrap().as_str(), "req-1");
/// assert!(IdempotencyKey::parse(br#""""#).is_err());
/// assert!(IdempotencyKey::parse(br#""a";exp=1"#).is_err());
/// ```
///
/// In a handler:
///
/// ```
/// use axum::{Router, routing::post};
/// use taskfence_axum::IdempotencyKey;
///
/// async fn create(key: IdempotencyKey) -> String {
///     format!("key {}", key.as_str())
/// }
/// let app: Router = Router::new().route("/jobs", post(create));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// Parses one header value: a Structured Field String (RFC 8941 §4.2.5:
    /// printable ASCII between quotes, with `\"` and `\\` escapes, no
    /// parameters), or a bare run of visible ASCII without quotes, backslashes,
    /// commas or semicolons. Optional whitespace around it is ignored. The key
    /// must then pass [`taskfence::limits::check_text`]: not blank, at most
    /// [`MAX_KEY_LEN`](taskfence::limits::MAX_KEY_LEN) bytes.
    ///
    /// ```
    /// use taskfence_axum::{IdempotencyKey, IdempotencyKeyRejection};
    /// assert_eq!(IdempotencyKey::parse(br#" "a \"b\"" "#).unwrap().as_str(), r#"a "b""#);
    /// assert!(matches!(
    ///     IdempotencyKey::parse(b"two words"),
    ///     Err(IdempotencyKeyRejection::Malformed(_))
    /// ));
    /// ```
    pub fn parse(value: &[u8]) -> Result<Self, IdempotencyKeyRejection> {
        let value = trim_ows(value);
        let key = match value.first() {
            Some(b'"') => parse_sf_string(value),
            _ => parse_bare(value),
        }
        .map_err(IdempotencyKeyRejection::Malformed)?;
        limits::check_text("Idempotency-Key", &key, limits::MAX_KEY_LEN)
            .map_err(|e| IdempotencyKeyRejection::Malformed(e.to_string()))?;
        Ok(Self(key))
    }

    /// The key.
    ///
    /// ```
    /// let key = taskfence_axum::IdempotencyKey::parse(b"\"k-1\"").unwrap();
    /// assert_eq!(key.as_str(), "k-1");
    /// ```
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Takes the key out.
    ///
    /// ```
    /// let key = taskfence_axum::IdempotencyKey::parse(b"k-1").unwrap();
    /// assert_eq!(key.into_string(), "k-1");
    /// ```
    pub fn into_string(self) -> String {
        self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for IdempotencyKey {
    fn as_ref(&self) -> &str {
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

impl IdempotencyKey {
    /// The key of a request's headers: `Ok(None)` without the header, an
    /// error for two headers or a malformed one. What both extractors use,
    /// and what a middleware calls.
    ///
    /// ```
    /// use http::{HeaderMap, HeaderValue};
    /// use taskfence_axum::{IdempotencyKey, IdempotencyKeyRejection};
    /// let mut headers = HeaderMap::new();
    /// assert_eq!(IdempotencyKey::from_headers(&headers), Ok(None));
    /// headers.append("idempotency-key", HeaderValue::from_static("\"k-1\""));
    /// assert_eq!(IdempotencyKey::from_headers(&headers).unwrap().unwrap().as_str(), "k-1");
    /// headers.append("idempotency-key", HeaderValue::from_static("k-2"));
    /// assert_eq!(IdempotencyKey::from_headers(&headers), Err(IdempotencyKeyRejection::Multiple));
    /// ```
    pub fn from_headers(headers: &http::HeaderMap) -> Result<Option<Self>, IdempotencyKeyRejection> {
        let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
        match (values.next(), values.next()) {
            (None, _) => Ok(None),
            (Some(_), Some(_)) => Err(IdempotencyKeyRejection::Multiple),
            (Some(value), None) => Self::parse(value.as_bytes()).map(Some),
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyKey {
    type Rejection = IdempotencyKeyRejection;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Self::from_headers(&parts.headers)?.ok_or(IdempotencyKeyRejection::Missing)
    }
}

/// `Option<IdempotencyKey>`: for an operation where the key is optional.
/// No header is `None` (the request is not deduplicated); a header that is
/// there but malformed, or two of them, is still a 400 — a client that
/// meant to send a key learns that it did not work.
///
/// ```
/// use axum::{Router, routing::post};
/// use taskfence_axum::IdempotencyKey;
///
/// async fn create(key: Option<IdempotencyKey>) -> String {
///     match key {
///         Some(key) => format!("deduplicated under {key}"),
///         None => "not deduplicated".to_owned(),
///     }
/// }
/// let app: Router = Router::new().route("/jobs", post(create));
/// ```
impl<S: Send + Sync> OptionalFromRequestParts<S> for IdempotencyKey {
    type Rejection = IdempotencyKeyRejection;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Option<Self>, Self::Rejection> {
        Self::from_headers(&parts.headers)
    }
}

/// Why a request has no usable `Idempotency-Key`. As a response it is a 400
/// `application/problem+json` with the [default types](ProblemTypes::default);
/// [`ProblemTypes::key_rejection`] renders it under your own.
///
/// | variant | problem type |
/// | --- | --- |
/// | `Missing` | `idempotency-key-missing` |
/// | `Multiple`, `Malformed` | `idempotency-key-malformed` |
///
/// ```
/// use axum::response::IntoResponse;
/// use http::StatusCode;
/// use taskfence_axum::IdempotencyKeyRejection;
/// let response = IdempotencyKeyRejection::Missing.into_response();
/// assert_eq!(response.status(), StatusCode::BAD_REQUEST);
/// assert_eq!(response.headers()["content-type"], "application/problem+json");
/// ```
///
/// To render it under other problem types, take a `Result` and map it:
///
/// ```
/// use taskfence_axum::{IdempotencyKey, IdempotencyKeyRejection, Problem, ProblemTypes};
/// const TYPES: ProblemTypes = ProblemTypes::new("https://api.example.com/problems/");
/// async fn create(key: Result<IdempotencyKey, IdempotencyKeyRejection>) -> Result<String, Problem> {
///     let key = key.map_err(|r| TYPES.key_rejection(&r))?;
///     Ok(key.into_string())
/// }
/// let app: axum::Router = axum::Router::new().route("/jobs", axum::routing::post(create));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum IdempotencyKeyRejection {
    /// No `Idempotency-Key` header.
    Missing,
    /// More than one `Idempotency-Key` header.
    Multiple,
    /// The one header is not a valid key; the text says why.
    Malformed(String),
}

impl IdempotencyKeyRejection {
    /// The problem type's slug: `idempotency-key-missing` or `idempotency-key-malformed`.
    ///
    /// ```
    /// use taskfence_axum::IdempotencyKeyRejection;
    /// assert_eq!(IdempotencyKeyRejection::Multiple.slug(), "idempotency-key-malformed");
    /// ```
    pub fn slug(&self) -> &'static str {
        match self {
            Self::Missing => "idempotency-key-missing",
            Self::Multiple | Self::Malformed(_) => "idempotency-key-malformed",
        }
    }

    /// What the client should do, for the problem's `detail`.
    ///
    /// ```
    /// use taskfence_axum::IdempotencyKeyRejection;
    /// assert_eq!(IdempotencyKeyRejection::Multiple.detail(), "send exactly one Idempotency-Key header");
    /// ```
    pub fn detail(&self) -> &str {
        match self {
            Self::Missing => {
                "this operation requires an Idempotency-Key header: a new unique value for each request, \
                 reused verbatim when that request is retried"
            }
            Self::Multiple => "send exactly one Idempotency-Key header",
            Self::Malformed(why) => why,
        }
    }
}

impl fmt::Display for IdempotencyKeyRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.detail())
    }
}

impl std::error::Error for IdempotencyKeyRejection {}

impl IntoResponse for IdempotencyKeyRejection {
    fn into_response(self) -> Response {
        ProblemTypes::default().key_rejection(&self).into_response()
    }
}

impl From<IdempotencyKeyRejection> for Problem {
    /// The rejection under the [default types](ProblemTypes::default).
    fn from(rejection: IdempotencyKeyRejection) -> Self {
        ProblemTypes::default().key_rejection(&rejection)
    }
}

impl ProblemTypes {
    /// A rejected `Idempotency-Key` as a 400 problem of these types.
    ///
    /// ```
    /// use http::StatusCode;
    /// use taskfence_axum::{IdempotencyKeyRejection, ProblemTypes};
    /// let p = ProblemTypes::default().key_rejection(&IdempotencyKeyRejection::Missing);
    /// assert_eq!(p.status(), StatusCode::BAD_REQUEST);
    /// assert_eq!(p.problem_type(), "/problems/idempotency-key-missing");
    /// ```
    pub fn key_rejection(&self, rejection: &IdempotencyKeyRejection) -> Problem {
        self.problem(StatusCode::BAD_REQUEST, rejection.slug(), rejection.detail())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(value: &[u8]) -> Result<String, IdempotencyKeyRejection> {
        IdempotencyKey::parse(value).map(IdempotencyKey::into_string)
    }

    #[test]
    fn the_quoted_and_the_bare_spelling_are_the_same_key() {
        let uuid = "8e03978e-40d5-43e8-bc93-6894a57f9324";
        assert_eq!(key(format!("\"{uuid}\"").as_bytes()).unwrap(), uuid);
        assert_eq!(key(uuid.as_bytes()).unwrap(), uuid);
        assert_eq!(key(b" \t\"k\"\t ").unwrap(), "k");
        assert_eq!(key(br#""a\\b""#).unwrap(), r"a\b");
        assert_eq!(key(b"\"with space\"").unwrap(), "with space");
    }

    #[test]
    fn malformed_values_are_rejected_with_a_reason() {
        let too_long = format!("\"{}\"", "k".repeat(limits::MAX_KEY_LEN + 1));
        let at_limit = format!("\"{}\"", "k".repeat(limits::MAX_KEY_LEN));
        assert!(key(at_limit.as_bytes()).is_ok());
        for bad in [
            &b"\"\""[..],        // empty
            b"",                 // empty, bare
            b"\"   \"",          // blank
            b"\"unterminated",   // not a string
            b"\"a\";expires=1",  // parameters
            b"\"a\\nb\"",        // invalid escape
            b"two words",        // bare, with a space
            b"a,b",              // a list
            b"a;b",              // bare, with a parameter
            b"\"caf\xc3\xa9\"",  // not ASCII
            b"caf\xc3\xa9",      // not ASCII, bare
            b"\"a\x01b\"",       // a control byte
            b"a\x7fb",           // DEL
            too_long.as_bytes(), // over the limit
        ] {
            match key(bad) {
                Err(IdempotencyKeyRejection::Malformed(why)) => assert!(!why.is_empty()),
                other => panic!("{:?} gave {other:?}", String::from_utf8_lossy(bad)),
            }
        }
    }
}
