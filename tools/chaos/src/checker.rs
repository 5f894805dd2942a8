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

/// One concurrency key's figures (the limits mode).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyFigures {
    /// The key.
    pub key: String,
    /// Its limit, as the orchestrator gave it to every task naming it.
    pub limit: i64,
    /// Tasks naming it.
    pub tasks: i64,
    /// Provider calls logged for its tasks.
    pub calls: i64,
    /// Most calls in flight at once, provider-side: each call occupies
    /// `[started_at, ends_at]` whatever happened to its worker.
    pub max_in_flight: i64,
    /// Limit 1 only: tasks whose first call started before the first call
    /// of a task submitted earlier (0 for a higher limit).
    pub out_of_order: i64,
}

/// One rate bucket's figures (the limits mode).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketFigures {
    /// The bucket.
    pub name: String,
    /// Tokens per period.
    pub rate: i64,
    /// The period, in milliseconds.
    pub period_ms: i64,
    /// The burst.
    pub burst: i64,
    /// Claims of tasks naming it (each took one token).
    pub claims: i64,
    /// Most claims in any closed window of one period (`[t, t + period]`),
    /// on the store's clock (`started_at` of every attempt). Checked against
    /// [`bound`](Self::bound).
    pub max_claims_per_window: i64,
    /// `burst + rate`: the most tokens the generic cell rate algorithm can
    /// grant in a closed window of one period (see [`gcra_bound`]).
    pub bound: i64,
    /// The shortest time, in microseconds, in which `bound` claims were
    /// made (`None` with fewer claims): the algorithm spaces them at least
    /// `rate` intervals (one period) apart, less the clock readings' gap.
    pub tightest_bound_span_us: Option<i64>,
    /// Most provider call starts in any closed window of one period. For
    /// information only: a call starts some time after its claim took the
    /// token (at most the lease later), so calls can bunch where claims did not.
    pub max_call_starts_per_window: i64,
}

/// The limits mode's figures, read from the provider log and the store's attempts.
#[derive(Debug, Clone, Default)]
pub struct LimitsReport {
    /// Per key, by name.
    pub keys: Vec<KeyFigures>,
    /// Per bucket, by name.
    pub buckets: Vec<BucketFigures>,
    /// Calls the workers did not make because the lease did not cover them.
    pub refused_calls: i64,
    /// Deliveries refused by a limit (`retry after: throttled`).
    pub throttled_deliveries: i64,
}

impl LimitsReport {
    /// Keys whose calls were more at once than their limit.
    pub fn keys_over_limit(&self) -> i64 {
        self.keys.iter().filter(|k| k.max_in_flight > k.limit).count() as i64
    }

    /// Limit-1 tasks whose first call started before an older task's.
    pub fn out_of_order(&self) -> i64 {
        self.keys.iter().map(|k| k.out_of_order).sum()
    }

    /// Buckets that granted more claims in one period than the bound.
    pub fn buckets_over_bound(&self) -> i64 {
        self.buckets
            .iter()
            .filter(|b| b.max_claims_per_window > b.bound)
            .count() as i64
    }

