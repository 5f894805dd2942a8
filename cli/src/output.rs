//! How results look: a [`Report`] is what a command found or did; it prints
//! as tables for people or as JSON for scripts (`--json`).
//!
//! Choices: times in RFC 3339 UTC to the second (JSON keeps the store's full
//! precision), durations humanised to their two largest units (`4m 12s`),
//! borderless tables so `awk '{print $1}'` picks the ids, long error texts
//! cut in listings (`show` prints them whole), payloads and responses as text
//! when they are UTF-8 and hex otherwise. JSON is the library's own serde
//! form of `Task`, `Story` and `Counts`, wrapped in an object where a command
//! has more to say (a cursor, a count), with three changes to a task so a
//! script needs no Rust conventions: payload and response as
//! `{"encoding": "utf-8" | "base64", "data": …}`, the policy's durations as
//! strings the flags accept (`1s`, `5m`, `1h 30m`), and its `budget` left.

use std::time::Duration;

use comfy_table::{Table, presets};
use serde::Serialize;
use serde_json::json;
use taskfence::effect::EffectState;
use taskfence::inspect::{Counts, Page, QueueDepth, Story, TaskSummary};
use taskfence::postgres::{Migration, MigrationState, MigrationStatus};
use taskfence::store::AttemptOutcome;
use taskfence::throttle::{BucketState, KeySlots};
use taskfence::{RetryPolicy, Status, Task, TaskId};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// What a command has to say.
#[derive(Debug)]
pub(crate) enum Report {
    /// `migrate`: what was done to which schema or table.
    Migrated {
        /// `postgres`, `sqlite` or `dynamodb`.
        backend: &'static str,
        /// The schema, file or table.
        target: String,
        /// `migrated`, `created` or `exists`.
        action: &'static str,
        /// `--to`: the last migration applied on request.
        to: Option<i64>,
    },
    /// `migrate --status` on PostgreSQL: every migration and its state.
    MigrationStatus(Box<MigrationStatus>),
    /// `migrate --dry-run` on PostgreSQL: what `migrate` would apply.
    WouldMigrate(Box<MigrationStatus>),
    /// `migrate --print-sql`: the pending migrations' SQL.
    Sql {
        /// The schema.
        schema: String,
        /// The script.
        sql: String,
    },
    /// `migrate --status` / `--dry-run` on DynamoDB: the table as found.
    Table(TableStatus),
    /// A bulk `reopen` or `cancel` (or its dry run).
    Bulk(Bulk),
    /// `stats`.
    Stats {
        /// The scope counted, or all.
        scope: Option<String>,
        /// The counts.
        counts: Counts,
    },
    /// `depth`: each operation's queue.
    Depth(Vec<QueueDepth>),
    /// `limits`.
    Limits {
        /// Every rate bucket, by name.
        buckets: Vec<BucketState>,
        /// With `--key`: its slots.
        slots: Option<KeySlots>,
    },
    /// `list`: one page.
    List(Page),
    /// `show`.
    Story(Box<Story>),
    /// `reopen`: the reopened task.
    Reopened(Box<Task>),
    /// `cancel`: the cancelled task.
    Cancelled(Box<Task>),
    /// `purge`: how many tasks were removed.
    Purged(u64),
    /// `stranded`.
    Stranded {
        /// The stranded tasks, oldest first.
        tasks: Vec<TaskSummary>,
        /// With `--redispatch`: the handoffs written.
        redispatched: Option<u64>,
    },
    /// `republish-due --print`.
    Due {
        /// Due tasks (backoff passed, lease expired).
        due: Vec<TaskId>,
        /// Stranded tasks not already in `due`.
        stranded: Vec<TaskId>,
    },
}

