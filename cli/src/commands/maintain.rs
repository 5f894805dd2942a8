//! `migrate`, `purge`, `stranded`, `dispatch-due`: the store as a whole.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};
use taskfence::TaskId;
use taskfence::limits::MAX_PAGE;

use crate::backend::{Backend, Store, table_exists};
use crate::cli::{DispatchDueArgs, PurgeArgs, StrandedArgs};
use crate::error::CliError;
use crate::output::Report;

/// PostgreSQL: applies the embedded migrations (idempotent). DynamoDB:
/// creates the table when it is missing and leaves an existing one alone.
pub(super) async fn migrate(store: &Store) -> Result<Report, CliError> {
    match &store.backend {
        Backend::Postgres(pg) => {
            pg.migrate().await?;
            Ok(Report::Migrated {
                backend: "postgres",
                target: pg.schema().to_owned(),
                action: "migrated",
            })
        }
        Backend::DynamoDb(dynamo) => {
            let table = dynamo.table().to_owned();
            let action = if table_exists(dynamo.client(), &table).await? {
                "exists"
            } else {
                taskfence::dynamodb::create_table(dynamo.client(), &table).await?;
                "created"
            };
            Ok(Report::Migrated {
                backend: "dynamodb",
                target: table,
                action,
            })
        }
    }
}

/// Calls `purge_expired` batch after batch until a batch comes back short
/// (nothing left) or `--max` is reached, with a progress line on stderr when
/// it is a terminal.
pub(super) async fn purge(store: &Store, args: PurgeArgs) -> Result<Report, CliError> {
    let progress = std::io::stderr().is_terminal().then(|| {
        let bar = ProgressBar::new_spinner();
        bar.set_style(
            ProgressStyle::with_template("{spinner} purged {pos} task(s) in {elapsed} ({per_sec})")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        bar.enable_steady_tick(std::time::Duration::from_millis(120));
        bar
    });
    let mut purged = 0u64;
    let outcome = loop {
        let want = args.max.map_or(args.batch, |max| args.batch.min(max - purged));
        if want == 0 {
            break Ok(());
        }
        match store
            .inspect
            .purge_expired(usize::try_from(want).unwrap_or(usize::MAX))
            .await
        {
            Ok(n) => {
                purged += n;
                if let Some(bar) = &progress {
                    bar.inc(n);
                }
                if n < want {
                    break Ok(());
                }
            }
            Err(e) => break Err(e),
        }
    };
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    match outcome {
        Ok(()) => Ok(Report::Purged(purged)),
        Err(e) => Err(match CliError::from(e) {
            CliError::Operational(m) => {
                CliError::Operational(format!("{m} (after purging {purged} task(s))"))
            }
            other => other,
        }),
    }
}

/// Pending tasks nobody claimed, oldest first; with `--redispatch`, hands
/// them off again (PostgreSQL) or says how to (DynamoDB).
pub(super) async fn stranded(store: &Store, args: StrandedArgs) -> Result<Report, CliError> {
    let limit = usize::try_from(args.limit).unwrap_or(MAX_PAGE);
    let tasks = store.inspect.stranded(args.older_than, limit).await?;
    let ids_only = args.redispatch && matches!(store.backend, Backend::DynamoDb(_));
    let redispatched = match (&store.backend, args.redispatch) {
        (_, false) => None,
        (_, true) if tasks.is_empty() => Some(0),
        (Backend::Postgres(pg), true) => {
            let ids: Vec<TaskId> = tasks.iter().map(|t| t.id).collect();
            Some(pg.redispatch(&ids).await?)
        }
        (Backend::DynamoDb(_), true) => {
            eprintln!(
                "taskfence: note: DynamoDB has no outbox in the store: re-dispatch is the application's \
                 (its outbox or publisher): publish these ids again"
            );
            None
        }
    };
    Ok(Report::Stranded {
        tasks,
        redispatched,
        ids_only,
    })
}

/// The ids to publish again: due tasks (a backoff passed, a lease expired)
/// and, with `--stranded-older-than`, stranded ones (at most 1000), each once.
pub(super) async fn dispatch_due(store: &Store, args: DispatchDueArgs) -> Result<Report, CliError> {
    let due = store
        .inspect
        .due(usize::try_from(args.limit).unwrap_or(usize::MAX))
        .await?;
    let stranded = match args.stranded_older_than {
        None => Vec::new(),
        Some(age) => {
            let limit = usize::try_from(args.limit).unwrap_or(MAX_PAGE).min(MAX_PAGE);
            store
                .inspect
                .stranded(age, limit)
                .await?
                .into_iter()
                .map(|t| t.id)
                .filter(|id| !due.contains(id))
                .collect()
        }
    };
    Ok(Report::Due { due, stranded })
}
