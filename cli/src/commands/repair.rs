//! `reopen` and `cancel`: one task, one fenced change. A refusal (the task
//! is not in a state that allows it) is exit 4 and changes nothing.

use taskfence::store::ReopenRequest;
use taskfence::{Fenced, Rejection, TaskId};

use crate::backend::Store;
use crate::cli::{CancelArgs, ReopenArgs};
use crate::error::CliError;
use crate::output::Report;

/// Reopens a failed or cancelled task with a fresh budget.
///
/// `--max-attempts` / `--deadline` change the task's stored policy for the
/// new budget (the rest of it — backoff, jitter — stays); without them the
/// stored policy is reused as is.
pub(super) async fn reopen(store: &Store, args: ReopenArgs) -> Result<Report, CliError> {
    let by = args.by.unwrap_or_else(operator);
    let mut request = ReopenRequest::new(by, args.reason);
    request
        .validate()
        .map_err(|e| CliError::Usage(format!("invalid reopening: {e}")))?;
    if args.max_attempts.is_some() || args.deadline.is_some() {
        let task = store
            .inspect
            .get(args.id)
            .await?
            .ok_or_else(|| CliError::NotFound(format!("task {} not found", args.id)))?;
        let mut policy = task.policy;
        if let Some(n) = args.max_attempts {
            policy = policy.max_attempts(n);
        }
        if let Some(d) = args.deadline {
            policy = policy.deadline(d);
        }
        request = request.policy(policy);
    }
    match store.inspect.reopen(args.id, request).await? {
        Fenced::Accepted(task) => Ok(Report::Reopened(Box::new(task))),
        Fenced::Rejected(r) => Err(refused("reopen", args.id, &r)),
    }
}

/// Cancels a live task; a worker still running it is fenced off.
pub(super) async fn cancel(store: &Store, args: CancelArgs) -> Result<Report, CliError> {
    taskfence::limits::check_reason(&args.reason).map_err(|e| CliError::Usage(format!("--reason: {e}")))?;
    match store.inspect.cancel(args.id, &args.reason).await? {
        Fenced::Accepted(task) => Ok(Report::Cancelled(Box::new(task))),
        Fenced::Rejected(r) => Err(refused("cancel", args.id, &r)),
    }
}

fn refused(what: &str, id: TaskId, rejection: &Rejection) -> CliError {
    CliError::Refused(match rejection {
        Rejection::AlreadyCompleted(_) => {
            format!("cannot {what} task {id}: it is completed (its response is saved)")
        }
        Rejection::NotTerminal(status) => {
            format!(
                "cannot {what} task {id}: it is {status}; only a failed or cancelled task can be reopened"
            )
        }
        Rejection::NotRunning(status) => format!("cannot {what} task {id}: it is {status}"),
        other => format!("cannot {what} task {id}: {other}"),
    })
}

/// Who is asking, for the reopening's record: `$USER@hostname`.
fn operator() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("USERNAME"))
        .unwrap_or_else(|_| whoami::username());
    match whoami::fallible::hostname() {
        Ok(host) => format!("{user}@{host}"),
        Err(_) => user,
    }
}
