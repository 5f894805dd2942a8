//! The commands: each takes its arguments and a connected [`Store`] and
//! returns a [`Report`] (what it found or did); printing is `output`'s job.
//!
//! | module | commands |
//! | --- | --- |
//! | `read` | `stats`, `depth`, `limits`, `list`, `show`: reading only |
//! | `repair` | `reopen`, `cancel`: one task, one fenced change; or by filter, counted and confirmed |
//! | `maintain` | `migrate`, `purge`, `stranded`, `republish-due`: the store as a whole |

use time::OffsetDateTime;

use crate::backend::{Store, Target};
use crate::cli::Command;
use crate::error::CliError;
use crate::output::Report;

mod maintain;
mod read;
mod repair;
pub(crate) mod web;

/// Connects to `target` and runs `command` on it: its report, and the
/// store's clock when it ran (what ages are measured against).
pub(crate) async fn run(command: Command, target: &Target) -> Result<(Report, OffsetDateTime), CliError> {
    // What can be checked without the store is, before connecting.
    match &command {
        Command::Migrate(args) => maintain::check_migrate(args, target)?,
        Command::Reopen(args) | Command::Retry(args) if args.id.is_none() => {
            repair::check_bulk("reopen", &args.bulk)?;
        }
        Command::Cancel(args) if args.id.is_none() => repair::check_bulk("cancel", &args.bulk)?,
        _ => {}
    }
    let migrating = matches!(command, Command::Migrate(_));
    let store = Store::connect(target, migrating).await?;
    let report = match command {
        Command::Migrate(args) => maintain::migrate(&store, args).await,
        Command::Stats(args) => read::stats(&store, args).await,
        Command::Depth => Ok(Report::Depth(store.inspect.depth().await?)),
        Command::Limits(args) => read::limits(&store, args).await,
        Command::List(args) => read::list(&store, args).await,
        Command::Show(args) => read::show(&store, args).await,
        // `retry` and `dispatch-due`: former names, with a warning from `main`.
        Command::Reopen(args) | Command::Retry(args) => repair::reopen(&store, args).await,
        Command::Cancel(args) => repair::cancel(&store, args).await,
        Command::Purge(args) => maintain::purge(&store, args).await,
        Command::Stranded(args) => maintain::stranded(&store, args).await,
        Command::RepublishDue(args) | Command::DispatchDue(args) => {
            maintain::republish_due(&store, args).await
        }
        // `main` runs it (it serves, with no report): never here.
        Command::Web(_) => Err(CliError::Usage("`web` is run by itself".into())),
    }?;
    // `migrate` reports no ages, and its schema may have no clock to read
    // (`--status` before the first migration).
    let now = if migrating {
        OffsetDateTime::now_utc()
    } else {
        store.now().await?
    };
    Ok((report, now))
}