impl Report {
    /// The report as text for stdout, `--json` or tables.
    pub(crate) fn render(&self, json: bool, now: OffsetDateTime) -> String {
        if json {
            let mut out = serde_json::to_string_pretty(&self.json()).unwrap_or_default();
            out.push('\n');
            return out;
        }
        match self {
            Report::Migrated {
                backend,
                target,
                action,
                to,
            } => {
                let what = match *backend {
                    "postgres" => "schema",
                    "sqlite" => "file",
                    _ => "table",
                };
                match (*action, to) {
                    ("exists", _) => format!("{what} {target} already exists: nothing to do\n"),
                    ("created", _) => format!("created {what} {target}\n"),
                    ("would_create", _) => format!("would create {what} {target} (nothing changed)\n"),
                    (_, Some(to)) => format!("{what} {target} is migrated up to {to:04}\n"),
                    _ => format!("{what} {target} is up to date\n"),
                }
            }
            Report::MigrationStatus(status) => migration_status(status),
            Report::WouldMigrate(status) => would_migrate(status),
            Report::Sql { sql, .. } => sql.clone(),
            Report::Table(table) => table.render(),
            Report::Bulk(bulk) => bulk.render(),
            Report::Stats { scope, counts } => stats(scope.as_deref(), counts),
            Report::Depth(queues) => depth(queues, now),
            Report::Limits { buckets, slots } => limits(buckets, slots.as_ref(), now),
            Report::List(page) => {
                let mut out = tasks(&page.tasks, now);
                if let Some(next) = page.next {
                    out.push_str(&format!("next page: --after {next}\n"));
                }
                out
            }
            Report::Story(story) => show(story, now),
            Report::Reopened(task) => format!(
                "reopened task {}: {}, {} attempt(s) in the fresh budget{}\n",
                task.id,
                task.status,
                task.attempts_left(),
                task.deadline_at()
                    .map(|d| format!(", deadline {}", at(d)))
                    .unwrap_or_default()
            ),
            Report::Cancelled(task) => format!("cancelled task {} ({})\n", task.id, task.key_text()),
            Report::Purged(n) => format!("purged {n} task(s) past their retention\n"),
            Report::Stranded {
                tasks: found,
                redispatched,
            } => {
                if found.is_empty() {
                    return "no stranded tasks\n".into();
                }
                let mut out = tasks(found, now);
                if let Some(n) = redispatched {
                    out.push_str(&format!(
                        "re-dispatched {n} task(s): the dispatcher publishes them\n"
                    ));
                }
                out
            }
            Report::Due { due, stranded } => due.iter().chain(stranded).map(|id| format!("{id}\n")).collect(),
        }
    }

    fn json(&self) -> serde_json::Value {
        match self {
            Report::Migrated {
                backend,
                target,
                action,
                to,
            } => {
                json!({ "backend": backend, "target": target, "action": action, "to": to })
            }
            Report::MigrationStatus(status) => json!({
                "backend": "postgres",
                "target": status.schema,
                "up_to_date": status.is_up_to_date(),
                "old_history": status.old_history,
                "unknown": status.unknown,
                "migrations": status.migrations.iter().map(migration_json).collect::<Vec<_>>(),
            }),
            Report::WouldMigrate(status) => json!({
                "backend": "postgres",
                "target": status.schema,
                "dry_run": true,
                "old_history": status.old_history,
                "would_apply": status.pending().map(migration_json).collect::<Vec<_>>(),
            }),
            Report::Sql { schema, sql } => json!({ "backend": "postgres", "target": schema, "sql": sql }),
            Report::Table(table) => table.json(),
            Report::Bulk(bulk) => bulk.json(),
            Report::Stats { scope, counts } => {
                let mut v = value(counts);
                v["total"] = json!(counts.total());
                v["scope"] = json!(scope);
                v
            }
            Report::Depth(queues) => json!({
                "queues": queues.iter().map(|q| json!({
                    "operation": q.operation,
                    "due": q.due,
                    "scheduled": q.scheduled,
                    "running": q.running,
                    "oldest_due_at": q.oldest_due_at.map(at),
                })).collect::<Vec<_>>(),
            }),
            Report::Limits { buckets, slots } => json!({
                "buckets": buckets.iter().map(|b| json!({
                    "name": b.bucket.name(),
                    "rate": b.bucket.rate(),
                    "period": human(b.bucket.period()),
                    "burst": b.bucket.burst_size(),
                    "available": b.available(OffsetDateTime::now_utc()),
                    "schedule": b.schedule.map(at),
                })).collect::<Vec<_>>(),
                "key": slots.as_ref().map(|k| json!({
                    "key": k.key,
                    "running": k.running.iter().map(ToString::to_string).collect::<Vec<_>>(),
                    "waiting": k.waiting,
                })),
            }),
            Report::List(page) => json!({
                "tasks": summaries_json(&page.tasks),
                "next": page.next.map(|c| c.to_string()),
            }),
            Report::Story(story) => {
                let mut v = value(story.as_ref());
                v["task"] = task_json(&story.task);
                v
            }
            Report::Reopened(task) | Report::Cancelled(task) => task_json(task),
            Report::Purged(n) => json!({ "purged": n }),
            Report::Stranded {
                tasks, redispatched, ..
            } => json!({
                "tasks": summaries_json(tasks),
                "redispatched": redispatched,
            }),
            Report::Due { due, stranded } => json!({ "due": due, "stranded": stranded }),
        }
    }
}

