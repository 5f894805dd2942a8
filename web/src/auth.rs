//! Signing in with the action token, and the CSRF value every action form
//! carries.
//!
//! The token is typed once on the sign-in page; the browser then holds a
//! session value derived from it and a secret drawn when the router is built
//! (so the cookie never holds the token, and a restart signs everyone out).
//! The CSRF value is derived from the session the same way: a page of this
//! dashboard knows it, a form on another site does not. The session cookie
//! is also `SameSite=Strict` and `HttpOnly`.

use sha2::{Digest, Sha256};

/// The session cookie's name.
pub(crate) const COOKIE: &str = "taskfence_session";

/// The configured token, as digests, and the values derived from it.
pub(crate) struct Auth {
    token_digest: [u8; 32],
    session: String,
    csrf: String,
}

impl Auth {
    /// Derives the session and CSRF values of `token` under a fresh secret.
    pub(crate) fn new(token: &str) -> Self {
        let mut secret = Vec::with_capacity(32);
        secret.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
        secret.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
        let session = hex(&digest(&[b"taskfence-web session", &secret, token.as_bytes()]));
        let csrf = hex(&digest(&[b"taskfence-web csrf", &secret, session.as_bytes()]));
        Self {
            token_digest: digest(&[token.as_bytes()]),
            session,
            csrf,
        }
    }

    /// Whether `offered` is the token (compared as digests, in constant time).
    pub(crate) fn is_token(&self, offered: &str) -> bool {
        same(&digest(&[offered.as_bytes()]), &self.token_digest)
    }

    /// The session cookie's value after a successful sign-in.
    pub(crate) fn session(&self) -> &str {
        &self.session
    }

    /// Whether a cookie's value is the session.
    pub(crate) fn is_session(&self, value: &str) -> bool {
        same(value.as_bytes(), self.session.as_bytes())
    }

    /// The CSRF value the action forms carry.
    pub(crate) fn csrf(&self) -> &str {
        &self.csrf
    }

    /// Whether a form's CSRF value is the right one.
    pub(crate) fn is_csrf(&self, value: &str) -> bool {
        same(value.as_bytes(), self.csrf.as_bytes())
    }
}

fn digest(parts: &[&[u8]]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part);
    }
    hasher.finalize().into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Equality whose time does not depend on where the inputs differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The value of cookie `name` in a `Cookie` header.
pub(crate) fn cookie<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header.split(';').find_map(|pair| {
        let (k, v) = pair.trim().split_once('=')?;
        (k == name).then_some(v)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_follow_the_token_and_the_secret() {
        let a = Auth::new("0123456789abcdef");
        assert!(a.is_token("0123456789abcdef"));
        assert!(!a.is_token("0123456789abcdeF"));
        assert!(a.is_session(a.session()) && !a.is_session("x"));
        assert!(a.is_csrf(a.csrf()) && !a.is_csrf(a.session()));
        // Another process (another secret) signs the same token in differently.
        assert_ne!(Auth::new("0123456789abcdef").session(), a.session());
    }

    #[test]
    fn cookies() {
        assert_eq!(cookie("a=1; taskfence_session=xyz; b=2", COOKIE), Some("xyz"));
        assert_eq!(cookie("a=1", COOKIE), None);
    }
}
