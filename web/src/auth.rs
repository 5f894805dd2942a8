//! Signing in with the action token: sessions, the CSRF value every action
//! form carries, and the throttle on wrong tokens.
//!
//! Each sign-in draws a fresh random session value (244 random bits) that
//! the browser holds in a cookie; the dashboard keeps only its digest and
//! when it expires, so signing out (or the lifetime running out) makes the
//! old cookie worthless, and a restart signs everyone out. The CSRF value is
//! a digest of the session and a per-process secret: a page of this
//! dashboard knows it, a form on another site does not. The cookie is
//! `HttpOnly` and `SameSite=Strict`; served over TLS it is also `Secure`
//! and named with the `__Host-` prefix, so no other host or plain-HTTP page
//! can set or read it.
//!
//! Wrong tokens are throttled: a client address gets [`FREE_FAILURES`]
//! tries, then each further failure locks it out for twice as long as the
//! last (from [`FIRST_LOCKOUT`] up to [`MAX_LOCKOUT`]); and over all
//! clients, [`GLOBAL_FAILURES_PER_MINUTE`] failures in a minute close
//! sign-in for the rest of that minute. A locked-out attempt is refused
//! (429 with `Retry-After`) before its token is even compared.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

/// The session cookie's name over plain HTTP.
pub(crate) const COOKIE: &str = "taskfence_session";
/// The session cookie's name when the dashboard is served over TLS: the
/// browser then insists on `Secure`, `Path=/` and no `Domain`.
pub(crate) const TLS_COOKIE: &str = "__Host-taskfence_session";

/// Wrong tokens a client address may send before it is locked out.
pub(crate) const FREE_FAILURES: u32 = 5;
/// The first lockout; each further failure doubles it.
pub(crate) const FIRST_LOCKOUT: Duration = Duration::from_secs(5);
/// The longest lockout.
pub(crate) const MAX_LOCKOUT: Duration = Duration::from_secs(15 * 60);
/// Wrong tokens over all clients in one minute that close sign-in for the
/// rest of that minute.
pub(crate) const GLOBAL_FAILURES_PER_MINUTE: u32 = 100;
/// Live sessions kept at most; past it the one closest to expiry is dropped.
const MAX_SESSIONS: usize = 10_000;
/// Client addresses remembered at most by the throttle.
const MAX_CLIENTS: usize = 10_000;

/// The configured token, as a digest; the live sessions; the throttle.
pub(crate) struct Auth {
    token_digest: [u8; 32],
    secret: [u8; 32],
    lifetime: Duration,
    /// Digest of each live session value → when it expires.
    sessions: Mutex<HashMap<[u8; 32], Instant>>,
    throttle: Mutex<Throttle>,
}

impl Auth {
    /// Sessions of `lifetime` for whoever offers `token`.
    pub(crate) fn new(token: &str, lifetime: Duration) -> Self {
        Self {
            token_digest: digest(&[token.as_bytes()]),
            secret: digest(&[random().as_bytes(), random().as_bytes()]),
            lifetime,
            sessions: Mutex::new(HashMap::new()),
            throttle: Mutex::new(Throttle::default()),
        }
    }

    /// How long a session lasts.
    pub(crate) fn lifetime(&self) -> Duration {
        self.lifetime
    }

    /// Whether `offered` is the token (compared as digests, in constant time).
    pub(crate) fn is_token(&self, offered: &str) -> bool {
        same(&digest(&[offered.as_bytes()]), &self.token_digest)
    }

    /// A new session after a successful sign-in: its cookie value.
    pub(crate) fn open_session(&self) -> String {
        let value = format!("{}{}", random(), random());
        let now = Instant::now();
        let mut sessions = lock(&self.sessions);
        sessions.retain(|_, expires| *expires > now);
        if sessions.len() >= MAX_SESSIONS
            && let Some(oldest) = sessions.iter().min_by_key(|(_, e)| **e).map(|(k, _)| *k)
        {
            sessions.remove(&oldest);
        }
        sessions.insert(digest(&[value.as_bytes()]), now + self.lifetime);
        value
    }

    /// Whether a cookie's value is a live session.
    pub(crate) fn is_session(&self, value: &str) -> bool {
        let key = digest(&[value.as_bytes()]);
        lock(&self.sessions)
            .get(&key)
            .is_some_and(|expires| *expires > Instant::now())
    }

    /// Ends the session `value` (signing out): its cookie is refused from now on.
    pub(crate) fn close_session(&self, value: &str) {
        lock(&self.sessions).remove(&digest(&[value.as_bytes()]));
    }

    /// The CSRF value the action forms of session `session` carry.
    pub(crate) fn csrf(&self, session: &str) -> String {
        hex(&digest(&[
            b"taskfence-web csrf",
            &self.secret,
            session.as_bytes(),
        ]))
    }