/// The serde form of one of the library's values (they all serialize).
fn value<T: Serialize + ?Sized>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or_default()
}

/// A task for scripts: the library's serde form with its bytes named by
/// encoding, the policy's durations as text, and the budget left.
pub(crate) fn task_json(task: &Task) -> serde_json::Value {
    let mut v = value(task);
    v["payload"] = bytes_json(&task.payload);
    v["response"] = task
        .response
        .as_ref()
        .map_or(serde_json::Value::Null, |r| bytes_json(r.as_bytes()));
    v["policy"] = policy_json(&task.policy);
    v["budget"] = json!({
        "attempts_left": task.attempts_left(),
        "deadline_at": task.deadline_at().map(|d| d.format(&Rfc3339).unwrap_or_default()),
    });
    v
}

/// A listing's row for scripts: as [`task_json`], without payload and response
/// (a listing never loads them; `show` does).
fn summary_json(task: &TaskSummary) -> serde_json::Value {
    let mut v = value(task);
    v["policy"] = policy_json(&task.policy);
    v["budget"] = json!({
        "attempts_left": task.attempts_left(),
        "deadline_at": task.deadline_at().map(|d| d.format(&Rfc3339).unwrap_or_default()),
    });
    v
}

fn summaries_json(tasks: &[TaskSummary]) -> serde_json::Value {
    serde_json::Value::Array(tasks.iter().map(summary_json).collect())
}

/// `{"encoding": "utf-8", "data": text}` when the bytes are UTF-8,
/// `{"encoding": "base64", "data": …}` otherwise.
fn bytes_json(bytes: &[u8]) -> serde_json::Value {
    match std::str::from_utf8(bytes) {
        Ok(text) => json!({ "encoding": "utf-8", "data": text }),
        Err(_) => json!({ "encoding": "base64", "data": base64(bytes) }),
    }
}

/// The policy with its durations as the flags take them (`1s`, `5m`).
fn policy_json(policy: &RetryPolicy) -> serde_json::Value {
    let mut v = value(policy);
    let text = |d: Duration| humantime::format_duration(d).to_string();
    v["initial_backoff"] = json!(text(policy.initial_backoff));
    v["max_backoff"] = json!(text(policy.max_backoff));
    v["deadline"] = json!(policy.deadline.map(text));
    v
}

/// Standard base64 with padding (RFC 4648 §4).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Bytes for people: the text when it is UTF-8 without control characters
/// other than newlines and tabs, else hex; cut at `max` characters, saying so.
fn readable(bytes: &[u8], max: usize) -> String {
    if bytes.is_empty() {
        return "empty".into();
    }
    let len = bytes.len();
    let tail = |shown: usize| {
        if shown < len {
            format!("… (first {shown} of {len} bytes; --json has them all)")
        } else {
            String::new()
        }
    };
    match std::str::from_utf8(bytes) {
        Ok(text) if !text.chars().any(|c| c.is_control() && c != '\n' && c != '\t') => {
            let (shown, cut_at) = match text.char_indices().nth(max) {
                Some((i, _)) => (&text[..i], i),
                None => (text, len),
            };
            format!("{len} bytes of text: {shown}{}", tail(cut_at))
        }
        _ => {
            let shown = &bytes[..len.min(max / 2)];
            let hex: String = shown.iter().map(|b| format!("{b:02x}")).collect();
            format!("{len} bytes, hex: {hex}{}", tail(shown.len()))
        }
    }
}

/// What is left of the task's retry budget: attempts, and time until its deadline.
fn budget_left(task: &Task, now: OffsetDateTime) -> String {
    let left = task.attempts_left();
    let attempts = match left {
        0 => "no attempts".to_string(),
        1 => "1 attempt".to_string(),
        n => format!("{n} attempts"),
    };
    match task.deadline_at() {
        None => format!("{attempts}, no deadline"),
        Some(d) if d > now => format!("{attempts}, deadline in {}", human(since(now, d))),
        Some(d) => format!("{attempts}, deadline passed {} ago", human(since(d, now))),
    }
}

