//! The command line: every flag, its environment variable and how its value
//! is parsed. Values are checked here, before anything connects, so bad input
//! is a usage error (exit 2) that never reaches a store.

use std::time::Duration;

use clap::{ArgGroup, Args, Parser, Subcommand, ValueEnum};
use taskfence::config::Renamed;
use taskfence::limits::{MAX_ATTEMPTS, MAX_DEADLINE, MAX_PAGE, MAX_SCAN_LIMIT};
use taskfence::postgres::DEFAULT_SCHEMA;
use taskfence::{RequestKey, Status, TaskId};

/// Printed under `taskfence --help`: what scripts may rely on.
const EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  operational error (store unreachable, query failed)
  2  usage or bad input (unknown flag, malformed id, key or duration)
  3  not found (no task with this id or key)
  4  refused (e.g. reopening a completed or live task)
  5  not confirmed (a bulk change declined, or no --yes while stdin is not a terminal)";

/// Inspect and repair taskfence tasks on PostgreSQL or DynamoDB.
#[derive(Debug, Parser)]
#[command(name = "taskfence", version, after_help = EXIT_CODES)]
pub(crate) struct Cli {
    /// Where the tasks are.
    #[command(flatten)]
    pub store: StoreArgs,

    /// Print JSON (the library's types, serde) instead of tables.
    #[arg(long, global = true)]
    pub json: bool,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The store to connect to: PostgreSQL, SQLite or DynamoDB, one of them.
#[derive(Debug, Args)]
pub(crate) struct StoreArgs {
    /// PostgreSQL connection URL (postgres://user:password@host:5432/db).
    /// On the command line it shows in `ps`: prefer `DATABASE_URL` or
    /// `--database-url-file` when it holds a password.
    #[arg(
        long,
        env = "DATABASE_URL",
        global = true,
        hide_env_values = true,
        value_name = "URL"
    )]
    pub database_url: Option<String>,

    /// A file holding the PostgreSQL connection URL (a trailing newline is
    /// ignored): the password stays out of `ps` and the shell's history.
    #[arg(long, env = "DATABASE_URL_FILE", global = true, value_name = "PATH")]
    pub database_url_file: Option<std::path::PathBuf>,

    /// PostgreSQL schema holding taskfence's tables.
    #[arg(long, env = "TASKFENCE_SCHEMA", global = true, default_value = DEFAULT_SCHEMA)]
    pub schema: String,

    /// SQLite database file (created by `taskfence migrate` if missing).
    #[arg(long, env = "TASKFENCE_SQLITE", global = true, value_name = "PATH")]
    pub sqlite: Option<std::path::PathBuf>,

    /// DynamoDB table (AWS configuration from the environment, profile or role).
    #[arg(long, env = "TASKFENCE_DYNAMODB_TABLE", global = true, value_name = "TABLE")]
    pub dynamodb_table: Option<String>,

    /// DynamoDB endpoint, for moto or DynamoDB Local (http://127.0.0.1:8000).
    #[arg(long, env = "AWS_ENDPOINT_URL_DYNAMODB", global = true, value_name = "URL")]
    pub dynamodb_endpoint: Option<String>,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Create or upgrade the store (PostgreSQL: migrations; DynamoDB: create the table if missing).
    Migrate(MigrateArgs),
    /// Count tasks by status.
    Stats(StatsArgs),
    /// Each operation's queue: tasks due for a worker (and how long the oldest has waited),
    /// backing off, running. Reads the backlog only, never the finished tasks kept.
    Depth,
    /// The rate buckets (how full each is) and, with `--key`, who holds a concurrency key's slots.
    Limits(LimitsArgs),
    /// List tasks, newest first, one page at a time (prints the next page's cursor).
    List(ListArgs),
    /// Show one task and everything that happened to it.
    Show(ShowArgs),
    /// Reopen a failed or cancelled task (or every match of a filter) with a fresh retry budget.
    Reopen(ReopenArgs),
    /// Cancel a pending or running task (or every match of a filter).
    Cancel(CancelArgs),
    /// Remove terminal tasks whose retention has passed.
    Purge(PurgeArgs),
    /// List pending tasks that no worker ever claimed: their message was likely lost.
    Stranded(StrandedArgs),
    /// Print the ids of tasks to publish again, one per line (pipe them to a publisher).
    RepublishDue(RepublishDueArgs),
    /// Serve the web dashboard until SIGINT or SIGTERM (read-only unless TASKFENCE_WEB_TOKEN is set).
    Web(crate::commands::web::WebArgs),
    /// The former name of `reopen`, the same arguments: runs it with a
    /// deprecation warning until 0.3.
    #[command(hide = true)]
    Retry(ReopenArgs),
    /// The former name of `republish-due`, the same arguments: runs it with
    /// a deprecation warning until 0.3.
    #[command(hide = true)]
    DispatchDue(RepublishDueArgs),
}

