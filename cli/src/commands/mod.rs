//! The commands: each takes its arguments and a connected [`Store`] and
//! returns a [`Report`] (what it found or did); printing is `output`'s job.
//!
//! | module | commands |
//! | --- | --- |
//! | `read` | `stats`, `list`, `show`: reading only |
//! | `repair` | `reopen`, `cancel`: one task, one fenced change |
//! | `maintain` | `migrate`, `purge`, `stranded`, `dispatch-due`: the store as a whole |

use time::OffsetDateTime;

use crate::backend::{Store, Target};
use crate::cli::Command;
use crate::error::CliError;
use crate::output::Report;

mod maintain;
mod read;
mod repair;

/// Connects to `target` and runs `command` on it: its report, and the
/// store's clock when it ran (what ages are measured against).
pub(crate) async fn run(command: Command, target: &Target) -> Result<(Report, OffsetDateTime), CliError> {
    let migrating = matches!(command, Command::Migrate);
    let store = Store::connect(target, migrating).await?;
    let report = match command {
        Command::Migrate => maintain::migrate(&store).await,
        Command::Stats(args) => read::stats(&store, args).await,
        Command::List(args) => read::list(&store, args).await,
        Command::Show(args) => read::show(&store, args).await,
        Command::Reopen(args) => repair::reopen(&store, args).await,
        Command::Cancel(args) => repair::cancel(&store, args).await,
        Command::Purge(args) => maintain::purge(&store, args).await,
        Command::Stranded(args) => maintain::stranded(&store, args).await,
        Command::DispatchDue(args) => maintain::dispatch_due(&store, args).await,
    }?;
    // After `migrate`: before it, the schema may have no clock to read.
    let now = store.now().await?;
    Ok((report, now))
}