/// `migrate --status`: one line per migration, its notes in a column, then
/// the whole advice for each pending migration that has any.
fn migration_status(status: &MigrationStatus) -> String {
    let applied = status.applied().count();
    let pending = status.pending().count();
    let mut out = format!(
        "schema {}: {applied} of {} migrations applied, {pending} pending\n",
        status.schema,
        status.migrations.len()
    );
    let mut t = table(&["VERSION", "STATE", "APPLIED", "DESCRIPTION", "NOTES"]);
    for m in &status.migrations {
        let (state, when) = match m.state {
            MigrationState::Applied { at: when } => ("applied", at(when)),
            MigrationState::Pending => ("pending", "-".into()),
            MigrationState::Changed { at: when } => ("CHANGED", at(when)),
            MigrationState::Failed { at: when } => ("FAILED", at(when)),
            _ => ("unknown", "-".into()),
        };
        t.add_row([
            format!("{:04}", m.version),
            state.to_string(),
            when,
            m.description.to_string(),
            notes_summary(m),
        ]);
    }
    for version in &status.unknown {
        t.add_row([
            format!("{version:04}"),
            "UNKNOWN".into(),
            "-".into(),
            "not in this version of taskfence: a newer one migrated this schema".into(),
            "-".into(),
        ]);
    }
    out.push_str(&finish(t));
    if status.old_history {
        out.push_str(
            "the history is in the format of taskfence before sqlx 0.9: `migrate` converts it first\n",
        );
    }
    out.push_str(&advice(status.pending()));
    if let Err(e) = status.check() {
        out.push_str(&format!("migrate would refuse: {e}\n"));
    } else if pending > 0 {
        out.push_str("apply with `taskfence migrate` (review first: --dry-run, --print-sql)\n");
    }
    out
}

/// `migrate --dry-run`: the pending migrations and their advice.
fn would_migrate(status: &MigrationStatus) -> String {
    let pending: Vec<&Migration> = status.pending().collect();
    if pending.is_empty() {
        return format!("schema {} is up to date: nothing to apply\n", status.schema);
    }
    let mut out = format!(
        "would apply {} migration(s) to schema {} (nothing changed):\n",
        pending.len(),
        status.schema
    );
    let mut t = table(&["VERSION", "DESCRIPTION", "NOTES"]);
    for m in &pending {
        t.add_row([
            format!("{:04}", m.version),
            m.description.to_string(),
            notes_summary(m),
        ]);
    }
    out.push_str(&finish(t));
    out.push_str(&advice(pending.into_iter()));
    out
}

fn notes_summary(m: &Migration) -> String {
    if m.notes.is_empty() {
        return "-".into();
    }
    m.notes.iter().map(|n| n.summary()).collect::<Vec<_>>().join("; ")
}

/// The whole advice of each migration that has notes, with its statements.
fn advice<'a>(migrations: impl Iterator<Item = &'a Migration>) -> String {
    let mut out = String::new();
    for m in migrations {
        for note in m.notes {
            out.push_str(&format!("before {:04}: {note}\n", m.version));
            for statement in note.statements() {
                out.push_str(&format!("    {statement}\n"));
            }
        }
    }
    out
}

fn migration_json(m: &Migration) -> serde_json::Value {
    let (state, when) = match m.state {
        MigrationState::Applied { at } => ("applied", Some(at)),
        MigrationState::Pending => ("pending", None),
        MigrationState::Changed { at } => ("changed", Some(at)),
        MigrationState::Failed { at } => ("failed", Some(at)),
        _ => ("unknown", None),
    };
    json!({
        "version": m.version,
        "description": m.description,
        "state": state,
        "applied_at": when.map(|t| t.format(&Rfc3339).unwrap_or_default()),
        "notes": m.notes.iter().map(|n| json!({
            "kind": n.label(),
            "summary": n.summary(),
            "advice": n.to_string(),
            "statements": n.statements(),
        })).collect::<Vec<_>>(),
    })
}