impl Command {
    /// The rename, when the command was given under a former name (its
    /// warning to print); it runs as the current command.
    pub(crate) fn renamed(&self) -> Option<Renamed> {
        let (old, new) = match self {
            Command::Retry(_) => ("taskfence retry", "taskfence reopen"),
            Command::DispatchDue(_) => ("taskfence dispatch-due", "taskfence republish-due"),
            _ => return None,
        };
        Some(Renamed::new(old, new).note("the same arguments"))
    }
}

/// Every environment variable an option of `command` or of its
/// subcommands reads: what [`taskfence::config::unknown_env`] knows.
pub(crate) fn known_env(command: &clap::Command) -> Vec<String> {
    let mut known: Vec<String> = command
        .get_arguments()
        .filter_map(|arg| arg.get_env()?.to_str().map(str::to_owned))
        .collect();
    for sub in command.get_subcommands() {
        known.extend(known_env(sub));
    }
    known.sort();
    known.dedup();
    known
}

/// `taskfence stats`.
#[derive(Debug, Args)]
pub(crate) struct StatsArgs {
    /// Only this scope.
    #[arg(long)]
    pub scope: Option<String>,
}

/// `taskfence limits`.
#[derive(Debug, Args)]
pub(crate) struct LimitsArgs {
    /// Also this concurrency key's slots: the tasks holding them and how many wait.
    #[arg(long)]
    pub key: Option<String>,
}

/// `taskfence list`.
#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    /// Only tasks in this status.
    #[arg(long)]
    pub status: Option<StatusArg>,
    /// Only tasks of this scope.
    #[arg(long)]
    pub scope: Option<String>,
    /// Only tasks of this operation.
    #[arg(long)]
    pub operation: Option<String>,
    /// Only tasks submitted longer ago than this (e.g. 1h, 30m, 2d).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub older_than: Option<Duration>,
    /// Only tasks submitted within this (e.g. 10m).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub newer_than: Option<Duration>,
    /// Oldest first instead of newest first.
    #[arg(long)]
    pub oldest_first: bool,
    /// Tasks per page.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..=MAX_PAGE as u64))]
    pub limit: u64,
    /// Continue after this cursor (printed by the previous page).
    #[arg(long, value_parser = parse_cursor, value_name = "CURSOR")]
    pub after: Option<taskfence::inspect::Cursor>,
}

/// `taskfence show`: by id or by request key, exactly one.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("which").required(true).args(["id", "key"])))]
pub(crate) struct ShowArgs {
    /// The task's id.
    #[arg(value_parser = parse_task_id, value_name = "TASK_ID")]
    pub id: Option<TaskId>,
    /// The task's request key instead: scope/operation/key (the key may contain '/').
    #[arg(long, value_parser = parse_key, value_name = "SCOPE/OPERATION/KEY")]
    pub key: Option<RequestKey>,
}

/// `taskfence migrate`: apply, or with one of the flags only look.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("look").args(["status", "dry_run", "print_sql"])))]
pub(crate) struct MigrateArgs {
    /// List every migration, applied or pending, with what each asks of you; change nothing.
    #[arg(long, conflicts_with = "to")]
    pub status: bool,
    /// Say what would be applied, or why it would be refused; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the SQL of the pending migrations for review; change nothing (PostgreSQL).
    #[arg(long)]
    pub print_sql: bool,
    /// Apply only up to this migration, e.g. 4 (PostgreSQL): a staged upgrade.
    #[arg(long, value_name = "VERSION", value_parser = clap::value_parser!(i64).range(1..))]
    pub to: Option<i64>,
}

/// Which tasks a bulk `reopen` or `cancel` changes, and how it asks first.
#[derive(Debug, Args)]
pub(crate) struct BulkArgs {
    /// Bulk: only tasks of this scope.
    #[arg(long)]
    pub scope: Option<String>,
    /// Bulk: only tasks of this operation.
    #[arg(long)]
    pub operation: Option<String>,
    /// Bulk: only tasks submitted longer ago than this (e.g. 1h).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub older_than: Option<Duration>,
    /// Bulk: only tasks submitted within this (e.g. 10m).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub newer_than: Option<Duration>,
    /// Bulk: at most this many, oldest first (default: every match).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max: Option<u64>,
    /// Bulk: count and list the matching tasks; change nothing.
    #[arg(long, conflicts_with = "id")]
    pub dry_run: bool,
    /// Bulk: change them without asking (required when stdin is not a terminal).
    #[arg(long, short = 'y')]
    pub yes: bool,
}

