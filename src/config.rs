//! A deployment's settings as a binary reads them: environment variables
//! under the `TASKFENCE_` prefix that the binary does not know are reported
//! at start-up (with a "did you mean" for a close known name), never
//! silently ignored, and renamed settings are read under their former name
//! for one minor version, with a warning saying what replaces them.
//!
//! The command-line tool and every template call [`unknown_env`] with the
//! names they read and print its [`UnknownVars`] as one warning; a former
//! name they still accept is reported with [`Renamed::warning`]. Both are
//! plain functions of their input: no logging, no dependency, no feature.
//! With the `clap` feature, [`unknown_env_of`] and [`startup_warnings`]
//! read the names from a `clap::Command`; with `postgres`,
//! [`connect_postgres`] opens a service's store. [`parse_duration`] reads
//! every duration flag.
//!
//! ```
//! use taskfence::config::{unknown_env_among, Renamed};
//!
//! let known = ["TASKFENCE_CONCURRENCY", "TASKFENCE_LEASE"];
//! let present = ["PATH", "TASKFENCE_CONCURENCY", "TASKFENCE_LEASE", "TASKFENCE_COLOUR"];
//! let unknown = unknown_env_among(present, &known).expect("two are unknown");
//! assert_eq!(
//!     unknown.to_string(),
//!     "unknown environment variables, ignored: TASKFENCE_COLOUR, \
//!      TASKFENCE_CONCURENCY (did you mean TASKFENCE_CONCURRENCY?)"
//! );
//!
//! let renamed = Renamed::new("--per-partition", "--concurrency");
//! assert!(renamed.warning().contains("removed in 0.3"));
//! ```

use std::fmt;

/// The prefix of the environment variables taskfence's binaries read.
pub const PREFIX: &str = "TASKFENCE_";

/// The release that removes the former names still accepted now: a renamed
/// command, flag or variable is read under its old name for one minor
/// version.
///
/// ```
/// assert_eq!(taskfence::config::ALIASES_REMOVED_IN, "0.3");
/// ```
pub const ALIASES_REMOVED_IN: &str = "0.3";

/// A duration as a setting spells it: `250ms`, `30s`, `5m`, `24h`, or a
/// bare number of seconds. One rule for every flag, variable and query
/// parameter of a service, so `--lease 30s` and `?wait=30s` read alike:
/// every template and broker crate parses its duration flags with it
/// (`value_parser = parse_duration`).
///
/// ```
/// use std::time::Duration;
/// use taskfence::config::parse_duration;
///
/// assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
/// assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
/// assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86_400)));
/// assert!(parse_duration("1.5s").is_err());
/// ```
pub fn parse_duration(text: &str) -> Result<std::time::Duration, InvalidDuration> {
    let text = text.trim();
    let units: [(&str, u64); 4] = [("ms", 1), ("s", 1_000), ("m", 60_000), ("h", 3_600_000)];
    let (number, unit_ms) = units
        .iter()
        .find_map(|(suffix, ms)| Some((text.strip_suffix(suffix)?, *ms)))
        .unwrap_or((text, 1_000));
    let digits = !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit());
    digits
        .then(|| number.parse::<u64>().ok()?.checked_mul(unit_ms))
        .flatten()
        .map(std::time::Duration::from_millis)
        .ok_or_else(|| InvalidDuration(text.to_owned()))
}

/// Text [`parse_duration`] does not read: not a whole number with one of its
/// units, or too long to count in milliseconds.
///
/// ```
/// let error = taskfence::config::parse_duration("soon").unwrap_err();
/// assert_eq!(error.to_string(), r#""soon" is not a duration like 500ms, 30s, 5m or 24h"#);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidDuration(String);

impl fmt::Display for InvalidDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} is not a duration like 500ms, 30s, 5m or 24h", self.0)
    }
}

impl std::error::Error for InvalidDuration {}