/// A DynamoDB table as `migrate --status` finds it.
#[derive(Debug)]
pub(crate) struct TableStatus {
    /// The table.
    pub table: String,
    /// `DescribeTable`'s status (`ACTIVE`…), `None` when the table is missing.
    pub state: Option<String>,
    /// Each index the store needs, and whether the table has it.
    pub indexes: Vec<(&'static str, bool)>,
    /// Whether TTL is on for the store's attribute (`None`: unknown).
    pub ttl: Option<bool>,
    /// `--dry-run`: say what `migrate` would do rather than list.
    pub dry_run: bool,
}

impl TableStatus {
    fn render(&self) -> String {
        let Some(state) = &self.state else {
            return if self.dry_run {
                format!("would create table {} (nothing changed)\n", self.table)
            } else {
                format!(
                    "table {} does not exist: `taskfence migrate` creates it\n",
                    self.table
                )
            };
        };
        let missing: Vec<&str> = self
            .indexes
            .iter()
            .filter(|(_, ok)| !ok)
            .map(|(n, _)| *n)
            .collect();
        let mut out = if self.dry_run {
            format!(
                "table {} already exists: migrate would change nothing\n",
                self.table
            )
        } else {
            format!("table {} exists ({state})\n", self.table)
        };
        if !self.dry_run {
            let mut t = table(&["INDEX", "PRESENT"]);
            for (name, ok) in &self.indexes {
                t.add_row([name.to_string(), if *ok { "yes" } else { "MISSING" }.to_string()]);
            }
            out.push_str(&finish(t));
            out.push_str(match self.ttl {
                Some(true) => "ttl: on\n",
                Some(false) => "ttl: OFF (expired tasks are never removed by DynamoDB)\n",
                None => "ttl: unknown\n",
            });
        }
        if !missing.is_empty() {
            out.push_str(&format!(
                "missing index(es) {}: `migrate` leaves an existing table alone; add them with UpdateTable (docs/DYNAMODB.md has the definitions)\n",
                missing.join(", ")
            ));
        }
        out
    }

    fn json(&self) -> serde_json::Value {
        json!({
            "backend": "dynamodb",
            "target": self.table,
            "dry_run": self.dry_run,
            "exists": self.state.is_some(),
            "state": self.state,
            "indexes": self.indexes.iter().map(|(name, present)| json!({ "name": name, "present": present })).collect::<Vec<_>>(),
            "ttl": self.ttl,
        })
    }
}

/// What a bulk `reopen` or `cancel` matched and did.
#[derive(Debug)]
pub(crate) struct Bulk {
    /// `reopen` or `cancel`.
    pub action: &'static str,
    /// `--dry-run`: counted and listed, nothing changed.
    pub dry_run: bool,
    /// The tasks matched (and, unless a dry run, confirmed).
    pub matched: Vec<Match>,
    /// Changed.
    pub done: Vec<TaskId>,
    /// Refused by the store: each changed since it was counted.
    pub skipped: Vec<(TaskId, String)>,
}

/// One task a bulk command matched.
#[derive(Debug, Clone)]
pub(crate) struct Match {
    /// Its id.
    pub id: TaskId,
    /// Its status when counted.
    pub status: Status,
    /// `scope/operation/key`.
    pub key: String,
    /// Its stored policy (a bulk reopen's `--max-attempts` starts from it).
    pub policy: RetryPolicy,
}

impl Match {
    /// The parts of `task` a bulk command needs.
    pub(crate) fn of(task: &TaskSummary) -> Self {
        Self {
            id: task.id,
            status: task.status,
            key: task.key_text(),
            policy: task.policy,
        }
    }
}

/// Rows a dry run lists before "… and N more".
const LISTED: usize = 20;

impl Bulk {
    fn verb(&self) -> &'static str {
        if self.action == "reopen" {
            "reopened"
        } else {
            "cancelled"
        }
    }

    fn render(&self) -> String {
        let n = self.matched.len();
        if n == 0 {
            return format!("no task matches: nothing to {}\n", self.action);
        }
        if self.dry_run {
            let mut out = format!("would {} {n} task(s) (nothing changed):\n", self.action);
            let mut t = table(&["ID", "STATUS", "KEY"]);
            for m in self.matched.iter().take(LISTED) {
                t.add_row([m.id.to_string(), m.status.to_string(), m.key.clone()]);
            }
            out.push_str(&finish(t));
            if n > LISTED {
                out.push_str(&format!("… and {} more (--json lists them all)\n", n - LISTED));
            }
            return out;
        }
        let mut out = format!("{} {} of {n} matching task(s)\n", self.verb(), self.done.len());
        if !self.skipped.is_empty() {
            out.push_str(&format!(
                "skipped {} that changed since they were counted:\n",
                self.skipped.len()
            ));
            for (id, reason) in &self.skipped {
                out.push_str(&format!("{id}  {reason}\n"));
            }
        }
        out
    }