/// The statuses a bulk `reopen` selects (default: failed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ReopenStatus {
    /// Failed terminally.
    Failed,
    /// Cancelled.
    Cancelled,
}

/// The statuses a bulk `cancel` selects (default: both).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum CancelStatus {
    /// Waiting for a claim.
    Pending,
    /// Held by a worker.
    Running,
}

/// `taskfence reopen`: one task by id, or every match of a filter.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("which").required(true).multiple(true)
    .args(["id", "status", "scope", "operation", "older_than", "newer_than", "max"])))]
pub(crate) struct ReopenArgs {
    /// The task's id (or select tasks with --status and the other filters).
    #[arg(value_parser = parse_task_id, value_name = "TASK_ID",
          conflicts_with_all = ["status", "scope", "operation", "older_than", "newer_than", "max"])]
    pub id: Option<TaskId>,
    /// Bulk: tasks in this status (default failed).
    #[arg(long)]
    pub status: Option<ReopenStatus>,
    /// The filter and confirmation of a bulk reopen.
    #[command(flatten)]
    pub bulk: BulkArgs,
    /// Why (recorded with the reopening).
    #[arg(long, value_parser = parse_reason)]
    pub reason: String,
    /// Who (recorded with the reopening); default: $USER@hostname.
    #[arg(long, value_name = "NAME")]
    pub by: Option<String>,
    /// Attempts of the fresh budget (default: the task's policy).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_ATTEMPTS)))]
    pub max_attempts: Option<u32>,
    /// Deadline of the fresh budget, counted from now (default: the task's policy).
    #[arg(long, value_parser = parse_deadline, value_name = "DURATION")]
    pub deadline: Option<Duration>,
}

/// `taskfence cancel`: one task by id, or every match of a filter.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("which").required(true).multiple(true)
    .args(["id", "status", "scope", "operation", "older_than", "newer_than", "max"])))]
pub(crate) struct CancelArgs {
    /// The task's id (or select tasks with --status and the other filters).
    #[arg(value_parser = parse_task_id, value_name = "TASK_ID",
          conflicts_with_all = ["status", "scope", "operation", "older_than", "newer_than", "max"])]
    pub id: Option<TaskId>,
    /// Bulk: tasks in this status (default both pending and running).
    #[arg(long)]
    pub status: Option<CancelStatus>,
    /// The filter and confirmation of a bulk cancel.
    #[command(flatten)]
    pub bulk: BulkArgs,
    /// Why (saved as the task's last error).
    #[arg(long, value_parser = parse_reason)]
    pub reason: String,
}

/// `taskfence purge`.
#[derive(Debug, Args)]
pub(crate) struct PurgeArgs {
    /// Tasks removed per call to the store.
    #[arg(long, default_value_t = 1000, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=MAX_SCAN_LIMIT as u64))]
    pub batch: u64,
    /// Stop after removing this many (default: until none is left).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max: Option<u64>,
}

/// `taskfence stranded`.
#[derive(Debug, Args)]
pub(crate) struct StrandedArgs {
    /// Handed off longer ago than this (e.g. 15m).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub older_than: Duration,
    /// At most this many, oldest first.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=MAX_PAGE as u64))]
    pub limit: u64,
    /// Hand them off again (PostgreSQL: new outbox rows for the dispatcher).
    #[arg(long)]
    pub redispatch: bool,
}

/// `taskfence republish-due` (formerly `dispatch-due`).
#[derive(Debug, Args)]
pub(crate) struct RepublishDueArgs {
    /// Print the ids (the only mode: publishing is the pipe's job).
    #[arg(long, required = true)]
    pub print: bool,
    /// At most this many due tasks.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=MAX_SCAN_LIMIT as u64))]
    pub limit: u64,
    /// Also the stranded tasks handed off longer ago than this (at most 1000).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub stranded_older_than: Option<Duration>,
}

/// A status on the command line (clap lists the choices in `--help`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StatusArg {
    /// Waiting for a claim.
    Pending,
    /// Held by a worker.
    Running,
    /// Saved a response.
    Completed,
    /// Failed terminally.
    Failed,
    /// Cancelled.
    Cancelled,
}