/// The `TASKFENCE_*` variables set in this process's environment that are
/// not in `known`, with a suggestion for each; `None` when every one is
/// known. Call it once at start-up and log the answer as a warning: a
/// misspelt or retired variable would otherwise change nothing, silently.
///
/// ```
/// // A binary that reads only TASKFENCE_LEASE.
/// if let Some(unknown) = taskfence::config::unknown_env(&["TASKFENCE_LEASE"]) {
///     eprintln!("warning: {unknown}");
/// }
/// ```
pub fn unknown_env(known: &[&str]) -> Option<UnknownVars> {
    unknown_env_among(std::env::vars_os().map(|(name, _)| name), known)
}

/// [`unknown_env`] over the variable names `present` instead of the
/// process's environment (names not valid Unicode are skipped: none of
/// taskfence's is).
///
/// ```
/// use taskfence::config::unknown_env_among;
///
/// assert!(unknown_env_among(["HOME", "TASKFENCE_LEASE"], &["TASKFENCE_LEASE"]).is_none());
/// let unknown = unknown_env_among(["TASKFENCE_LAESE"], &["TASKFENCE_LEASE"]).unwrap();
/// assert_eq!(unknown.vars()[0].suggestion(), Some("TASKFENCE_LEASE"));
/// ```
pub fn unknown_env_among<I, S>(present: I, known: &[&str]) -> Option<UnknownVars>
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut vars: Vec<UnknownVar> = present
        .into_iter()
        .filter_map(|name| name.as_ref().to_str().map(str::to_owned))
        .filter(|name| name.starts_with(PREFIX) && !known.contains(&name.as_str()))
        .map(|name| UnknownVar {
            suggestion: closest(&name, known).map(str::to_owned),
            name,
        })
        .collect();
    vars.sort_by(|a, b| a.name.cmp(&b.name));
    vars.dedup_by(|a, b| a.name == b.name);
    (!vars.is_empty()).then_some(UnknownVars { vars })
}

/// [`unknown_env`] for a `clap` command: the names known are the
/// environment variables its arguments read (flattened groups and hidden
/// former names included), so a binary never lists them twice.
///
/// ```
/// let command = clap::Command::new("worker").arg(clap::Arg::new("lease").env("TASKFENCE_LEASE"));
/// assert!(taskfence::config::unknown_env_of(&command).is_none_or(|u| {
///     u.vars().iter().all(|var| var.name() != "TASKFENCE_LEASE")
/// }));
/// ```
#[cfg(feature = "clap")]
#[cfg_attr(docsrs, doc(cfg(feature = "clap")))]
pub fn unknown_env_of(command: &clap::Command) -> Option<UnknownVars> {
    let known: Vec<&str> = command
        .get_arguments()
        .filter_map(|arg| arg.get_env()?.to_str())
        .collect();
    unknown_env(&known)
}

/// `T` (a group of `clap` arguments) with each argument at the default it
/// declares, whatever the environment says: the defaults a service's
/// `Default` and its tests' configuration use, written once, on the flags.
///
/// ```
/// use std::time::Duration;
///
/// #[derive(Debug, clap::Args)]
/// struct Worker {
///     #[arg(long, env = "MY_LEASE", value_parser = taskfence::config::parse_duration, default_value = "30s")]
///     lease: Duration,
/// }
/// let worker: Worker = taskfence::config::defaults();
/// assert_eq!(worker.lease, Duration::from_secs(30));
/// ```
///
/// # Panics
///
/// When an argument of `T` has no default (nor `#[arg(skip)]`): a mistake in
/// `T`'s definition, which its first use shows.
#[cfg(feature = "clap")]
#[cfg_attr(docsrs, doc(cfg(feature = "clap")))]
pub fn defaults<T: clap::Args + clap::FromArgMatches>() -> T {
    let command = T::augment_args(clap::Command::new("defaults")).mut_args(|arg| arg.env(None::<&str>));
    T::from_arg_matches(&command.get_matches_from(["defaults"])).expect("every argument has a default")
}