    fn json(&self) -> serde_json::Value {
        json!({
            "action": self.action,
            "dry_run": self.dry_run,
            "matched": self.matched.len(),
            "tasks": self.matched.iter().map(|m| json!({
                "id": m.id, "status": m.status, "key": m.key,
            })).collect::<Vec<_>>(),
            "done": self.done,
            "skipped": self.skipped.iter().map(|(id, reason)| json!({ "id": id, "reason": reason })).collect::<Vec<_>>(),
        })
    }
}

/// `scope/operation/key`, as `show --key` takes it.
trait KeyText {
    fn key_text(&self) -> String;
}

impl KeyText for Task {
    fn key_text(&self) -> String {
        format!("{}/{}/{}", self.key.scope, self.key.operation, self.key.key)
    }
}

impl KeyText for TaskSummary {
    fn key_text(&self) -> String {
        format!("{}/{}/{}", self.key.scope, self.key.operation, self.key.key)
    }
}

fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(presets::NOTHING);
    t.set_header(header.iter().copied());
    t
}

fn finish(t: Table) -> String {
    // Borderless rows still pad with a leading space: trim it so columns
    // start at the left margin.
    let mut out = String::new();
    for line in t.to_string().lines() {
        out.push_str(line.strip_prefix(' ').unwrap_or(line).trim_end());
        out.push('\n');
    }
    out
}

fn stats(scope: Option<&str>, counts: &Counts) -> String {
    let mut t = table(&["STATUS", "TASKS"]);
    for status in [
        Status::Pending,
        Status::Running,
        Status::Completed,
        Status::Failed,
        Status::Cancelled,
    ] {
        t.add_row([status.to_string(), counts.get(status).to_string()]);
    }
    t.add_row(["total".to_string(), counts.total().to_string()]);
    let mut out = String::new();
    if let Some(scope) = scope {
        out.push_str(&format!("scope {scope}\n"));
    }
    out.push_str(&finish(t));
    out
}

fn depth(queues: &[QueueDepth], now: OffsetDateTime) -> String {
    if queues.is_empty() {
        return "no pending or running tasks\n".into();
    }
    let mut t = table(&["OPERATION", "DUE", "SCHEDULED", "RUNNING", "OLDEST DUE"]);
    for q in queues {
        t.add_row([
            q.operation.clone(),
            q.due.to_string(),
            q.scheduled.to_string(),
            q.running.to_string(),
            q.oldest_due_at.map_or_else(|| "-".into(), |due| when(due, now)),
        ]);
    }
    finish(t)
}

fn limits(buckets: &[BucketState], slots: Option<&KeySlots>, now: OffsetDateTime) -> String {
    let mut out = if buckets.is_empty() {
        "no rate buckets\n".to_owned()
    } else {
        let mut t = table(&["BUCKET", "RATE", "BURST", "AVAILABLE"]);
        for b in buckets {
            let bucket = &b.bucket;
            t.add_row([
                bucket.name().to_owned(),
                format!("{}/{}", bucket.rate(), human(bucket.period())),
                bucket.burst_size().to_string(),
                b.available(now).to_string(),
            ]);
        }
        finish(t)
    };
    if let Some(slots) = slots {
        out.push_str(&format!(
            "key {}: {} running, {} waiting\n",
            slots.key,
            slots.running.len(),
            slots.waiting
        ));
        for id in &slots.running {
            out.push_str(&format!("  {id}\n"));
        }
    }
    out
}

fn tasks(tasks: &[TaskSummary], now: OffsetDateTime) -> String {
    if tasks.is_empty() {
        return "no tasks\n".into();
    }
    let mut t = table(&["ID", "STATUS", "KEY", "ATTEMPTS", "CREATED", "AGE", "LAST ERROR"]);
    for task in tasks {
        t.add_row([
            task.id.to_string(),
            task.status.to_string(),
            task.key_text(),
            format!("{}/{}", task.attempts_in_budget(), task.policy.max_attempts),
            at(task.created_at),
            human(since(task.created_at, now)),
            cut(task.last_error.as_deref().unwrap_or("-"), 60),
        ]);
    }
    finish(t)
}

