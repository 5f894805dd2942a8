//! The checker: reads the run's schema after the workers stopped and counts
//! what happened, and what must never happen.
//!
//! It reads taskfence's own tables (`tasks` with each task's latest attempt,
//! `attempts` with the earlier ones; see the crate's `migrations/`) and the harness's (`queue`, `provider_*`,
//! `deliveries`) with plain SQL, so it trusts nothing the workers said.

use std::fmt::Write as _;

use sqlx::{PgPool, Row};

use crate::queue::quote;

/// The final counts of one run.
#[derive(Debug, Default, Clone)]
pub struct Report {
    /// Tasks the orchestrator submitted (distinct request keys).
    pub submitted: i64,
    /// Task rows in the store.
    pub task_rows: i64,
    /// Tasks with a saved response.
    pub completed: i64,
    /// Tasks terminally failed (budget spent or a permanent error).
    pub failed: i64,
    /// Tasks cancelled (the harness cancels none).
    pub cancelled: i64,
    /// Submitted tasks missing from the store or not terminal after the drain. Must be 0.
    pub lost: i64,
    /// Tasks with more than one completed attempt. Must be 0.
    pub multi_saved: i64,
    /// Completed tasks whose saved response was written by an assignment other
    /// than the one that held the lease last (the response names its version;
    /// the attempts table names the completing attempt). Must be 0.
    pub stale_accepted: i64,
    /// Completed tasks whose saved response the provider never produced for
    /// that assignment. Must be 0.
    pub not_produced: i64,
    /// Tasks with more attempts than their budget. Must be 0.
    pub over_budget: i64,
    /// Attempts (claims) made in all.
    pub attempts: i64,
    /// Provider calls started.
    pub calls_started: i64,
    /// Answers the provider produced (logged before returning them).
    pub answers_produced: i64,
    /// Answers saved as a task's response.
    pub answers_saved: i64,
    /// Queue messages published (copies included).
    pub messages: i64,
    /// Queue deliveries (receives) in all.
    pub deliveries: i64,
    /// Logged delivery outcomes by disposition, most frequent first.
    pub dispositions: Vec<(String, i64)>,
}

