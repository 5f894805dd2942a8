//! [`Response`]: the accepted result of a task, as bytes.

use std::fmt;

/// The accepted result of a task. Once saved it never changes.
///
/// Bytes, so any encoding works; helpers cover the common text case.
///
/// ```
/// use taskfence::Response;
/// let r = Response::from("Here are the key decisions…");
/// assert_eq!(r.as_str(), Some("Here are the key decisions…"));
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Response(Vec<u8>);

impl Response {
    /// Wraps response bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Self {
        Self(bytes.into())
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The bytes as UTF-8 text, if they are.
    pub fn as_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.0).ok()
    }

    /// Takes the bytes out.
    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }

    /// Byte length.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// `true` when empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Response {
    // Responses can hold user data: never print their content in logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Response({} bytes)", self.0.len())
    }
}

impl From<&str> for Response {
    fn from(s: &str) -> Self {
        Self(s.as_bytes().to_vec())
    }
}

impl From<String> for Response {
    fn from(s: String) -> Self {
        Self(s.into_bytes())
    }
}

impl From<Vec<u8>> for Response {
    fn from(b: Vec<u8>) -> Self {
        Self(b)
    }
}