/// What a binary logs at start-up about its settings, one warning a line:
/// each former name it read (`former`), then the `TASKFENCE_*` variables
/// no argument of `command` reads ([`unknown_env_of`]).
///
/// ```
/// use taskfence::config::{Renamed, startup_warnings};
///
/// let command = clap::Command::new("worker");
/// let former = [Renamed::new("--per-partition", "--concurrency")];
/// let warnings = startup_warnings(&command, &former);
/// assert!(warnings[0].starts_with("`--per-partition` is deprecated"));
/// ```
#[cfg(feature = "clap")]
#[cfg_attr(docsrs, doc(cfg(feature = "clap")))]
pub fn startup_warnings(command: &clap::Command, former: &[Renamed]) -> Vec<String> {
    let unknown = unknown_env_of(command).map(|unknown| unknown.to_string());
    former.iter().map(Renamed::warning).chain(unknown).collect()
}

/// Why [`connect_postgres`] could not open the store.
///
/// ```
/// # async fn demo() {
/// let error = taskfence::config::connect_postgres("not a url", "taskfence", 4, "worker")
///     .await
///     .unwrap_err();
/// assert!(matches!(error, taskfence::config::ConnectError::Url(_)));
/// # }
/// ```
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The database URL does not parse.
    #[error("DATABASE_URL: {0}")]
    Url(#[source] sqlx::Error),
    /// No connection could be opened.
    #[error("connecting to PostgreSQL: {0}")]
    Connect(#[source] sqlx::Error),
    /// The schema name is invalid.
    #[error(transparent)]
    Store(#[from] crate::Error),
}

/// The [`PgStore`](crate::PgStore) of a service, on a pool of its own:
/// the one way every template opens it, so none copies pool settings.
///
/// The URL's TLS parameters apply (`?sslmode=require`, or `verify-full`
/// with `sslrootcert=/path/ca.pem` as RDS recommends). The pool holds up to
/// `max_connections` (cover the concurrency, the lease renewals and a
/// dispatcher beside them), names its sessions `application_name`
/// (`pg_stat_activity`), and pings no connection before use: one round
/// trip per store operation, a dead connection failing only the operation,
/// which the worker retries. Migrating is the caller's choice
/// ([`PgStore::migrate`](crate::PgStore::migrate)).
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let url = std::env::var("DATABASE_URL")?;
/// let store = taskfence::config::connect_postgres(&url, "taskfence", 20, "my-worker").await?;
/// store.migrate().await?;
/// # Ok(()) }
/// ```
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub async fn connect_postgres(
    url: &str,
    schema: &str,
    max_connections: u32,
    application_name: &str,
) -> Result<crate::PgStore, ConnectError> {
    let pool = connect_pool(url, None, max_connections, application_name).await?;
    Ok(crate::PgStore::builder(pool).schema(schema).build()?)
}

/// The pool of a service that keeps tables of its own beside taskfence's:
/// the pool [`connect_postgres`] opens, and, with `app_schema`, that schema
/// created if missing and first in every connection's `search_path`
/// ([`postgres::app_schema`](crate::postgres::app_schema)), so the
/// service's unqualified SQL and migrations always mean it, on every
/// connection (one opened after a failover included). Without it the
/// server's default `search_path` (normally `public`) applies.
///
/// The same settings as [`connect_postgres`]: the URL's TLS parameters, up
/// to `max_connections`, sessions named `application_name`, no ping before
/// use (a dead connection fails one operation, which the client or worker
/// retries with the same key), a 10 s wait for a free connection at most.
///
/// ```no_run
/// # async fn demo() -> Result<(), taskfence::config::ConnectError> {
/// let pool = taskfence::config::connect_pool("postgres://app@db/chat", Some("chat"), 32, "chat-api").await?;
/// let store = taskfence::PgStore::builder(pool).build()?;
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// The URL does not parse ([`ConnectError::Url`]); the app schema cannot be
/// created or no connection opens ([`ConnectError::Connect`]).
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub async fn connect_pool(
    url: &str,
    app_schema: Option<&str>,
    max_connections: u32,
    application_name: &str,
) -> Result<sqlx::PgPool, ConnectError> {
    use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
    let mut options: PgConnectOptions = url.parse().map_err(ConnectError::Url)?;
    if let Some(schema) = app_schema {
        options = crate::postgres::app_schema(options, schema)
            .await
            .map_err(ConnectError::Connect)?;
    }
    PgPoolOptions::new()
        .max_connections(max_connections)
        .test_before_acquire(false)
        .acquire_timeout(std::time::Duration::from_secs(10))
        .connect_with(options.application_name(application_name))
        .await
        .map_err(ConnectError::Connect)
}

/// One environment variable no part of the binary reads.
///
/// ```
/// let unknown = taskfence::config::unknown_env_among(["TASKFENCE_X"], &[]).unwrap();
/// assert_eq!(unknown.vars()[0].name(), "TASKFENCE_X");
/// assert_eq!(unknown.vars()[0].suggestion(), None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownVar {
    name: String,
    suggestion: Option<String>,
}

impl UnknownVar {
    /// The variable's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The known name it most likely meant: one or two typing slips away,
    /// or the same words in another order (`None`: nothing close).
    pub fn suggestion(&self) -> Option<&str> {
        self.suggestion.as_deref()
    }
}

impl fmt::Display for UnknownVar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.suggestion {
            Some(known) => write!(f, "{} (did you mean {known}?)", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// The unknown variables of one start-up, in name order; its `Display` is
/// the one-line warning to log.
///
/// ```
/// let unknown = taskfence::config::unknown_env_among(["TASKFENCE_B", "TASKFENCE_A"], &[]).unwrap();
/// assert_eq!(unknown.to_string(), "unknown environment variables, ignored: TASKFENCE_A, TASKFENCE_B");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownVars {
    vars: Vec<UnknownVar>,
}

impl UnknownVars {
    /// Each unknown variable (never empty).
    pub fn vars(&self) -> &[UnknownVar] {
        &self.vars
    }
}

impl fmt::Display for UnknownVars {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.vars.len() {
            1 => "unknown environment variable, ignored: ",
            _ => "unknown environment variables, ignored: ",
        };
        f.write_str(what)?;
        for (i, var) in self.vars.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{var}")?;
        }
        Ok(())
    }
}