impl From<StatusArg> for Status {
    fn from(s: StatusArg) -> Self {
        match s {
            StatusArg::Pending => Status::Pending,
            StatusArg::Running => Status::Running,
            StatusArg::Completed => Status::Completed,
            StatusArg::Failed => Status::Failed,
            StatusArg::Cancelled => Status::Cancelled,
        }
    }
}

/// A positive duration: `90s`, `15m`, `1h30m`, `2d`, `1h 5m`; at most 100
/// years, so that "now minus it" is always a date. The dashboard reads its
/// `older_than` and `newer_than` with the same function.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    taskfence_web::age::parse_age(s).map_err(|e| e.to_string())
}

/// [`parse_duration`] within the policy's deadline limit.
fn parse_deadline(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d > MAX_DEADLINE {
        return Err(format!(
            "more than the limit of {}",
            humantime::format_duration(MAX_DEADLINE)
        ));
    }
    Ok(d)
}

/// A reason an operator gives: not blank (it is the audit trail), within
/// the library's limits.
fn parse_reason(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        return Err("must not be blank: say why".into());
    }
    taskfence::limits::check_reason(s).map_err(|e| e.to_string())?;
    Ok(s.to_owned())
}

/// A task id (a UUID).
pub(crate) fn parse_task_id(s: &str) -> Result<TaskId, String> {
    s.trim()
        .parse()
        .map_err(|_| "not a task id: expected a UUID such as 0190b6a2-5c1e-7d3f-9a4b-1c2d3e4f5a6b".into())
}

fn parse_cursor(s: &str) -> Result<taskfence::inspect::Cursor, String> {
    s.trim()
        .parse()
        .map_err(|_| "not a cursor: pass the value a previous page printed".into())
}

/// `scope/operation/key`: the first two `/` separate the parts, so the key
/// (the client's idempotency key, often a path or URL) may contain `/`.
pub(crate) fn parse_key(s: &str) -> Result<RequestKey, String> {
    let mut parts = s.splitn(3, '/');
    let (Some(scope), Some(operation), Some(key)) = (parts.next(), parts.next(), parts.next()) else {
        return Err("expected scope/operation/key".into());
    };
    let key = RequestKey::new(scope, operation, key);
    key.validate()
        .map_err(|e| format!("{e} (expected scope/operation/key)"))?;
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("15m"), Ok(Duration::from_secs(900)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("100000000y").unwrap_err().contains("out of range"));
    }

    #[test]
    fn keys() {
        let key = parse_key("tenant-7/chat.reply/https://x/y").unwrap();
        assert_eq!(
            (key.scope.as_str(), key.operation.as_str(), key.key.as_str()),
            ("tenant-7", "chat.reply", "https://x/y")
        );
        assert!(parse_key("tenant-7/chat.reply").is_err());
        assert!(parse_key("tenant-7//k").is_err());
        assert!(parse_key("/op/k").is_err());
    }

    #[test]
    fn former_command_names_run_the_current_commands() {
        use clap::Parser;
        let id = "0190b6a2-5c1e-7d3f-9a4b-1c2d3e4f5a6b";
        let cli = Cli::try_parse_from(["taskfence", "retry", id, "--reason", "fixed"]).unwrap();
        let warning = cli.command.renamed().expect("a rename").warning();
        assert!(matches!(
            cli.command,
            Command::Retry(ReopenArgs { id: Some(_), .. })
        ));
        assert!(
            warning.contains("`taskfence reopen`") && warning.contains("0.3"),
            "{warning}"
        );
        let cli = Cli::try_parse_from(["taskfence", "dispatch-due", "--print"]).unwrap();
        let warning = cli.command.renamed().expect("a rename").warning();
        assert!(warning.contains("`taskfence republish-due`"), "{warning}");
        let cli = Cli::try_parse_from(["taskfence", "reopen", id, "--reason", "fixed"]).unwrap();
        assert!(cli.command.renamed().is_none(), "the current name: no warning");
    }

    #[test]
    fn every_variable_of_every_command_is_known() {
        use clap::CommandFactory;
        let known = known_env(&Cli::command());
        for name in [
            "DATABASE_URL",
            "TASKFENCE_SCHEMA",
            "TASKFENCE_DYNAMODB_TABLE",
            "TASKFENCE_WEB_TOKEN",
        ] {
            assert!(known.iter().any(|k| k == name), "{name} in {known:?}");
        }
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
