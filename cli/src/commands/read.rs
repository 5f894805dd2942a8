//! `stats`, `limits`, `list`, `show`: reading only.

use taskfence::inspect::{Order, TaskQuery};

use crate::backend::Store;
use crate::cli::{LimitsArgs, ListArgs, ShowArgs, StatsArgs};
use crate::error::CliError;
use crate::output::Report;

/// Counts by status, in one scope or all.
pub(super) async fn stats(store: &Store, args: StatsArgs) -> Result<Report, CliError> {
    if let Some(scope) = &args.scope {
        taskfence::limits::check_text("scope", scope, taskfence::limits::MAX_SCOPE_LEN)
            .map_err(|e| CliError::Usage(format!("--scope: {e}")))?;
    }
    let counts = store.inspect.counts(args.scope.as_deref()).await?;
    Ok(Report::Stats {
        scope: args.scope,
        counts,
    })
}

/// The rate buckets and, with `--key`, one concurrency key's slots.
pub(super) async fn limits(store: &Store, args: LimitsArgs) -> Result<Report, CliError> {
    // A key over its length limit is refused by the store: a usage error.
    let slots = match &args.key {
        Some(key) => Some(store.inspect.concurrency(key).await?),
        None => None,
    };
    let buckets = store.inspect.buckets().await?;
    Ok(Report::Limits { buckets, slots })
}

/// One page of tasks; `--older-than` / `--newer-than` count back from the
/// store's clock.
pub(super) async fn list(store: &Store, args: ListArgs) -> Result<Report, CliError> {
    let now = store.now().await?;
    let mut query = TaskQuery::new().limit(usize::try_from(args.limit).unwrap_or(usize::MAX));
    if let Some(status) = args.status {
        query = query.status(status.into());
    }
    if let Some(scope) = args.scope {
        query = query.scope(scope);
    }
    if let Some(operation) = args.operation {
        query = query.operation(operation);
    }
    if let Some(age) = args.older_than {
        query = query.created_before(now - age);
    }
    if let Some(age) = args.newer_than {
        query = query.created_after(now - age);
    }
    if args.oldest_first {
        query = query.order(Order::OldestFirst);
    }
    if let Some(cursor) = args.after {
        query = query.after(cursor);
    }
    query
        .validate()
        .map_err(|e| CliError::Usage(format!("invalid filter: {e}")))?;
    Ok(Report::List(store.inspect.list(&query).await?))
}

/// A task and its story, by id or by request key.
pub(super) async fn show(store: &Store, args: ShowArgs) -> Result<Report, CliError> {
    let id = match (args.id, args.key) {
        (Some(id), _) => id,
        (None, Some(key)) => {
            let text = format!("{}/{}/{}", key.scope, key.operation, key.key);
            store
                .inspect
                .find(&key)
                .await?
                .ok_or_else(|| CliError::NotFound(format!("no task with key {text}")))?
                .id
        }
        (None, None) => unreachable!("clap requires an id or --key"),
    };
    let story = store
        .inspect
        .story(id)
        .await?
        .ok_or_else(|| CliError::NotFound(format!("task {id} not found")))?;
    Ok(Report::Story(Box::new(story)))
}