/// A setting read under its former name: a command, flag or variable
/// renamed before 0.1 that old scripts and deployments still use. It works
/// until [`ALIASES_REMOVED_IN`]; [`warning`](Self::warning) says so.
///
/// ```
/// use taskfence::config::Renamed;
///
/// let retry = Renamed::new("taskfence retry", "taskfence reopen").note("the same arguments");
/// assert_eq!(
///     retry.warning(),
///     "`taskfence retry` is deprecated and will be removed in 0.3: \
///      use `taskfence reopen` (the same arguments)"
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Renamed {
    old: String,
    new: String,
    note: Option<String>,
}

impl Renamed {
    /// `old` is now called `new`.
    pub fn new(old: impl Into<String>, new: impl Into<String>) -> Self {
        Self {
            old: old.into(),
            new: new.into(),
            note: None,
        }
    }

    /// What the old name maps to, when not exactly the new one.
    pub fn note(mut self, note: impl Into<String>) -> Self {
        self.note = Some(note.into());
        self
    }

    /// The former name.
    pub fn old(&self) -> &str {
        &self.old
    }

    /// The name to use.
    pub fn new_name(&self) -> &str {
        &self.new
    }

    /// The deprecation warning: the old name, the release that removes it,
    /// the new name and the note.
    pub fn warning(&self) -> String {
        let mut text = format!(
            "`{}` is deprecated and will be removed in {ALIASES_REMOVED_IN}: use `{}`",
            self.old, self.new
        );
        if let Some(note) = &self.note {
            text.push_str(&format!(" ({note})"));
        }
        text
    }
}

impl fmt::Display for Renamed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.warning())
    }
}

