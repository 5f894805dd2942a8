//! How results look: a [`Report`] is what a command found or did; it prints
//! as tables for people or as JSON for scripts (`--json`).
//!
//! Choices: times in RFC 3339 UTC to the second (JSON keeps the store's full
//! precision), durations humanised to their two largest units (`4m 12s`),
//! borderless tables so `awk '{print $1}'` picks the ids, long error texts
//! cut in listings (`show` prints them whole). JSON is the library's own
//! serde form of `Task`, `Story` and `Counts`, wrapped in an object where a
//! command has more to say (a cursor, a count).

use std::time::Duration;

use comfy_table::{Table, presets};
use serde::Serialize;
use serde_json::json;
use taskfence::inspect::{Counts, Page, Story};
use taskfence::store::AttemptOutcome;
use taskfence::{Status, Task, TaskId};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// What a command has to say.
#[derive(Debug)]
pub(crate) enum Report {
    /// `migrate`: what was done to which schema or table.
    Migrated {
        /// `postgres` or `dynamodb`.
        backend: &'static str,
        /// The schema or table.
        target: String,
        /// `migrated`, `created` or `exists`.
        action: &'static str,
    },
    /// `stats`.
    Stats {
        /// The scope counted, or all.
        scope: Option<String>,
        /// The counts.
        counts: Counts,
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
        tasks: Vec<Task>,
        /// With `--redispatch` on PostgreSQL: the handoffs written.
        redispatched: Option<u64>,
        /// Print only the ids, one per line (`--redispatch` on DynamoDB:
        /// for the application's publisher).
        ids_only: bool,
    },
    /// `dispatch-due --print`.
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
            } => {
                let what = if *backend == "postgres" { "schema" } else { "table" };
                match *action {
                    "exists" => format!("{what} {target} already exists: nothing to do\n"),
                    "created" => format!("created {what} {target}\n"),
                    _ => format!("{what} {target} is up to date\n"),
                }
            }
            Report::Stats { scope, counts } => stats(scope.as_deref(), counts),
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
                ids_only: true,
                ..
            } => found.iter().map(|t| format!("{}\n", t.id)).collect(),
            Report::Stranded {
                tasks: found,
                redispatched,
                ..
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
            } => {
                json!({ "backend": backend, "target": target, "action": action })
            }
            Report::Stats { scope, counts } => {
                let mut v = value(counts);
                v["total"] = json!(counts.total());
                v["scope"] = json!(scope);
                v
            }
            Report::List(page) => json!({
                "tasks": value(&page.tasks),
                "next": page.next.map(|c| c.to_string()),
            }),
            Report::Story(story) => value(story.as_ref()),
            Report::Reopened(task) | Report::Cancelled(task) => value(task.as_ref()),
            Report::Purged(n) => json!({ "purged": n }),
            Report::Stranded {
                tasks, redispatched, ..
            } => json!({
                "tasks": value(tasks),
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

/// `scope/operation/key`, as `show --key` takes it.
trait KeyText {
    fn key_text(&self) -> String;
}

impl KeyText for Task {
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

fn tasks(tasks: &[Task], now: OffsetDateTime) -> String {
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
    row(
        "response",
        task.response
            .as_ref()
            .map_or("-".into(), |r| format!("{} bytes", r.len())),
    );
    row("payload", format!("{} bytes", task.payload.len()));
    let mut out = finish(t);
    out.push('\n');
    out.push_str(&timeline(story));
    out
}

/// Everything that happened, in time order: submission, handoffs,
/// attempts (start and end), reopenings, the end.
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
    fn long_errors_are_cut() {
        assert_eq!(cut("abcdef", 3), "abc…");
        assert_eq!(cut("a\nb", 10), "a b");
    }
}