/// Characters of a payload or response `show` prints before cutting.
const SHOWN: usize = 2000;

fn show(story: &Story, now: OffsetDateTime) -> String {
    let task = &story.task;
    let mut t = table(&["TASK", &task.id.to_string()]);
    let mut row = |k: &str, v: String| {
        t.add_row([k.to_string(), v]);
    };
    row("key", task.key_text());
    row("status", task.status.to_string());
    row(
        "attempts",
        format!(
            "{} of {} in this budget ({} in all, {} left)",
            task.attempts_in_budget(),
            task.policy.max_attempts,
            task.attempts(),
            task.attempts_left()
        ),
    );
    row("version", task.version.to_string());
    row("created", when(task.created_at, now));
    if let Some(at) = task.finished_at {
        row("finished", when(at, now));
    }
    if let Some(at) = task.lease_until {
        row("lease until", when(at, now));
    }
    if let Some(at) = task.not_before {
        row("not before", when(at, now));
    }
    if let Some(at) = task.deadline_at() {
        row("deadline", when(at, now));
    }
    row("expires", when(task.expires_at, now));
    if let Some(error) = &task.last_error {
        row("last error", error.replace('\n', " "));
    }
    row("budget left", budget_left(task, now));
    row(
        "response",
        task.response
            .as_ref()
            .map_or("-".into(), |r| readable(r.as_bytes(), SHOWN)),
    );
    row("payload", readable(&task.payload, SHOWN));
    let mut out = finish(t);
    out.push('\n');
    out.push_str(&timeline(story));
    if !story.effects.is_empty() {
        out.push('\n');
        out.push_str(&effects(story));
    }
    out
}

/// The effect journal: each effect's state, the attempt that last recorded
/// its intent, how often a later attempt found an intent without an
/// outcome and called again, its key, and the outcome.
fn effects(story: &Story) -> String {
    let mut t = table(&["EFFECT", "STATE", "ATTEMPT", "AMBIGUOUS", "KEY", "OUTCOME"]);
    for e in &story.effects {
        let outcome = match (e.state, &e.reference, &e.error) {
            (EffectState::Intended, _, _) => "no outcome recorded".to_string(),
            (_, Some(reference), _) => format!("reference {reference}"),
            (_, None, Some(error)) => cut(&error.replace('\n', " "), 60),
            (_, None, None) => "-".to_string(),
        };
        t.add_row([
            e.name.clone(),
            e.state.to_string(),
            e.attempt.to_string(),
            e.ambiguous.to_string(),
            e.key.to_string(),
            outcome,
        ]);
    }
    finish(t)
}

/// Everything that happened, in time order: submission, handoffs,
/// attempts (start and end), effects (the latest intent and its outcome),
/// reopenings, the end.
fn timeline(story: &Story) -> String {
    let task = &story.task;
    // (instant, tie-break order, event, detail)
    let mut events: Vec<(OffsetDateTime, u8, String, String)> = Vec::new();
    events.push((task.created_at, 0, "submitted".into(), task.key_text()));
    for (i, h) in story.handoffs.iter().enumerate() {
        let n = i + 1;
        match h.published_at {
            Some(at) => {
                events.push((h.created_at, 1, format!("handoff #{n} written"), String::new()));
                events.push((at, 2, format!("handoff #{n} published"), String::new()));
            }
            None => events.push((
                h.created_at,
                1,
                format!("handoff #{n} written"),
                "not yet published".into(),
            )),
        }
    }
    for a in &story.attempts {
        events.push((
            a.started_at,
            3,
            format!("attempt #{} claimed", a.number),
            format!("by {}", a.worker),
        ));
        if let Some(op) = &a.operation_id {
            events.push((
                a.started_at,
                4,
                format!("attempt #{} operation", a.number),
                op.clone(),
            ));
        }
        let ended = match (a.finished_at, a.outcome) {
            (Some(end), outcome) => Some((end, outcome)),
            (None, AttemptOutcome::Running) => None,
            (None, outcome) => Some((a.started_at, outcome)),
        };
        if let Some((end, outcome)) = ended {
            let took = human((end - a.started_at).try_into().unwrap_or_default());
            let detail = match &a.error {
                Some(e) => format!("after {took}: {}", e.replace('\n', " ")),
                None => format!("after {took}"),
            };
            events.push((
                end,
                5,
                format!("attempt #{} {}", a.number, outcome.as_str()),
                detail,
            ));
        }
    }
    for e in &story.effects {
        events.push((
            e.intended_at,
            4,
            format!("effect {} intended", e.name),
            format!("by attempt #{}", e.attempt),
        ));
        if let Some(settled) = e.settled_at {
            events.push((
                settled,
                4,
                format!("effect {} {}", e.name, e.state),
                String::new(),
            ));
        }
    }
    for r in &story.reopenings {
        events.push((
            r.at,
            6,
            format!("reopened #{}", r.number),
            format!(
                "by {} from {} at version {}: {}",
                r.by, r.from, r.version, r.reason
            ),
        ));
    }
    if let Some(end) = task.finished_at {
        // Last, even when the attempt's end was stamped a moment later in
        // the same write.
        let last = events.iter().map(|e| e.0).max().unwrap_or(end).max(end);
        events.push((
            last,
            7,
            task.status.to_string(),
            task.last_error.clone().unwrap_or_default(),
        ));
    }
    events.sort_by_key(|e| (e.0, e.1));
    let mut t = table(&["AT", "EVENT", "DETAIL"]);
    for (instant, _, event, detail) in events {
        t.add_row([at(instant), event, detail]);
    }
    finish(t)
}