impl Report {
    /// The counts that must be zero, by name.
    pub fn must_be_zero(&self) -> [(&'static str, i64); 5] {
        [
            ("tasks lost", self.lost),
            ("tasks with more than one saved response", self.multi_saved),
            ("stale completions accepted", self.stale_accepted),
            ("saved responses the provider never produced", self.not_produced),
            ("tasks with attempts over budget", self.over_budget),
        ]
    }

    /// Whether every must-be-zero count is zero.
    pub fn is_clean(&self) -> bool {
        self.must_be_zero().iter().all(|(_, n)| *n == 0)
    }

    /// The report as a Markdown table.
    pub fn table(&self) -> String {
        let mut t = String::from("| count | value |\n| --- | ---: |\n");
        let mut row = |name: &str, v: i64| {
            let _ = writeln!(t, "| {name} | {v} |");
        };
        row("tasks submitted", self.submitted);
        row("tasks completed", self.completed);
        row("tasks terminally failed", self.failed);
        row("tasks cancelled", self.cancelled);
        for (name, v) in self.must_be_zero() {
            row(&format!("**{name}** (must be 0)"), v);
        }
        row("attempts (claims)", self.attempts);
        row("provider calls started", self.calls_started);
        row("provider answers produced", self.answers_produced);
        row("provider answers saved", self.answers_saved);
        row("queue messages published", self.messages);
        row("queue deliveries", self.deliveries);
        for (d, n) in &self.dispositions {
            row(&format!("deliveries → {d}"), *n);
        }
        t
    }
}

/// Reads the counts of the run in `schema`.
pub async fn check(pool: &PgPool, schema: &str, submitted: i64) -> sqlx::Result<Report> {
    let s = quote(schema);
    // Every attempt: the journal's, and each task's latest from its row.
    let all_attempts = format!(
        "(SELECT task_id, number, outcome FROM {s}.attempts
          UNION ALL
          SELECT id, version::integer, attempt_outcome FROM {s}.tasks WHERE attempt_id IS NOT NULL)"
    );
    let one = |sql: String| async move {
        sqlx::query(sqlx::AssertSqlSafe(sql.as_str()))
            .fetch_one(pool)
            .await
            .and_then(|r| r.try_get::<i64, _>(0))
    };
    let task_rows = one(format!("SELECT count(*) FROM {s}.tasks")).await?;
    let by_status = |status: &'static str| {
        one(format!(
            "SELECT count(*) FROM {s}.tasks WHERE status = '{status}'"
        ))
    };
    let completed = by_status("completed").await?;
    let failed = by_status("failed").await?;
    let cancelled = by_status("cancelled").await?;
    let lost = (submitted - task_rows) + (task_rows - completed - failed - cancelled);
    let multi_saved = one(format!(
        "SELECT count(*) FROM (SELECT task_id FROM {all_attempts} AS a WHERE outcome = 'completed'
                               GROUP BY task_id HAVING count(*) > 1) m"
    ))
    .await?;
    // The saved response names the version that produced it ("answer:<task>:v<version>:…");
    // the attempts table names the attempt whose completion was accepted. Both
    // must be the task's last assignment: a stale one would be older.
    let stale_accepted = one(format!(
        "SELECT count(*) FROM {s}.tasks t
         WHERE t.status = 'completed'
           AND (split_part(convert_from(t.response, 'UTF8'), ':', 3) <> 'v' || t.version
                OR NOT EXISTS (SELECT 1 FROM {all_attempts} AS a
                               WHERE a.task_id = t.id AND a.outcome = 'completed' AND a.number = t.version))"
    ))
    .await?;
    let not_produced = one(format!(
        "SELECT count(*) FROM {s}.tasks t
         WHERE t.status = 'completed'
           AND NOT EXISTS (SELECT 1 FROM {s}.provider_answers p
                           WHERE p.task_id = t.id AND p.version = t.version
                             AND p.answer = convert_from(t.response, 'UTF8'))"
    ))
    .await?;
    // A claim given back unstarted is in the journal but refunded to the
    // budget: it raised `budget_base`, and its outcome says so.
    let over_budget = one(format!(
        "SELECT count(*) FROM {s}.tasks t
         WHERE t.version - t.budget_base > t.max_attempts
            OR (SELECT count(*) FROM {all_attempts} AS a
                WHERE a.task_id = t.id AND a.outcome <> 'returned_unstarted') > t.max_attempts"
    ))
    .await?;
    let attempts = one(format!("SELECT count(*) FROM {all_attempts} AS a")).await?;
    let calls_started = one(format!("SELECT count(*) FROM {s}.provider_calls")).await?;
    let answers_produced = one(format!("SELECT count(*) FROM {s}.provider_answers")).await?;
    let answers_saved = one(format!(
        "SELECT count(*) FROM {s}.tasks t WHERE t.status = 'completed' AND EXISTS
             (SELECT 1 FROM {s}.provider_answers p
              WHERE p.task_id = t.id AND p.answer = convert_from(t.response, 'UTF8'))"
    ))
    .await?;
    let messages = one(format!("SELECT count(*) FROM {s}.queue")).await?;
    let deliveries = one(format!(
        "SELECT coalesce(sum(receives), 0)::bigint FROM {s}.queue"
    ))
    .await?;
    let dispositions = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT disposition, count(*) FROM {s}.deliveries GROUP BY 1 ORDER BY 2 DESC, 1"
    )))
    .fetch_all(pool)
    .await?
    .iter()
    .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
    .collect::<sqlx::Result<_>>()?;
    Ok(Report {
        submitted,
        task_rows,
        completed,
        failed,
        cancelled,
        lost,
        multi_saved,
        stale_accepted,
        not_produced,
        over_budget,
        attempts,
        calls_started,
        answers_produced,
        answers_saved,
        messages,
        deliveries,
        dispositions,
    })
}