    /// Whether a form's CSRF value is the right one for `session`.
    pub(crate) fn is_csrf(&self, session: &str, value: &str) -> bool {
        same(value.as_bytes(), self.csrf(session).as_bytes())
    }

    /// `Err(retry after)` while `client` (or everyone) is locked out.
    pub(crate) fn may_try(&self, client: Option<IpAddr>) -> Result<(), Duration> {
        lock(&self.throttle).may_try(client, Instant::now())
    }

    /// Counts a wrong token from `client`.
    pub(crate) fn failed(&self, client: Option<IpAddr>) {
        lock(&self.throttle).failed(client, Instant::now());
    }

    /// Forgets `client`'s failures after it signed in.
    pub(crate) fn succeeded(&self, client: Option<IpAddr>) {
        lock(&self.throttle).clients.remove(&client);
    }
}

/// One client's wrong tokens since its last success.
#[derive(Debug, Clone, Copy)]
struct Strikes {
    failures: u32,
    last: Instant,
    locked_until: Option<Instant>,
}

/// Failures per client address (`None`: the address is unknown, e.g. the
/// router runs without `ConnectInfo`, so all such clients share one count)
/// and over all clients in the current minute.
#[derive(Debug, Default)]
struct Throttle {
    clients: HashMap<Option<IpAddr>, Strikes>,
    window: Option<(Instant, u32)>,
}

impl Throttle {
    fn may_try(&self, client: Option<IpAddr>, now: Instant) -> Result<(), Duration> {
        if let Some((start, count)) = self.window {
            let end = start + Duration::from_secs(60);
            if count >= GLOBAL_FAILURES_PER_MINUTE && end > now {
                return Err(end - now);
            }
        }
        match self.clients.get(&client).and_then(|s| s.locked_until) {
            Some(until) if until > now => Err(until - now),
            _ => Ok(()),
        }
    }

    fn failed(&mut self, client: Option<IpAddr>, now: Instant) {
        self.window = match self.window {
            Some((start, count)) if now < start + Duration::from_secs(60) => Some((start, count + 1)),
            _ => Some((now, 1)),
        };
        if self.clients.len() >= MAX_CLIENTS {
            self.clients.retain(|_, s| {
                s.locked_until.is_some_and(|u| u > now) || now.duration_since(s.last) < MAX_LOCKOUT
            });
        }
        let strikes = self.clients.entry(client).or_insert(Strikes {
            failures: 0,
            last: now,
            locked_until: None,
        });
        // A client quiet for longer than the longest lockout starts afresh.
        if now.duration_since(strikes.last) > MAX_LOCKOUT {
            strikes.failures = 0;
        }
        strikes.failures = strikes.failures.saturating_add(1);
        strikes.last = now;
        if strikes.failures > FREE_FAILURES {
            let doublings = (strikes.failures - FREE_FAILURES - 1).min(16);
            let lockout = FIRST_LOCKOUT.saturating_mul(1 << doublings).min(MAX_LOCKOUT);
            strikes.locked_until = Some(now + lockout);
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The maps stay consistent whatever panicked while holding them.
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// 122 random bits (a v4 UUID, from the operating system's generator) as hex.
fn random() -> String {
    uuid::Uuid::new_v4().simple().to_string()
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
    fn sessions_are_random_and_revocable() {
        let a = Auth::new("0123456789abcdef", Duration::from_secs(60));
        assert!(a.is_token("0123456789abcdef"));
        assert!(!a.is_token("0123456789abcdeF"));
        let (one, two) = (a.open_session(), a.open_session());
        assert_ne!(one, two);
        assert!(a.is_session(&one) && a.is_session(&two) && !a.is_session("x"));
        assert!(a.is_csrf(&one, &a.csrf(&one)) && !a.is_csrf(&two, &a.csrf(&one)));
        a.close_session(&one);
        assert!(!a.is_session(&one) && a.is_session(&two));
    }

    #[test]
    fn lockouts_double_up_to_the_maximum() {
        let mut t = Throttle::default();
        let now = Instant::now();
        let client = Some(IpAddr::from([10, 0, 0, 1]));
        for _ in 0..FREE_FAILURES {
            assert!(t.may_try(client, now).is_ok());
            t.failed(client, now);
        }
        assert!(t.may_try(client, now).is_ok());
        t.failed(client, now);
        assert_eq!(t.may_try(client, now), Err(FIRST_LOCKOUT));
        assert!(t.may_try(Some(IpAddr::from([10, 0, 0, 2])), now).is_ok());
        t.failed(client, now);
        assert_eq!(t.may_try(client, now), Err(FIRST_LOCKOUT * 2));
        for _ in 0..40 {
            t.failed(client, now);
        }
        assert_eq!(t.may_try(client, now), Err(MAX_LOCKOUT));
    }

    #[test]
    fn cookies() {
        assert_eq!(cookie("a=1; taskfence_session=xyz; b=2", COOKIE), Some("xyz"));
        assert_eq!(cookie("a=1", COOKIE), None);
    }
}
