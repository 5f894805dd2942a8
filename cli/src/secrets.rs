//! Secrets given to the tool: read from a file or the environment, where
//! other users cannot see them, rather than from the command line, where
//! `ps` and the shell's history show them. A secret typed on the command
//! line anyway still works, with a warning on stderr; so does a dashboard
//! listening beyond loopback.

use std::net::SocketAddr;
use std::path::Path;

use crate::error::CliError;

/// Prints `taskfence: warning: …` on stderr (never the secret itself).
pub(crate) fn warn(message: &str) {
    eprintln!("taskfence: warning: {message}");
}

/// The secret in the file at `path` (named by `flag` in errors), without
/// its trailing newline; an unreadable or empty file is a usage error.
pub(crate) fn read_file(flag: &str, path: &Path) -> Result<String, CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::Usage(format!("{flag} {}: cannot read it: {e}", path.display())))?;
    let secret = text.strip_suffix('\n').unwrap_or(&text);
    let secret = secret.strip_suffix('\r').unwrap_or(secret);
    if secret.is_empty() {
        return Err(CliError::Usage(format!(
            "{flag} {}: the file is empty",
            path.display()
        )));
    }
    Ok(secret.to_owned())
}

/// Whether a connection URL carries a password (`user:password@host`, or
/// `password=` among its parameters): only then is it a secret.
pub(crate) fn url_has_password(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let in_userinfo = authority
        .rsplit_once('@')
        .is_some_and(|(userinfo, _)| userinfo.contains(':'));
    let in_params = url
        .split_once('?')
        .is_some_and(|(_, query)| query.split('&').any(|p| p.starts_with("password=")));
    in_userinfo || in_params
}

/// Warns when the dashboard listens where others can reach it.
pub(crate) fn warn_unless_loopback(listen: SocketAddr) {
    if !listen.ip().is_loopback() {
        warn(&format!(
            "--listen {listen} is not a loopback address: whoever reaches it sees the dashboard and may try \
             the sign-in; serve it on 127.0.0.1, or behind a TLS proxy with your own authentication \
             (and --served-over-tls)"
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_in_urls() {
        assert!(url_has_password("postgres://app:hunter2@db:5432/x"));
        assert!(url_has_password(
            "postgres://app@db/x?sslmode=require&password=hunter2"
        ));
        assert!(!url_has_password("postgres://postgres@127.0.0.1:5432/test"));
        assert!(!url_has_password(
            "postgres://127.0.0.1:5432/test?sslmode=disable"
        ));
        assert!(!url_has_password("postgres://db:5432/x"));
    }
}