    /// The counts that must be zero, by name.
    pub fn must_be_zero(&self) -> [(&'static str, i64); 3] {
        [
            ("keys over their concurrency limit", self.keys_over_limit()),
            (
                "limit-1 tasks started out of submission order",
                self.out_of_order(),
            ),
            ("buckets over their rate bound", self.buckets_over_bound()),
        ]
    }

    /// The figures as Markdown tables.
    pub fn table(&self) -> String {
        let mut t = String::from(
            "| concurrency key | limit | tasks | calls | max calls in flight | out of order |\n\
             | --- | ---: | ---: | ---: | ---: | ---: |\n",
        );
        for k in &self.keys {
            let _ = writeln!(
                t,
                "| {} | {} | {} | {} | {} | {} |",
                k.key, k.limit, k.tasks, k.calls, k.max_in_flight, k.out_of_order
            );
        }
        t.push_str(
            "\n| rate bucket | rate / period | burst | claims | max claims per period | bound (burst + rate) | shortest span of `bound` claims | max call starts per period |\n\
             | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
        );
        for b in &self.buckets {
            let _ = writeln!(
                t,
                "| {} | {} / {} ms | {} | {} | {} | {} | {} | {} |",
                b.name,
                b.rate,
                b.period_ms,
                b.burst,
                b.claims,
                b.max_claims_per_window,
                b.bound,
                b.tightest_bound_span_us
                    .map_or_else(|| "–".to_owned(), |us| format!("{:.3} ms", us as f64 / 1000.0)),
                b.max_call_starts_per_window
            );
        }
        let _ = writeln!(
            t,
            "\nthrottled deliveries: {}; calls not made (lease too short for the call): {}",
            self.throttled_deliveries, self.refused_calls
        );
        t
    }
}

/// The most intervals overlapping at one instant. Intervals are closed
/// (`[start, end]`) but two that only touch (one ends where the other
/// starts) do not overlap: at one instant, ends are counted before starts.
///
/// ```
/// use chaos::checker::max_overlap;
/// assert_eq!(max_overlap(&[]), 0);
/// assert_eq!(max_overlap(&[(0, 10), (10, 20), (20, 30)]), 1, "touching is not overlapping");
/// assert_eq!(max_overlap(&[(0, 10), (5, 20), (9, 12), (12, 13)]), 3);
/// ```
pub fn max_overlap(intervals: &[(i64, i64)]) -> i64 {
    // (instant, +1 start / -1 end); sorting puts -1 before +1 at one instant.
    let mut events: Vec<(i64, i64)> = intervals
        .iter()
        .flat_map(|&(start, end)| [(start, 1), (end, -1)])
        .collect();
    events.sort_unstable();
    let (mut now, mut most) = (0, 0);
    for (_, step) in events {
        now += step;
        most = most.max(now);
    }
    most
}

/// The most instants in any closed window `[t, t + width]`.
///
/// ```
/// use chaos::checker::max_in_window;
/// assert_eq!(max_in_window(&[], 10), 0);
/// assert_eq!(max_in_window(&[0, 10, 11, 25], 10), 2);
/// assert_eq!(max_in_window(&[5, 0, 10, 10], 10), 4, "both ends are in the window");
/// ```
pub fn max_in_window(instants: &[i64], width: i64) -> i64 {
    let mut sorted = instants.to_vec();
    sorted.sort_unstable();
    let (mut first, mut most) = (0, 0);
    for (last, &t) in sorted.iter().enumerate() {
        while sorted[first] < t - width {
            first += 1;
        }
        most = most.max(last - first + 1);
    }
    most as i64
}

/// The shortest time between the first and the last of `n` consecutive
/// instants (`None` with fewer than `n`, or `n` of 0).
///
/// ```
/// use chaos::checker::tightest_span;
/// assert_eq!(tightest_span(&[0, 10, 11, 25], 2), Some(1));
/// assert_eq!(tightest_span(&[25, 0, 10, 11], 3), Some(11));
/// assert_eq!(tightest_span(&[0, 10], 3), None);
/// ```
pub fn tightest_span(instants: &[i64], n: i64) -> Option<i64> {
    let n = usize::try_from(n).ok().filter(|n| *n >= 1)?;
    let mut sorted = instants.to_vec();
    sorted.sort_unstable();
    sorted.windows(n).map(|w| w[n - 1] - w[0]).min()
}

/// The most tokens a bucket of `rate` per period and `burst` grants in a
/// closed window of one period: `burst + rate`.
///
/// The generic cell rate algorithm takes a token at `t` only if
/// `t >= TAT - tolerance`, then sets `TAT = max(TAT, t) + interval`, with
/// `interval = period / rate` and `tolerance = (burst - 1) * interval`. So
/// the `n`-th token after a first one at `t1` comes no earlier than
/// `t1 + (n - burst) * interval`, and `n` tokens fit in a window of one
/// period (`rate` intervals) only if `n - burst <= rate`. The bound holds
/// with a margin of almost one interval for the checker's clock readings:
/// an attempt's `started_at` is read in the claim's transaction, a little
/// after the clock reading the token was decided on, and a violation
/// would need a claim one whole interval early.
///
/// ```
/// assert_eq!(chaos::checker::gcra_bound(5, 3), 8);
/// ```
pub fn gcra_bound(rate: i64, burst: i64) -> i64 {
    burst + rate
}

/// Of `(submission, first call)` pairs, how many tasks' first call started
/// before the first call of a task submitted earlier.
fn inversions(mut tasks: Vec<(i64, i64)>) -> i64 {
    tasks.sort_unstable();
    let mut bad = 0;
    let mut latest = i64::MIN;
    for (_, first_call) in tasks {
        if first_call < latest {
            bad += 1;
        }
        latest = latest.max(first_call);
    }
    bad
}

/// Reads the limits mode's figures of the run in `schema`: per key, the
/// provider calls' most in flight at once (from `provider_calls`, each call
/// `[started_at, ends_at]`, against the limit recorded in `task_limits`) and,
/// at limit 1, whether tasks' first calls followed submission order; per
/// bucket, the most claims in a period (every attempt's `started_at`, from
/// `attempts` and each task row's latest attempt) against [`gcra_bound`].
pub async fn check_limits(pool: &PgPool, schema: &str) -> sqlx::Result<LimitsReport> {
    let s = quote(schema);
    let micros = |col: &str| format!("(extract(epoch FROM {col}) * 1000000)::bigint");
    let calls = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT l.concurrency_key, l.concurrency_limit, l.submitted, {}, {}
         FROM {s}.provider_calls AS c
         JOIN {s}.tasks AS t ON t.id = c.task_id
         JOIN {s}.task_limits AS l ON l.request_key = t.request_key",
        micros("c.started_at"),
        micros("c.ends_at")
    )))
    .fetch_all(pool)
    .await?;
    let per_key_tasks = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT concurrency_key, max(concurrency_limit)::bigint, count(*)
         FROM {s}.task_limits GROUP BY 1 ORDER BY 1"
    )))
    .fetch_all(pool)
    .await?;
    let mut keys = Vec::new();
    for row in &per_key_tasks {
        let key: String = row.try_get(0)?;
        let limit: i64 = row.try_get(1)?;
        let mut intervals = Vec::new();
        let mut first_calls = std::collections::BTreeMap::<i64, i64>::new();
        for c in &calls {
            if c.try_get::<String, _>(0)? != key {
                continue;
            }
            let (submitted, start, end): (i64, i64, i64) = (c.try_get(2)?, c.try_get(3)?, c.try_get(4)?);
            intervals.push((start, end));
            let first = first_calls.entry(submitted).or_insert(start);
            *first = (*first).min(start);
        }
        keys.push(KeyFigures {
            key,
            limit,
            tasks: row.try_get(2)?,
            calls: intervals.len() as i64,
            max_in_flight: max_overlap(&intervals),
            out_of_order: if limit == 1 {
                inversions(first_calls.into_iter().collect())
            } else {
                0
            },
        });
    }

    let defined = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT name, rate, period_ms, burst FROM {s}.limit_buckets ORDER BY name"
    )))
    .fetch_all(pool)
    .await?;
    let mut buckets = Vec::new();
    for row in &defined {
        let name: String = row.try_get(0)?;
        let (rate, period_ms, burst): (i64, i64, i64) = (row.try_get(1)?, row.try_get(2)?, row.try_get(3)?);
        let claims: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT {} FROM (SELECT a.task_id, a.started_at FROM {s}.attempts AS a
                             UNION ALL
                             SELECT t.id, t.attempt_started_at FROM {s}.tasks AS t
                             WHERE t.attempt_id IS NOT NULL) AS a
             JOIN {s}.tasks AS t ON t.id = a.task_id
             JOIN {s}.task_limits AS l ON l.request_key = t.request_key
             WHERE l.rate_bucket = $1",
            micros("a.started_at")
        )))
        .bind(&name)
        .fetch_all(pool)
        .await?;
        let starts: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT {} FROM {s}.provider_calls AS c
             JOIN {s}.tasks AS t ON t.id = c.task_id
             JOIN {s}.task_limits AS l ON l.request_key = t.request_key
             WHERE l.rate_bucket = $1",
            micros("c.started_at")
        )))
        .bind(&name)
        .fetch_all(pool)
        .await?;
        let width = period_ms * 1000;
        buckets.push(BucketFigures {
            name,
            rate,
            period_ms,
            burst,
            claims: claims.len() as i64,
            max_claims_per_window: max_in_window(&claims, width),
            bound: gcra_bound(rate, burst),
            tightest_bound_span_us: tightest_span(&claims, gcra_bound(rate, burst)),
            max_call_starts_per_window: max_in_window(&starts, width),
        });
    }
    let one = |sql: String| async move {
        sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql.as_str()))
            .fetch_one(pool)
            .await
    };
    Ok(LimitsReport {
        keys,
        buckets,
        refused_calls: one(format!("SELECT count(*) FROM {s}.provider_refusals")).await?,
        throttled_deliveries: one(format!(
            "SELECT count(*) FROM {s}.deliveries WHERE disposition = 'retry after: throttled'"
        ))
        .await?,
    })
}
