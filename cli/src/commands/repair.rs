//! `reopen` and `cancel`: one task, one fenced change; or, by filter, each
//! matching task the same way, after a count and a confirmation. A refusal
//! of one task (it is not in a state that allows it) is exit 4 and changes
//! nothing; in bulk, a task that changed since it was counted is skipped and
//! reported.

use std::io::{BufRead, IsTerminal, Write};

use taskfence::inspect::{Order, TaskQuery};
use taskfence::limits::MAX_PAGE;
use taskfence::store::ReopenRequest;
use taskfence::{Error, Fenced, Rejection, RetryPolicy, Status, TaskId};

use crate::backend::Store;
use crate::cli::{BulkArgs, CancelArgs, CancelStatus, ReopenArgs, ReopenStatus};
use crate::error::CliError;
use crate::output::{Bulk, Match, Report};

/// Reopens a failed or cancelled task with a fresh budget; without an id,
/// every task the filter matches.
///
/// `--max-attempts` / `--deadline` change the task's stored policy for the
/// new budget (the rest of it — backoff, jitter — stays); without them the
/// stored policy is reused as is.
pub(super) async fn reopen(store: &Store, args: ReopenArgs) -> Result<Report, CliError> {
    let by = args.by.clone().unwrap_or_else(operator);
    let request = ReopenRequest::new(by, args.reason.clone());
    request
        .validate()
        .map_err(|e| CliError::Usage(format!("invalid reopening: {e}")))?;
    let with_policy = |stored: RetryPolicy| {
        let mut request = request.clone();
        if args.max_attempts.is_some() || args.deadline.is_some() {
            let mut policy = stored;
            if let Some(n) = args.max_attempts {
                policy = policy.max_attempts(n);
            }
            if let Some(d) = args.deadline {
                policy = policy.deadline(d);
            }
            request = request.policy(policy);
        }
        request
    };
    let Some(id) = args.id else {
        let statuses = [match args.status.unwrap_or(ReopenStatus::Failed) {
            ReopenStatus::Failed => Status::Failed,
            ReopenStatus::Cancelled => Status::Cancelled,
        }];
        return bulk(store, "reopen", &statuses, &args.bulk, |m| {
            let request = with_policy(m.policy);
            async move { store.inspect.reopen(m.id, request).await }
        })
        .await;
    };
    let request = if args.max_attempts.is_some() || args.deadline.is_some() {
        let task = store
            .inspect
            .get(id)
            .await?
            .ok_or_else(|| CliError::NotFound(format!("task {id} not found")))?;
        with_policy(task.policy)
    } else {
        request.clone()
    };
    match store.inspect.reopen(id, request).await? {
        Fenced::Accepted(task) => Ok(Report::Reopened(Box::new(task))),
        Fenced::Rejected(r) => Err(CliError::Refused(refusal("reopen", id, &r))),
    }
}

/// Cancels a live task, fencing off a worker still running it; without an
/// id, every task the filter matches.
pub(super) async fn cancel(store: &Store, args: CancelArgs) -> Result<Report, CliError> {
    taskfence::limits::check_reason(&args.reason).map_err(|e| CliError::Usage(format!("--reason: {e}")))?;
    let reason = args.reason.as_str();
    let Some(id) = args.id else {
        let statuses: &[Status] = match args.status {
            None => &[Status::Pending, Status::Running],
            Some(CancelStatus::Pending) => &[Status::Pending],
            Some(CancelStatus::Running) => &[Status::Running],
        };
        return bulk(store, "cancel", statuses, &args.bulk, |m| async move {
            store.inspect.cancel(m.id, reason).await
        })
        .await;
    };
    match store.inspect.cancel(id, reason).await? {
        Fenced::Accepted(task) => Ok(Report::Cancelled(Box::new(task))),
        Fenced::Rejected(r) => Err(CliError::Refused(refusal("cancel", id, &r))),
    }
}

/// What a bulk command checks before connecting: the filter's text, and
/// that it can be confirmed (`--yes`, or a terminal to ask on).
pub(super) fn check_bulk(action: &str, bulk: &BulkArgs) -> Result<(), CliError> {
    let mut query = TaskQuery::new();
    if let Some(scope) = &bulk.scope {
        query = query.scope(scope.clone());
    }
    if let Some(operation) = &bulk.operation {
        query = query.operation(operation.clone());
    }
    query
        .validate()
        .map_err(|e| CliError::Usage(format!("invalid filter: {e}")))?;
    if !bulk.dry_run && !bulk.yes && !std::io::stdin().is_terminal() {
        return Err(CliError::NotConfirmed(format!(
            "a bulk {action} needs confirmation and stdin is not a terminal: pass --yes (count first with --dry-run); nothing was changed"
        )));
    }
    Ok(())
}

