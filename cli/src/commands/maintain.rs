//! `migrate`, `purge`, `stranded`, `republish-due`: the store as a whole.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};
use taskfence::TaskId;
use taskfence::limits::MAX_PAGE;

use crate::backend::{Concrete, Store, Target, table_exists};
use crate::cli::{MigrateArgs, PurgeArgs, RepublishDueArgs, StrandedArgs};
use crate::error::{CliError, chain};
use crate::output::{Report, TableStatus};

/// What `migrate` checks before connecting: the PostgreSQL-only flags.
pub(super) fn check_migrate(args: &MigrateArgs, target: &Target) -> Result<(), CliError> {
    if matches!(target, Target::DynamoDb { .. } | Target::Sqlite { .. }) {
        let flag = if args.print_sql {
            "--print-sql"
        } else if args.to.is_some() {
            "--to"
        } else {
            return Ok(());
        };
        let why = match target {
            Target::Sqlite { .. } => "a SQLite file is migrated whole, in one transaction",
            _ => "a DynamoDB table has no migrations (`migrate --status` shows the table and its indexes)",
        };
        return Err(CliError::Usage(format!("{flag} is for PostgreSQL: {why}")));
    }
    Ok(())
}

/// PostgreSQL: applies the embedded migrations (idempotent), all or up to
/// `--to`; with `--status`, `--dry-run` or `--print-sql`, only reads
/// (`PgStore::migration_status`). DynamoDB: creates the table when it is
/// missing and leaves an existing one alone; `--status` and `--dry-run`
/// describe it.
pub(super) async fn migrate(store: &Store, args: MigrateArgs) -> Result<Report, CliError> {
    match &store.concrete {
        Concrete::Postgres(pg) => {
            if args.status {
                return Ok(Report::MigrationStatus(Box::new(pg.migration_status().await?)));
            }
            if args.dry_run || args.print_sql {
                let mut status = pg.migration_status().await?;
                if let Some(to) = args.to {
                    if !status.migrations.iter().any(|m| m.version == to) {
                        let last = status.migrations.last().map_or(0, |m| m.version);
                        return Err(CliError::Usage(format!(
                            "--to {to}: this taskfence has migrations 1 to {last}"
                        )));
                    }
                    status.migrations.retain(|m| m.version <= to);
                }
                if args.print_sql {
                    return Ok(Report::Sql {
                        schema: status.schema.clone(),
                        sql: status.pending_sql(),
                    });
                }
                status.check()?;
                return Ok(Report::WouldMigrate(Box::new(status)));
            }
            match args.to {
                Some(to) => pg.migrate_to(to).await?,
                None => pg.migrate().await?,
            }
            Ok(Report::Migrated {
                backend: "postgres",
                target: pg.schema().to_owned(),
                action: "migrated",
                to: args.to,
            })
        }
        Concrete::Sqlite(sqlite) => {
            if args.status || args.dry_run {
                return Err(CliError::Usage(
                    "--status and --dry-run are for PostgreSQL and DynamoDB: a SQLite file is migrated whole, in one transaction".into(),
                ));
            }
            sqlite.migrate().await?;
            Ok(Report::Migrated {
                backend: "sqlite",
                target: sqlite
                    .pool()
                    .connect_options()
                    .get_filename()
                    .display()
                    .to_string(),
                action: "migrated",
                to: None,
            })
        }
        Concrete::DynamoDb(dynamo) => {
            if args.status || args.dry_run {
                return Ok(Report::Table(table_status(dynamo, args.dry_run).await?));
            }
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
                to: None,
            })
        }
    }
}

/// The table as DynamoDB describes it: there or not, its status, the
/// store's four indexes, TTL on the store's attribute.
async fn table_status(dynamo: &taskfence::DynamoStore, dry_run: bool) -> Result<TableStatus, CliError> {
    use taskfence::dynamodb::{DUE_INDEX, PURGE_INDEX, STATUS_INDEX, TTL, UNCLAIMED_INDEX};
    let (client, table) = (dynamo.client(), dynamo.table());
    let needed = [DUE_INDEX, PURGE_INDEX, STATUS_INDEX, UNCLAIMED_INDEX];
    let described = match client.describe_table().table_name(table).send().await {
        Ok(out) => out.table,
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_resource_not_found_exception()) =>
        {
            None
        }
        Err(e) => {
            return Err(CliError::Operational(format!(
                "DynamoDB table {table}: {}",
                chain(&e)
            )));
        }
    };
    let Some(described) = described else {
        return Ok(TableStatus {
            table: table.to_owned(),
            state: None,
            indexes: needed.iter().map(|n| (*n, false)).collect(),
            ttl: None,
            dry_run,
        });
    };
    let present: Vec<&str> = described
        .global_secondary_indexes()
        .iter()
        .filter_map(|i| i.index_name())
        .collect();
    let ttl = client
        .describe_time_to_live()
        .table_name(table)
        .send()
        .await
        .ok()
        .and_then(|out| out.time_to_live_description)
        .map(|d| {
            use aws_sdk_dynamodb::types::TimeToLiveStatus;
            d.attribute_name() == Some(TTL)
                && matches!(
                    d.time_to_live_status(),
                    Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling)
                )
        });
    Ok(TableStatus {
        table: table.to_owned(),
        state: Some(
            described
                .table_status()
                .map_or("unknown status", |s| s.as_str())
                .to_owned(),
        ),
        indexes: needed.iter().map(|n| (*n, present.contains(n))).collect(),
        ttl,
        dry_run,
    })
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
/// them off again through the store's outbox (a fresh handoff each, which the
/// running dispatcher publishes).
pub(super) async fn stranded(store: &Store, args: StrandedArgs) -> Result<Report, CliError> {
    let limit = usize::try_from(args.limit).unwrap_or(MAX_PAGE);
    let tasks = store.inspect.stranded(args.older_than, limit).await?;
    let ids: Vec<TaskId> = tasks.iter().map(|t| t.id).collect();
    let redispatched = match (&store.concrete, args.redispatch) {
        (_, false) => None,
        (_, true) if tasks.is_empty() => Some(0),
        (Concrete::Postgres(pg), true) => Some(pg.redispatch(&ids).await?),
        (Concrete::Sqlite(sqlite), true) => Some(sqlite.redispatch(&ids).await?),
        (Concrete::DynamoDb(dynamo), true) => Some(dynamo.redispatch(&ids).await?),
    };
    Ok(Report::Stranded { tasks, redispatched })
}

/// The ids to publish again: due tasks (a backoff passed, a lease expired)
/// and, with `--stranded-older-than`, stranded ones (at most 1000), each once.
pub(super) async fn republish_due(store: &Store, args: RepublishDueArgs) -> Result<Report, CliError> {
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