/// The known name closest to `name`: at most two edits apart (one for short
/// names), or made of the same words in another order.
fn closest<'a>(name: &str, known: &[&'a str]) -> Option<&'a str> {
    let words = |s: &str| {
        let mut w: Vec<String> = s.split('_').map(str::to_owned).collect();
        w.sort();
        w
    };
    let tail = &name[PREFIX.len()..];
    let limit = if tail.len() <= 6 { 1 } else { 2 };
    known
        .iter()
        .filter(|k| k.starts_with(PREFIX))
        .filter_map(|k| {
            let distance = edits(tail, &k[PREFIX.len()..]);
            let reordered = words(name) == words(k);
            let score = if reordered { 0 } else { distance };
            (distance <= limit || reordered).then_some((score, *k))
        })
        .min()
        .map(|(_, k)| k)
}

/// Edits between `a` and `b`: insertions, deletions, substitutions and
/// swaps of two neighbours (the optimal string alignment distance), so a
/// typing slip such as `LAESE` is one edit from `LEASE`.
fn edits(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut d = vec![vec![0; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1).min(d[i][j - 1] + 1).min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

#[cfg(feature = "clap")]
#[cfg_attr(docsrs, doc(cfg(feature = "clap")))]
mod args;
#[cfg(feature = "clap")]
pub use args::{Mode, PurgeArgs, WorkerArgs, env_from_flags};

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn durations_in_every_unit_and_refusals() {
        use super::parse_duration;
        assert_eq!(parse_duration(" 5m "), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
        for bad in [
            "",
            "s",
            "-1s",
            "+1s",
            "1.5s",
            "1 s",
            "30d",
            "soon",
            "18446744073709551615h",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} was accepted");
        }
    }

    use super::*;

    const KNOWN: [&str; 4] = [
        "TASKFENCE_CONCURRENCY",
        "TASKFENCE_SIM_MIN_LATENCY",
        "TASKFENCE_LEASE",
        "DATABASE_URL",
    ];

    #[test]
    fn only_unknown_prefixed_names_are_reported() {
        assert_eq!(
            unknown_env_among(["PATH", "TASKFENCE_LEASE", "DATABASE_URL"], &KNOWN),
            None
        );
        let unknown = unknown_env_among(["TASKFENCE_NOPE", "TASKFENCE_NOPE", "taskfence_lease"], &KNOWN)
            .expect("one unknown");
        assert_eq!(
            unknown.vars().len(),
            1,
            "reported once, lower case is not the prefix"
        );
        assert_eq!(
            unknown.to_string(),
            "unknown environment variable, ignored: TASKFENCE_NOPE"
        );
    }

    #[test]
    fn close_names_get_a_suggestion_and_far_ones_none() {
        let suggest = |name: &str| {
            unknown_env_among([name], &KNOWN).expect("unknown").vars()[0]
                .suggestion()
                .map(str::to_owned)
        };
        assert_eq!(
            suggest("TASKFENCE_CONCURENCY").as_deref(),
            Some("TASKFENCE_CONCURRENCY")
        );
        assert_eq!(suggest("TASKFENCE_LAESE").as_deref(), Some("TASKFENCE_LEASE"));
        assert_eq!(
            suggest("TASKFENCE_SIM_LATENCY_MIN").as_deref(),
            Some("TASKFENCE_SIM_MIN_LATENCY")
        );
        assert_eq!(suggest("TASKFENCE_PER_PARTITION"), None);
        assert_eq!(suggest("TASKFENCE_LEAS").as_deref(), Some("TASKFENCE_LEASE"));
        assert_eq!(suggest("TASKFENCE_LE"), None, "short names: one edit at most");
    }

    #[test]
    fn edit_distance() {
        assert_eq!(edits("", ""), 0);
        assert_eq!(edits("LEASE", "LEASE"), 0);
        assert_eq!(edits("LEASE", "LAESE"), 1, "a swap is one edit");
        assert_eq!(edits("LEASE", "ELASE"), 1);
        assert_eq!(edits("LEASE", "LEASES"), 1);
        assert_eq!(edits("abc", ""), 3);
    }
}