/// Counts the tasks in `statuses` that the filter matches (oldest first, at
/// most `--max`), then — unless a dry run, and once confirmed — applies
/// `change` to exactly those, one fenced change each.
async fn bulk<F, Fut>(
    store: &Store,
    action: &'static str,
    statuses: &[Status],
    args: &BulkArgs,
    change: F,
) -> Result<Report, CliError>
where
    F: Fn(Match) -> Fut,
    Fut: std::future::Future<Output = taskfence::Result<Fenced<taskfence::Task>>>,
{
    let matched = matching(store, statuses, args).await?;
    let mut report = Bulk {
        action,
        dry_run: true,
        matched,
        done: Vec::new(),
        skipped: Vec::new(),
    };
    if args.dry_run || report.matched.is_empty() {
        report.dry_run = args.dry_run;
        return Ok(Report::Bulk(report));
    }
    if !args.yes {
        confirm(&report)?;
    }
    report.dry_run = false;
    for m in report.matched.clone() {
        let id = m.id;
        match change(m).await {
            Ok(Fenced::Accepted(_)) => report.done.push(id),
            Ok(Fenced::Rejected(r)) => report.skipped.push((id, refusal(action, id, &r))),
            Err(Error::NotFound(_)) => report.skipped.push((id, format!("task {id} no longer exists"))),
            Err(e) => {
                let verb = if action == "reopen" {
                    "reopening"
                } else {
                    "cancelling"
                };
                return Err(match CliError::from(e) {
                    CliError::Operational(m) => CliError::Operational(format!(
                        "{m} (after {verb} {} of {} task(s))",
                        report.done.len(),
                        report.matched.len()
                    )),
                    other => other,
                });
            }
        }
    }
    Ok(Report::Bulk(report))
}

/// Every task in `statuses` the filter matches, oldest first (task ids are
/// UUID v7: submission order), at most `--max`. Ages count back from the
/// store's clock.
async fn matching(store: &Store, statuses: &[Status], args: &BulkArgs) -> Result<Vec<Match>, CliError> {
    let now = store.now().await?;
    let max = args
        .max
        .map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX));
    let mut found = Vec::new();
    for &status in statuses {
        let mut query = TaskQuery::new()
            .status(status)
            .order(Order::OldestFirst)
            .limit(MAX_PAGE);
        if let Some(scope) = &args.scope {
            query = query.scope(scope.clone());
        }
        if let Some(operation) = &args.operation {
            query = query.operation(operation.clone());
        }
        if let Some(age) = args.older_than {
            query = query.created_before(now - age);
        }
        if let Some(age) = args.newer_than {
            query = query.created_after(now - age);
        }
        query
            .validate()
            .map_err(|e| CliError::Usage(format!("invalid filter: {e}")))?;
        let mut of_status = 0;
        loop {
            let page = store.inspect.list(&query).await?;
            of_status += page.tasks.len();
            found.extend(page.tasks.iter().map(Match::of));
            match page.next {
                Some(cursor) if of_status < max => query = query.after(cursor),
                _ => break,
            }
        }
    }
    found.sort_by_key(|m| m.id);
    found.truncate(max);
    Ok(found)
}

/// Shows what is about to change on stderr and asks on the terminal.
fn confirm(report: &Bulk) -> Result<(), CliError> {
    let declined = || {
        CliError::NotConfirmed(format!(
            "not confirmed: nothing was {}",
            if report.action == "reopen" {
                "reopened"
            } else {
                "cancelled"
            }
        ))
    };
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Err(declined());
    }
    let listing = Report::Bulk(Bulk {
        action: report.action,
        dry_run: true,
        matched: report.matched.clone(),
        done: Vec::new(),
        skipped: Vec::new(),
    })
    .render(false, time::OffsetDateTime::now_utc());
    let mut stderr = std::io::stderr().lock();
    let _ = write!(
        stderr,
        "{}{} these {} task(s)? Type yes to continue: ",
        listing
            .replacen("would ", "about to ", 1)
            .replacen(" (nothing changed)", "", 1),
        report.action,
        report.matched.len()
    );
    let _ = stderr.flush();
    let mut answer = String::new();
    stdin
        .lock()
        .read_line(&mut answer)
        .map_err(|e| CliError::Operational(format!("cannot read the answer: {e}")))?;
    match answer.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" => Ok(()),
        _ => Err(declined()),
    }
}

/// Why the store refused to change one task, in the operator's words.
fn refusal(what: &str, id: TaskId, rejection: &Rejection) -> String {
    match rejection {
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
    }
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