/// RFC 3339 UTC to the second.
pub(crate) fn at(t: OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    t.replace_nanosecond(0)
        .unwrap_or(t)
        .format(&Rfc3339)
        .unwrap_or_else(|_| t.to_string())
}

/// An instant and how far it is from now: `2026-01-02T03:04:05Z (4m ago)`.
fn when(t: OffsetDateTime, now: OffsetDateTime) -> String {
    if t <= now {
        format!("{} ({} ago)", at(t), human(since(t, now)))
    } else {
        format!("{} (in {})", at(t), human(since(now, t)))
    }
}

fn since(t: OffsetDateTime, now: OffsetDateTime) -> Duration {
    (now - t).try_into().unwrap_or_default()
}

/// A duration for people: its two largest units, `3d 4h`, `4m 12s`, `850ms`.
pub(crate) fn human(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        return format!("{}ms", d.as_millis());
    }
    let secs = d.as_secs();
    let units = [
        (secs / 86_400, "d"),
        (secs / 3600 % 24, "h"),
        (secs / 60 % 60, "m"),
        (secs % 60, "s"),
    ];
    let first = units.iter().position(|(n, _)| *n > 0).unwrap_or(3);
    units[first..]
        .iter()
        .take(2)
        .filter(|(n, _)| *n > 0)
        .map(|(n, u)| format!("{n}{u}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn cut(text: &str, max: usize) -> String {
    let text = text.replace('\n', " ");
    match text.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_well() {
        assert_eq!(human(Duration::from_millis(850)), "850ms");
        assert_eq!(human(Duration::from_secs(252)), "4m 12s");
        assert_eq!(human(Duration::from_secs(3600)), "1h");
        assert_eq!(human(Duration::from_secs(3 * 86_400 + 4 * 3600 + 5)), "3d 4h");
    }

    #[test]
    fn times_are_utc_to_the_second() {
        let t = time::macros::datetime!(2026-01-02 03:04:05.678 +02:00);
        assert_eq!(at(t), "2026-01-02T01:04:05Z");
    }

    #[test]
    fn bytes_read_as_text_else_hex() {
        assert_eq!(readable(b"", 10), "empty");
        assert_eq!(readable(b"{\"a\":1}", 10), "7 bytes of text: {\"a\":1}");
        assert_eq!(readable(&[0, 0xff, 0x10], 10), "3 bytes, hex: 00ff10");
        assert_eq!(readable(b"a\x01b", 10), "3 bytes, hex: 610162");
        assert_eq!(
            readable(b"abcdef", 3),
            "6 bytes of text: abc… (first 3 of 6 bytes; --json has them all)"
        );
    }

    #[test]
    fn base64_is_rfc_4648() {
        for (raw, encoded) in [
            (&b""[..], ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (b"foob", "Zm9vYg=="),
            (b"\xff\x00\xfe", "/wD+"),
        ] {
            assert_eq!(base64(raw), encoded);
        }
    }

    #[test]
    fn long_errors_are_cut() {
        assert_eq!(cut("abcdef", 3), "abc…");
        assert_eq!(cut("a\nb", 10), "a b");
    }
}
