//! What can go wrong, as the exit code a script sees and the one line an
//! operator reads (`taskfence: error: …`).
//!
//! Every failure becomes a [`CliError`] before it leaves a command; `main`
//! prints it and exits with its [`code`](CliError::code). No backtraces, no
//! `Debug` output: the message is the whole report.

use std::error::Error as StdError;
use std::fmt::Write as _;
use std::process::ExitCode;

use taskfence::Error;

/// A failure, by what a caller can do about it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CliError {
    /// The store could not be reached or failed (exit 1): try again, check the store.
    #[error("{0}")]
    Operational(String),
    /// The command line is wrong (exit 2): fix it; nothing was done.
    #[error("{0}")]
    Usage(String),
    /// No such task (exit 3).
    #[error("{0}")]
    NotFound(String),
    /// The store refused the change (exit 4): the task is not in a state that allows it.
    #[error("{0}")]
    Refused(String),
    /// A bulk change was not confirmed (exit 5): declined at the prompt, or
    /// no `--yes` while stdin is not a terminal. Nothing was changed.
    #[error("{0}")]
    NotConfirmed(String),
}

impl CliError {
    /// The process exit code: 1 operational, 2 usage, 3 not found, 4 refused,
    /// 5 not confirmed.
    pub(crate) fn code(&self) -> ExitCode {
        ExitCode::from(match self {
            CliError::Operational(_) => 1,
            CliError::Usage(_) => 2,
            CliError::NotFound(_) => 3,
            CliError::Refused(_) => 4,
            CliError::NotConfirmed(_) => 5,
        })
    }

    /// A clap parse error as one line: clap's own message without its usage
    /// block (`taskfence <cmd> --help` has it).
    pub(crate) fn from_clap(err: &clap::Error) -> Self {
        let rendered = err.render().to_string();
        // The message is everything before the first blank line; clap lists
        // missing arguments on indented lines, which join onto the first.
        let message = rendered
            .split("\n\n")
            .next()
            .unwrap_or_default()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join(" ");
        let message = message.strip_prefix("error: ").unwrap_or(&message);
        CliError::Usage(format!("{message} (see --help)"))
    }
}

impl From<Error> for CliError {
    fn from(err: Error) -> Self {
        match err {
            Error::NotFound(id) => CliError::NotFound(format!("task {id} not found")),
            Error::InvalidInput(e) => CliError::Usage(format!("invalid input: {e}")),
            Error::KeyConflict { .. } | Error::ItemRefused(_) => CliError::Refused(err.to_string()),
            Error::Storage(source) => CliError::Operational(chain(&*source)),
            // `NotMigrated` names its fix (`taskfence migrate`); a migration error says what changed.
            other => CliError::Operational(other.to_string()),
        }
    }
}

/// `err: cause: cause…`, skipping causes whose text the previous one already shows.
pub(crate) fn chain(err: &(dyn StdError + 'static)) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !out.contains(&text) {
            let _ = write!(out, ": {text}");
        }
        source = cause.source();
    }
    out.replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use taskfence::TaskId;

    #[test]
    fn exit_codes() {
        let code = |e: CliError| e.code();
        assert_eq!(code(CliError::Operational("x".into())), ExitCode::from(1));
        assert_eq!(
            code(CliError::from(Error::NotFound(TaskId::new()))),
            ExitCode::from(3)
        );
        assert_eq!(
            code(CliError::from(Error::from(
                taskfence::error::InvalidInput::Blank { field: "by" }
            ))),
            ExitCode::from(2)
        );
    }

    #[test]
    fn causes_join_on_one_line() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer")]
        struct Outer(#[source] std::io::Error);
        let err = Outer(std::io::Error::other("inner\nsecond line"));
        assert_eq!(chain(&err), "outer: inner second line");
    }
}
