//! The SQL of every operation, rendered once per store for its schema.
//!
//! Each happy-path operation is one statement: a data-modifying CTE chain that
//! updates the task row, records the attempt and returns what the caller does
//! not already know. Times
//! come only from `<schema>.store_clock()` (`clock_timestamp()`), called in the
//! `WHERE` and `SET` of the row being written so that it is evaluated after
//! the row lock is held (see the [module documentation](super)).

use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

use crate::policy::AcceptanceRule;
use crate::store::Lease;

mod limits;

pub(crate) use limits::Limits;

/// The task columns, in the order [`super::row::task`] reads them by name.
const TASK_COLUMNS: &str = "id, scope, operation, request_key, input_hash, payload, status, version, \
     max_attempts, initial_backoff_ns, max_backoff_ns, multiplier, jitter, deadline_ns, on_ambiguous, \
     acceptance, lease_until, not_before, response, last_error, created_at, finished_at, expires_at, \
     budget_base, budget_started_at, trace_context, concurrency_key, concurrency_limit, rate_bucket";

/// The columns of a listing's row ([`super::row::summary`]): the task's
/// without `payload` and `response`, which a page never loads.
const SUMMARY_COLUMNS: &str = "id, scope, operation, request_key, input_hash, status, version, \
     max_attempts, initial_backoff_ns, max_backoff_ns, multiplier, jitter, deadline_ns, on_ambiguous, \
     acceptance, lease_until, not_before, last_error, created_at, finished_at, expires_at, \
     budget_base, budget_started_at, trace_context, concurrency_key, concurrency_limit, rate_bucket";

/// The latest attempt's columns in the task row, in the journal's order
/// (`attempts`: id, worker, started_at, finished_at, outcome, operation_id, error).
const ATTEMPT_COLUMNS: &str = "attempt_id, attempt_worker, attempt_started_at, attempt_finished_at, \
     attempt_outcome, attempt_operation_id, attempt_error";

/// Whether every lease is of a current-assignment task.
pub(crate) fn current_only(leases: &[&Lease]) -> bool {
    leases
        .iter()
        .all(|l| l.task().acceptance == AcceptanceRule::CurrentAssignment)
}

/// One rendered statement. Cloning it (once per query) shares the text: sqlx
/// runs only SQL it is handed as audited (`SqlSafeStr`), and these are
/// rendered once per store from constants and the validated schema name.
#[derive(Debug, Clone)]
pub(crate) struct Sql(SqlStr);

impl Sql {
    /// The statement, ready to bind.
    pub(crate) fn query(&self) -> sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments> {
        sqlx::query(self.0.clone())
    }

    pub(crate) fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

impl From<String> for Sql {
    fn from(text: String) -> Self {
        Self(AssertSqlSafe(std::sync::Arc::<str>::from(text)).into_sql_str())
    }
}

/// The statements of one store, for one schema.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) submit: Sql,
    pub(crate) submit_many: Sql,
    pub(crate) get: Sql,
    pub(crate) read: Sql,
    pub(crate) read_lease: Sql,
    pub(crate) find: Sql,
    pub(crate) claim: Sql,
    /// `claim` of a row without an attempt (no journal write possible).
    pub(crate) claim_fresh: Sql,
    pub(crate) renew: Sql,
    /// Any lease's completion.
    pub(crate) complete: Sql,
    /// A current-assignment lease's completion (no journal write possible).
    pub(crate) complete_current: Sql,
    pub(crate) fail: Sql,
    pub(crate) release: Sql,
    pub(crate) cancel: Sql,
    pub(crate) record_operation: Sql,
    pub(crate) fence: Sql,
    pub(crate) effect_read: Sql,
    pub(crate) effect_write: Sql,
    pub(crate) effects: Sql,
    pub(crate) attempts: Sql,
    pub(crate) due: Sql,
    pub(crate) purge_expired: Sql,
    pub(crate) claim_handoffs: Sql,
    pub(crate) mark_published: Sql,
    pub(crate) claim_many: Sql,
    pub(crate) complete_many: Sql,
    /// `complete_many` for a batch of current-assignment leases only.
    pub(crate) complete_many_current: Sql,
    pub(crate) claim_next: Sql,
    pub(crate) renew_many: Sql,
    pub(crate) read_many: Sql,
    pub(crate) reopen: Sql,
    pub(crate) redispatch: Sql,
    /// [`list_sql`] for every [`ListShape`], by [`ListShape::index`].
    pub(crate) list: Vec<Sql>,
    pub(crate) counts: Sql,
    pub(crate) counts_scope: Sql,
    pub(crate) counts_up_to: Sql,
    pub(crate) counts_up_to_scope: Sql,
    pub(crate) story: Sql,
    pub(crate) stranded: Sql,
    /// Each operation's queue (`Inspect::depth`).
    pub(crate) depth: Sql,
    /// The limits: see [`Limits`].
    pub(crate) limits: Limits,
    /// The newest applied migration.
    pub(crate) schema_version: Sql,
}

/// Which filters a listing has and its order: each combination is its own
/// statement, so every plan (also a generic one) knows which index drives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct ListShape {
    pub(crate) status: bool,
    pub(crate) scope: bool,
    pub(crate) operation: bool,
    pub(crate) created_after: bool,
    pub(crate) created_before: bool,
    pub(crate) oldest_first: bool,
}

impl ListShape {
    const COUNT: usize = 64;

    /// The shape's position in [`Statements::list`].
    pub(crate) fn index(self) -> usize {
        [
            self.status,
            self.scope,
            self.operation,
            self.created_after,
            self.created_before,
            self.oldest_first,
        ]
        .iter()
        .enumerate()
        .map(|(bit, &on)| usize::from(on) << bit)
        .sum()
    }

    fn from_index(i: usize) -> Self {
        let on = |bit: usize| i & (1 << bit) != 0;
        Self {
            status: on(0),
            scope: on(1),
            operation: on(2),
            created_after: on(3),
            created_before: on(4),
            oldest_first: on(5),
        }
    }
}

/// One listing: the present filters' parameters numbered in the order
/// status, scope, operation, created_after, created_before, then the cursor
/// (always bound: the id bound that precedes every task when there is none)
/// and the page size plus one. Keyset pagination on the primary key's order.
fn list_sql(s: &str, shape: ListShape) -> String {
    let mut conditions = Vec::new();
    let mut n = 0;
    let mut param = || {
        n += 1;
        format!("${n}")
    };
    for (on, condition) in [
        (shape.status, "status ="),
        (shape.scope, "scope ="),
        (shape.operation, "operation ="),
        (shape.created_after, "created_at >="),
        (shape.created_before, "created_at <"),
    ] {
        if on {
            conditions.push(format!("{condition} {}", param()));
        }
    }
    let (after, order) = if shape.oldest_first {
        (">", "ASC")
    } else {
        ("<", "DESC")
    };
    conditions.push(format!("id {after} {}", param()));
    let limit = param();
    format!(
        "SELECT {SUMMARY_COLUMNS} FROM {s}.tasks WHERE {} ORDER BY id {order} LIMIT {limit}",
        conditions.join(" AND ")
    )
}

impl Statements {
    /// Every statement by operation name, for `EXPLAIN` and review.
    pub(crate) fn all(&self) -> Vec<(&'static str, &str)> {
        let mut all = vec![
            ("submit", self.submit.as_str()),
            ("submit_many", self.submit_many.as_str()),
            ("get", self.get.as_str()),
            ("read", self.read.as_str()),
            ("read_lease", self.read_lease.as_str()),
            ("find", self.find.as_str()),
            ("claim", self.claim.as_str()),
            ("claim_fresh", self.claim_fresh.as_str()),
            ("renew", self.renew.as_str()),
            ("complete", self.complete.as_str()),
            ("complete_current", self.complete_current.as_str()),
            ("fail", self.fail.as_str()),
            ("release", self.release.as_str()),
            ("cancel", self.cancel.as_str()),
            ("record_operation", self.record_operation.as_str()),
            ("fence", self.fence.as_str()),
            ("effect_read", self.effect_read.as_str()),
            ("effect_write", self.effect_write.as_str()),
            ("effects", self.effects.as_str()),
            ("attempts", self.attempts.as_str()),
            ("due", self.due.as_str()),
            ("purge_expired", self.purge_expired.as_str()),
            ("claim_handoffs", self.claim_handoffs.as_str()),
            ("mark_published", self.mark_published.as_str()),
            ("claim_many", self.claim_many.as_str()),
            ("complete_many", self.complete_many.as_str()),
            ("complete_many_current", self.complete_many_current.as_str()),
            ("claim_next", self.claim_next.as_str()),
            ("renew_many", self.renew_many.as_str()),
            ("read_many", self.read_many.as_str()),
            ("reopen", self.reopen.as_str()),
            ("redispatch", self.redispatch.as_str()),
            ("list", self.list_text(ListShape::default())),
            (
                "list_oldest",
                self.list_text(ListShape {
                    oldest_first: true,
                    ..ListShape::default()
                }),
            ),
            (
                "list_status",
                self.list_text(ListShape {
                    status: true,
                    ..ListShape::default()
                }),
            ),
            (
                // The state sampler's oldest pending task.
                "list_status_oldest",
                self.list_text(ListShape {
                    status: true,
                    oldest_first: true,
                    ..ListShape::default()
                }),
            ),
            (
                "list_scope",
                self.list_text(ListShape {
                    scope: true,
                    ..ListShape::default()
                }),
            ),
            (
                "list_operation",
                self.list_text(ListShape {
                    operation: true,
                    ..ListShape::default()
                }),
            ),
            (
                "list_created",
                self.list_text(ListShape {
                    created_after: true,
                    created_before: true,
                    ..ListShape::default()
                }),
            ),
            ("counts", self.counts.as_str()),
            ("counts_scope", self.counts_scope.as_str()),
            ("counts_up_to", self.counts_up_to.as_str()),
            ("counts_up_to_scope", self.counts_up_to_scope.as_str()),
            ("story", self.story.as_str()),
            ("stranded", self.stranded.as_str()),
            ("depth", self.depth.as_str()),
        ];
        all.extend(self.limits.all());
        all
    }

    /// The completion statement of a batch: a current-assignment lease holds
    /// its task's latest attempt (the row's), so no journal row can be the
    /// answering one and the statement leaves the journal out.
    pub(crate) fn completion_many(&self, leases: &[&Lease]) -> &Sql {
        if current_only(leases) {
            &self.complete_many_current
        } else {
            &self.complete_many
        }
    }

    fn list_text(&self, shape: ListShape) -> &str {
        self.list_of(shape).as_str()
    }

    /// The listing statement of `shape`.
    pub(crate) fn list_of(&self, shape: ListShape) -> &Sql {
        &self.list[shape.index()]
    }

    /// Renders every statement for the quoted schema name `s`; with
    /// `notify`, a submission of a task without a handoff also notifies that
    /// channel (a plain identifier) with the task's operation.
    pub(crate) fn new(s: &str, notify: Option<&str>) -> Self {
        let cols = TASK_COLUMNS;
        // A SELECT in a WITH runs only as far as the query reads it, so the
        // created branch reads the notification's CTE (once, and only when a
        // task was created).
        let (notified, read_notified) = match notify {
            Some(channel) => (
                format!(
                    ",\n                notified AS (SELECT pg_notify('{channel}', $3) FROM created WHERE NOT $17)"
                ),
                "\n                WHERE (SELECT count(*) FROM notified) >= 0",
            ),
            None => (String::new(), ""),
        };
        // The same for a batch: one notification per created task without a
        // handoff (PostgreSQL folds equal ones of a transaction into one).
        let (notified_many, read_notified_many) = match notify {
            Some(channel) => (
                format!(
                    ",\n                notified AS (SELECT pg_notify('{channel}', r.roperation)
                                  FROM created AS c JOIN req AS r ON r.rid = c.id WHERE NOT r.rhandoff)"
                ),
                "\n                WHERE (SELECT count(*) FROM notified) >= 0",
            ),
            None => (String::new(), ""),
        };
        // A new task's row as `submit` returns it: the server's instants,
        // NULL for what the caller sent.
        let created_cols = TASK_COLUMNS
            .split(", ")
            .map(|c| match c {
                "created_at" | "expires_at" => c,
                _ => "NULL",
            })
            .collect::<Vec<_>>()
            .join(", ");
        // Lock the row first (an InitPlan that the write's `id = (SELECT id
        // FROM locked)` needs before it reads a row), so the guard and its
        // clock are evaluated after the lock is held — also when the previous
        // holder only locked the row and changed nothing (no recheck then).
        let locked =
            format!("locked AS MATERIALIZED (SELECT id FROM {s}.tasks WHERE id = $1 FOR NO KEY UPDATE)");
        // A claim's lock also keeps the row's latest attempt, which a take
        // moves to the journal: a locking read returns the newest committed
        // row (it follows the row's updates, as the `UPDATE` does), so this is
        // the attempt the `UPDATE` replaces.
        let locked_attempt = format!(
            "locked AS MATERIALIZED (SELECT id, version, {ATTEMPT_COLUMNS} FROM {s}.tasks WHERE id = $1 FOR NO KEY UPDATE)"
        );
        // Fragments the single and the batch forms share, so both decide alike.
        // A claim's take-or-exhaust, from one clock reading after the lock
        // ($3 lease interval, $5/$6 the stop reasons):
        // A take starts the new attempt (`attempt`: its id) in the row; an
        // exhaust ends a still-running attempt there as `expired`.
        let claim_set = |attempt: &str| {
            format!(
            "SET (version, status, lease_until, not_before, finished_at, last_error,
                  attempt_id, attempt_worker, attempt_started_at, attempt_finished_at, attempt_outcome,
                  attempt_operation_id, attempt_error) = (
                        SELECT CASE WHEN d.take THEN t.version + 1 ELSE t.version END,
                               CASE WHEN d.take THEN 'running' ELSE 'failed' END,
                               CASE WHEN d.take THEN d.now + $3 END,
                               NULL::timestamptz,
                               CASE WHEN d.take THEN NULL ELSE d.now END,
                               CASE WHEN d.take THEN t.last_error
                                    WHEN t.version - t.budget_base >= t.max_attempts THEN $5 ELSE $6 END,
                               CASE WHEN d.take THEN {attempt} ELSE t.attempt_id END,
                               CASE WHEN d.take THEN $4 ELSE t.attempt_worker END,
                               CASE WHEN d.take THEN d.now ELSE t.attempt_started_at END,
                               CASE WHEN d.take THEN NULL
                                    WHEN t.attempt_outcome = 'running' THEN d.now ELSE t.attempt_finished_at END,
                               CASE WHEN d.take THEN 'running'
                                    WHEN t.attempt_outcome = 'running' THEN 'expired' ELSE t.attempt_outcome END,
                               CASE WHEN d.take THEN NULL ELSE t.attempt_operation_id END,
                               CASE WHEN d.take THEN NULL ELSE t.attempt_error END
                        FROM (SELECT c.now, t.version - t.budget_base < t.max_attempts
                                            AND (t.deadline_at IS NULL OR t.deadline_at > c.now) AS take
                              FROM (SELECT {s}.store_clock() AS now OFFSET 0) AS c) AS d
                    )"
            )
        };
        // A row a claim may take: pending past its backoff, or its lease expired.
        let claim_available = format!(
            "((t.status = 'pending' AND (t.not_before IS NULL OR t.not_before <= {s}.store_clock()))
                        OR (t.status = 'running' AND t.lease_until <= {s}.store_clock()))"
        );
        // A row the plain claims may take: one naming no limit. A task naming
        // a concurrency key or a rate bucket is claimed only under its locks
        // (`ops::limits`), which pass `$7` true once its limits are decided.
        let unlimited = "t.concurrency_key IS NULL AND t.rate_bucket IS NULL";
        // The task columns of `t`, where another relation has some of the same names.
        let t_cols = TASK_COLUMNS
            .split(", ")
            .map(|c| format!("t.{c}"))
            .collect::<Vec<_>>()
            .join(", ");
        // A task of the operations ($7) and scopes ($8) a `claim_next` asks for.
        let wanted = "(cardinality($7::text[]) = 0 OR t.operation = ANY($7::text[]))
                      AND (cardinality($8::text[]) = 0 OR t.scope = ANY($8::text[]))";
        // A take moves the row's previous attempt (`lock`: its locked
        // pre-image) to the journal, as `expired` if it never reported.
        let moved = |lock: &str| {
            format!(
                "moved AS (
                    INSERT INTO {s}.attempts (task_id, number, id, worker, started_at, finished_at, outcome,
                                              operation_id, error)
                    SELECT l.id, l.version, l.attempt_id, l.attempt_worker, l.attempt_started_at,
                           CASE WHEN l.attempt_outcome = 'running' THEN {s}.store_clock() ELSE l.attempt_finished_at END,
                           CASE WHEN l.attempt_outcome = 'running' THEN 'expired' ELSE l.attempt_outcome END,
                           l.attempt_operation_id, l.attempt_error
                    FROM claimed AS c JOIN {lock} AS l ON l.id = c.id
                    WHERE c.status = 'running' AND l.attempt_id IS NOT NULL
                )"
            )
        };
        // `rules::check_lease` with `rules::accept` for the lease version `v`
        // and attempt `a`: the current assignment with a live lease, or, for
        // a first-valid-answer task, any version granted so far while the
        // task is not terminal; never a second response. Either way the
        // attempt recorded at `v` (the row's for the current version, the
        // journal's for an earlier one) is the lease's own.
        let accept = |v: &str, a: &str| {
            format!(
                "response IS NULL
                      AND ((version = {v} AND attempt_id = {a} AND status = 'running'
                            AND lease_until > {s}.store_clock())
                        OR (acceptance = 'first_valid_answer' AND {v} BETWEEN budget_base + 1 AND version
                            AND status IN ('pending', 'running')
                            AND CASE WHEN {v} = version THEN attempt_id = {a}
                                     ELSE EXISTS (SELECT 1 FROM {s}.attempts AS j
                                                  WHERE j.task_id = t.id AND j.number = {v} AND j.id = {a}) END))"
            )
        };
        let (accept_single, accept_many) = (accept("$2", "$4"), accept("req.rversion", "req.rattempt"));
        // A completion with lease version `v` (`response`: the answer),
        // from one clock reading. The answering attempt ends `completed`: the
        // row's latest attempt when it holds `v`; otherwise (a first valid
        // answer from an earlier attempt) the row's attempt, if it still
        // runs, ends `overtaken`, and the journal's attempt `v` is relabelled.
        let complete_set = |v: &str, response: &str| {
            format!(
                "SET (status, response, lease_until, not_before, finished_at, attempt_finished_at,
                      attempt_outcome) = (
                        SELECT 'completed', {response}, NULL::timestamptz, NULL::timestamptz, c.now,
                               CASE WHEN (t.version = {v} AND t.attempt_id IS NOT NULL)
                                         OR t.attempt_outcome = 'running' THEN c.now
                                    ELSE t.attempt_finished_at END,
                               CASE WHEN t.version = {v} AND t.attempt_id IS NOT NULL THEN 'completed'
                                    WHEN t.attempt_outcome = 'running' THEN 'overtaken'
                                    ELSE t.attempt_outcome END
                        FROM (SELECT {s}.store_clock() AS now OFFSET 0) AS c
                    )"
            )
        };
        // Only a first-valid-answer task can be answered by an attempt already
        // in the journal; a current-assignment lease always holds the row's
        // latest attempt, so its statements leave the journal out.
        let relabelled = |v: &str, relabel: bool| {
            if !relabel {
                return String::new();
            }
            format!(
                ", relabelled AS (
                    UPDATE {s}.attempts AS a SET finished_at = d.finished_at, outcome = 'completed'
                    FROM done AS d
                    WHERE a.task_id = d.id AND a.number = {v} AND d.attempt_outcome IS DISTINCT FROM 'completed'
                )"
            )
        };
        // The batch form: every row of the batch locked first, in id order (so
        // two batches sharing tasks never deadlock), before the write reads any
        // of them; `id = ANY(ARRAY(SELECT id FROM locked_all))` is an InitPlan,
        // as the single form's `= (SELECT id FROM locked)` is.
        let locked_all = format!(
            "locked_all AS MATERIALIZED (SELECT id FROM {s}.tasks WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE)"
        );
        let locked_all_attempt = format!(
            "locked_all AS MATERIALIZED (SELECT id, version, {ATTEMPT_COLUMNS} FROM {s}.tasks
                                         WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE)"
        );
        // Every attempt of the task `id`: the journal's and the row's latest.
        let journal = |id: &str| {
            format!(
                "(SELECT id, task_id, number, worker, started_at, finished_at, outcome, operation_id, error
                  FROM {s}.attempts WHERE task_id = {id}
                  UNION ALL
                  SELECT cur.attempt_id, cur.id, cur.version::integer, cur.attempt_worker, cur.attempt_started_at,
                         cur.attempt_finished_at, cur.attempt_outcome, cur.attempt_operation_id, cur.attempt_error
                  FROM {s}.tasks AS cur WHERE cur.id = {id} AND cur.attempt_id IS NOT NULL)"
            )
        };
        // $1 id, $2 version, $3 response, $4 attempt id. The textbook guarded UPDATE, with
        // the attempt's outcome written in the same row. The guard is
        // `rules::accept`: the current assignment with a live lease, or, for a
        // first-valid-answer task, any assignment granted so far while the
        // task is not terminal.
        let complete = format!(
            "WITH {locked},
            done AS (
                UPDATE {s}.tasks AS t
                {}
                WHERE id = (SELECT id FROM locked)
                  AND {accept_single}
                RETURNING {cols}, attempt_outcome
            ){}
            SELECT {cols} FROM done",
            complete_set("$2", "$3"),
            relabelled("$2", true)
        );
        // `complete` of a current-assignment lease: no journal row to
        // relabel, and the task comes back as the lease's (what the claim
        // returned; nothing else changes it while the version stands) with
        // what the completion wrote, so only the server's values return.
        let complete_current = format!(
            "WITH {locked}
            UPDATE {s}.tasks AS t
            {}
            WHERE id = (SELECT id FROM locked)
              AND {accept_single}
            RETURNING version, finished_at",
            complete_set("$2", "$3")
        );
        // $1 ids, $2 versions, $3 responses, $4 attempt ids (same order).
        // `complete` for every lease of the batch, each row guarded on its own.
        let complete_many = |relabel: bool| {
            format!(
                "WITH {locked_all},
                req AS (SELECT r.rid, r.rversion, r.rresponse, r.rattempt
                        FROM unnest($1::uuid[], $2::int8[], $3::bytea[], $4::uuid[])
                             AS r(rid, rversion, rresponse, rattempt)),
                done AS (
                    UPDATE {s}.tasks AS t
                    {}
                    FROM req
                    WHERE id = req.rid
                      AND id = ANY(ARRAY(SELECT id FROM locked_all))
                      AND {accept_many}
                    RETURNING {cols}, attempt_outcome, req.rversion
                ){}
                SELECT {cols} FROM done",
                complete_set("req.rversion", "req.rresponse"),
                relabelled("d.rversion", relabel)
            )
        };
        // $1 id, $2 attempt id, $3 lease interval, $4 worker, $5/$6 the stop reasons.
        // The WHERE takes the row only if it is available (pending past its
        // backoff, or running with an expired lease); the multi-column SET
        // reads the clock once, after the lock, and decides take or exhaust,
        // and a take moves the row's previous attempt to the journal.
        // Not written: the statement's snapshot of the row, for the caller to
        // classify. (`SELECT *` passes the written row on as RETURNING made it,
        // without a second projection of every column.)
        let claim = format!(
            "WITH {locked_attempt},
            claimed AS (
                UPDATE {s}.tasks AS t
                {}
                WHERE t.id = (SELECT id FROM locked)
                  AND {claim_available} AND ($7 OR ({unlimited}))
                RETURNING true AS written, {cols}, {s}.store_clock() AS store_now
            ),
            {}
            SELECT * FROM claimed
            UNION ALL
            SELECT false, {cols}, {s}.store_clock() FROM {s}.tasks
            WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM claimed)",
            claim_set("$2::uuid"),
            moved("locked"),
        );
        // The same parameters. Most claims are a task's first: the bare
        // guarded UPDATE of an available row that holds no attempt (nothing
        // to move to the journal), returning the row only when it wrote it;
        // the caller answers every other case with `claim`. No lock first:
        // such a row, once available, stays available until written, and a
        // lock holder that writes it makes the UPDATE recheck (POSTGRES.md,
        // "Claim").
        let claim_fresh = format!(
            "UPDATE {s}.tasks AS t
            {}
            WHERE t.id = $1
              AND {claim_available} AND t.attempt_id IS NULL AND ($7 OR ({unlimited}))
            RETURNING {cols}",
            claim_set("$2::uuid"),
        );
        // The id of the attempt recorded at version `v` of the row `t`: the
        // row's latest for its current version, the journal's for an earlier one.
        let recorded_attempt = |v: &str| {
            format!(
                "CASE WHEN t.version = {v} THEN t.attempt_id
                      ELSE (SELECT j.id FROM {s}.attempts AS j WHERE j.task_id = t.id AND j.number = {v}) END"
            )
        };
        Self {
            // $1 id, $2 scope, $3 operation, $4 key, $5 input hash, $6 payload,
            // $7..$13 policy, $14 deadline interval, $15 retention interval, $16 acceptance rule,
            // $17 whether a handoff goes with it, $18 the submitter's trace context (or NULL),
            // $19/$20 the concurrency key and its limit, $21 the rate bucket (NULL: none).
            // A task naming a key takes its place in the key's order from a
            // sequence: a submission that returned before another began has
            // the smaller place.
            // ON CONFLICT DO NOTHING never raises a unique violation. A new
            // task returns only what the server chose (its clock's instants;
            // the caller has every other value), the rest of its row NULL; a
            // taken key returns the existing task (the second branch). No row:
            // a racing insert committed after this statement's snapshot, and
            // the caller reads it once more.
            submit: Sql::from(format!(
                "WITH created AS (
                    INSERT INTO {s}.tasks AS t (id, scope, operation, request_key, input_hash, payload, status,
                        version, max_attempts, initial_backoff_ns, max_backoff_ns, multiplier, jitter,
                        deadline_ns, on_ambiguous, deadline_at, created_at, expires_at, acceptance,
                        budget_started_at, handoff, trace_context, concurrency_key, concurrency_limit,
                        key_order, rate_bucket)
                    SELECT $1, $2, $3, $4, $5, $6, 'pending', 0, $7, $8, $9, $10, $11, $12, $13,
                           c.now + $14, c.now, c.now + $15, $16, c.now, $17, $18, $19::text, $20::int4,
                           CASE WHEN $19::text IS NOT NULL THEN nextval('{s}.tasks_key_order_seq') END,
                           $21::text
                    FROM (SELECT {s}.store_clock() AS now OFFSET 0) AS c
                    ON CONFLICT (scope, operation, request_key) DO NOTHING
                    RETURNING created_at, expires_at
                ),
                handoff AS (
                    INSERT INTO {s}.handoffs (task_id, created_at) SELECT $1, created_at FROM created WHERE $17
                ){notified}
                SELECT false AS created, {cols} FROM {s}.tasks
                WHERE scope = $2 AND operation = $3 AND request_key = $4
                  AND NOT EXISTS (SELECT 1 FROM created)
                UNION ALL
                SELECT true, {created_cols} FROM created{read_notified}"
            )),
            // $1..$18: `submit`'s parameters as arrays, one element per
            // submission (keys distinct: the caller sends a key repeated
            // within a batch in a later statement). Each row is inserted or
            // found on its own, as `submit` does: a created task returns its
            // place `n` and the server's instants, a taken key its place and
            // the existing row; a place with no row was taken by a racing
            // insert after the snapshot (the caller submits it alone). Rows
            // are inserted in key order, so two batches sharing keys wait for
            // each other in one order.
            submit_many: Sql::from(format!(
                "WITH req AS MATERIALIZED (
                    SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::bytea[], $6::bytea[],
                                         $7::int4[], $8::int8[], $9::int8[], $10::float8[], $11::float8[],
                                         $12::int8[], $13::text[], $14::interval[], $15::interval[], $16::text[],
                                         $17::bool[], $18::text[])
                        WITH ORDINALITY AS r(rid, rscope, roperation, rkey, rhash, rpayload, rmax_attempts,
                                             rinitial_backoff_ns, rmax_backoff_ns, rmultiplier, rjitter,
                                             rdeadline_ns, ron_ambiguous, rdeadline, rretention, racceptance,
                                             rhandoff, rtrace_context, n)
                ),
                created AS (
                    INSERT INTO {s}.tasks AS t (id, scope, operation, request_key, input_hash, payload, status,
                        version, max_attempts, initial_backoff_ns, max_backoff_ns, multiplier, jitter,
                        deadline_ns, on_ambiguous, deadline_at, created_at, expires_at, acceptance,
                        budget_started_at, handoff, trace_context)
                    SELECT r.rid, r.rscope, r.roperation, r.rkey, r.rhash, r.rpayload, 'pending', 0,
                           r.rmax_attempts, r.rinitial_backoff_ns, r.rmax_backoff_ns, r.rmultiplier, r.rjitter,
                           r.rdeadline_ns, r.ron_ambiguous, c.now + r.rdeadline, c.now, c.now + r.rretention,
                           r.racceptance, c.now, r.rhandoff, r.rtrace_context
                    FROM req AS r CROSS JOIN (SELECT {s}.store_clock() AS now OFFSET 0) AS c
                    ORDER BY r.rscope, r.roperation, r.rkey
                    ON CONFLICT (scope, operation, request_key) DO NOTHING
                    RETURNING id, created_at, expires_at
                ),
                handoff AS (
                    INSERT INTO {s}.handoffs (task_id, created_at)
                    SELECT c.id, c.created_at FROM created AS c JOIN req AS r ON r.rid = c.id
                    WHERE r.rhandoff ORDER BY r.n
                ){notified_many}
                SELECT r.n, false AS created, {t_cols}
                FROM req AS r JOIN {s}.tasks AS t
                  ON t.scope = r.rscope AND t.operation = r.roperation AND t.request_key = r.rkey
                WHERE NOT EXISTS (SELECT 1 FROM created AS c WHERE c.id = r.rid)
                UNION ALL
                SELECT r.n, true, {created_cols} FROM created JOIN req AS r ON r.rid = created.id{read_notified_many}"
            )),
            get: Sql::from(format!("SELECT {cols} FROM {s}.tasks WHERE id = $1")),
            // $1 id. The row and the store clock in one read: what a refused
            // cancel or reopen is classified from.
            read: Sql::from(format!("SELECT {cols}, {s}.store_clock() AS store_now FROM {s}.tasks WHERE id = $1")),
            // $1 id, $2 version. `read` with the id of the attempt recorded
            // at that version (the row's, else the journal's): what a
            // refused write of a lease is classified from (`rules::check_lease`).
            read_lease: Sql::from(format!(
                "SELECT {cols}, {s}.store_clock() AS store_now, {recorded_attempt} AS recorded_attempt
                 FROM {s}.tasks AS t WHERE id = $1",
                recorded_attempt = recorded_attempt("$2"),
            )),
            find: Sql::from(format!(
                "SELECT {cols} FROM {s}.tasks WHERE scope = $1 AND operation = $2 AND request_key = $3"
            )),
            claim: Sql::from(claim),
            claim_fresh: Sql::from(claim_fresh),
            // $1 id, $2 version, $3 extension, $4 attempt id.
            renew: Sql::from(format!(
                "WITH {locked}
                 UPDATE {s}.tasks SET lease_until = {s}.store_clock() + $3
                 WHERE id = (SELECT id FROM locked) AND version = $2 AND attempt_id = $4
                   AND status = 'running' AND lease_until > {s}.store_clock()
                 RETURNING lease_until"
            )),
            complete: Sql::from(complete),
            complete_current: Sql::from(complete_current),
            // $1 id, $2 version, $3 stop message (NULL: the policy allows a retry),
            // $4 failure message, $5 deadline-exhausted message, $6 retry delay, $7 attempt outcome,
            // $8 attempt id.
            fail: Sql::from(format!(
                "WITH {locked},
                failed AS (
                    UPDATE {s}.tasks AS t
                    SET (status, lease_until, not_before, finished_at, last_error,
                         attempt_finished_at, attempt_outcome, attempt_error) = (
                        SELECT CASE WHEN d.stop THEN 'failed' ELSE 'pending' END,
                               NULL::timestamptz,
                               CASE WHEN NOT d.stop THEN d.retry_at END,
                               CASE WHEN d.stop THEN d.now END,
                               CASE WHEN $3::text IS NOT NULL THEN $3::text
                                    WHEN d.stop THEN $5 ELSE $4 END,
                               d.now, $7, $4
                        FROM (SELECT c.now, c.now + $6 AS retry_at,
                                     $3::text IS NOT NULL
                                     OR (t.deadline_at IS NOT NULL AND c.now + $6 >= t.deadline_at) AS stop
                              FROM (SELECT {s}.store_clock() AS now OFFSET 0) AS c) AS d
                    )
                    WHERE t.id = (SELECT id FROM locked) AND t.version = $2 AND t.attempt_id = $8
                      AND t.status = 'running' AND t.lease_until > {s}.store_clock()
                    RETURNING {cols}
                )
                SELECT {cols} FROM failed"
            )),
            // $1 id, $2 version, $3 attempt outcome, $4 refund (both from
            // `rules::Work`: a release whose work never began raises the
            // budget base by one in the same fenced write), $5 attempt id.
            // The task is due again from the release on (`not_before`: now),
            // so `due` and `claim_next` find it.
            release: Sql::from(format!(
                "WITH {locked}
                UPDATE {s}.tasks
                SET (status, lease_until, not_before, attempt_finished_at, attempt_outcome, budget_base) = (
                    SELECT 'pending', NULL::timestamptz, c.now, c.now, $3, LEAST(budget_base + $4, version)
                    FROM (SELECT {s}.store_clock() AS now OFFSET 0) AS c
                )
                WHERE id = (SELECT id FROM locked) AND version = $2 AND attempt_id = $5
                  AND status = 'running' AND lease_until > {s}.store_clock()
                RETURNING id"
            )),
            // $1 id, $2 reason.
            cancel: Sql::from(format!(
                "UPDATE {s}.tasks AS t
                SET (status, lease_until, not_before, finished_at, last_error, attempt_finished_at,
                     attempt_outcome) = (
                    SELECT 'cancelled', NULL::timestamptz, NULL::timestamptz, c.now, $2,
                           CASE WHEN t.attempt_outcome = 'running' THEN c.now ELSE t.attempt_finished_at END,
                           CASE WHEN t.attempt_outcome = 'running' THEN 'cancelled' ELSE t.attempt_outcome END
                    FROM (SELECT {s}.store_clock() AS now OFFSET 0) AS c
                )
                WHERE id = $1 AND status IN ('pending', 'running')
                RETURNING {cols}"
            )),
            // $1 id, $2 version, $3 operation id, $4 attempt id. The running attempt is the
            // row's latest, so this is a fenced write of the row, as renew.
            // $1 id, $2 version, $3 attempt id. The guard of every fenced write, as a read
            // that keeps a share lock on the row until the caller's
            // transaction ends: a claim (a takeover), a cancel or another
            // worker's save waits for it, so the caller's own writes in that
            // transaction commit only under this lease. The guard is the
            // locking read's own condition: should a claim be writing the
            // row, the read waits for it and checks the row it wrote, not
            // the statement's older snapshot.
            fence: Sql::from(format!(
                "SELECT version FROM {s}.tasks
                 WHERE id = $1 AND version = $2 AND attempt_id = $3
                   AND status = 'running' AND lease_until > {s}.store_clock()
                 FOR SHARE"
            )),
            // $1 id, $2 version, $3 effect name, $4 attempt id. The effect's record (all
            // nulls when there is none) and the store clock, if the lease
            // passes the fence; no row otherwise. Not locking: the write
            // that follows is fenced itself and conditional on this record.
            effect_read: Sql::from(format!(
                "SELECT {s}.store_clock() AS store_now, e.*
                 FROM {s}.tasks AS t LEFT JOIN {s}.effects AS e ON e.task_id = t.id AND e.name = $3
                 WHERE t.id = $1 AND t.version = $2 AND t.attempt_id = $4
                   AND t.status = 'running' AND t.lease_until > {s}.store_clock()"
            )),
            // $1 id, $2 version, $3 name, $4 state, $5 attempt, $6 reference,
            // $7 error, $8 ambiguous, $9 created_at, $10 intended_at,
            // $11 settled_at; $12/$13 the state and version of the record
            // the decision read (null: none); $14 attempt id. Fenced as `fence` (the share
            // lock lasts until the statement commits, so a takeover waits
            // for it) and conditional on the record being the one read: no
            // row when either changed, and the caller reads again.
            effect_write: Sql::from(format!(
                "WITH fence AS MATERIALIZED (
                     SELECT id FROM {s}.tasks
                     WHERE id = $1 AND version = $2 AND attempt_id = $14
                       AND status = 'running' AND lease_until > {s}.store_clock()
                     FOR SHARE)
                 INSERT INTO {s}.effects AS e
                     (task_id, name, state, version, attempt, reference, error, ambiguous, created_at, intended_at, settled_at)
                 SELECT id, $3, $4, $2, $5, $6, $7, $8, $9, $10, $11 FROM fence
                 ON CONFLICT (task_id, name) DO UPDATE
                 SET (state, version, attempt, reference, error, ambiguous, created_at, intended_at, settled_at) =
                     (EXCLUDED.state, EXCLUDED.version, EXCLUDED.attempt, EXCLUDED.reference, EXCLUDED.error,
                      EXCLUDED.ambiguous, EXCLUDED.created_at, EXCLUDED.intended_at, EXCLUDED.settled_at)
                 WHERE e.state = $12 AND e.version = $13
                 RETURNING e.task_id"
            )),
            // $1 id: the task's effect journal, by name (the primary key's order).
            effects: Sql::from(format!("SELECT * FROM {s}.effects WHERE task_id = $1 ORDER BY name")),
            record_operation: Sql::from(format!(
                "WITH {locked}
                 UPDATE {s}.tasks SET attempt_operation_id = $3
                 WHERE id = (SELECT id FROM locked) AND version = $2 AND attempt_id = $4
                   AND status = 'running' AND lease_until > {s}.store_clock()
                 RETURNING version"
            )),
            attempts: Sql::from(format!("SELECT * FROM {} AS x ORDER BY number", journal("$1"))),
            // $1 limit. The clock is read once (an InitPlan), so it can bound
            // the partial-index range scans; each branch stops after $1 rows.
            due: Sql::from(format!(
                "WITH clock AS (SELECT {s}.store_clock() AS now)
                 SELECT id FROM (
                     (SELECT id, lease_until AS due_at FROM {s}.tasks
                      WHERE status = 'running' AND lease_until <= (SELECT now FROM clock)
                      ORDER BY lease_until LIMIT $1)
                     UNION ALL
                     (SELECT id, not_before FROM {s}.tasks
                      WHERE status = 'pending' AND not_before IS NOT NULL AND not_before <= (SELECT now FROM clock)
                      ORDER BY not_before LIMIT $1)
                 ) AS due
                 ORDER BY due_at, id LIMIT $1"
            )),
            // $1 limit. The batch's attempts, handoffs and reopenings go in the
            // same statement (no foreign key cascades to attempts and handoffs:
            // migration 0004); the command tag counts the tasks.
            purge_expired: Sql::from(format!(
                // `id = ANY(ARRAY(…))`, not a join: the batch is an InitPlan
                // that drives index lookups even in a generic plan, where
                // `LIMIT $1` is only estimated (a join then hashed the whole table).
                "WITH expired AS MATERIALIZED (
                     SELECT id FROM {s}.tasks
                     WHERE status IN ('completed', 'failed', 'cancelled')
                       AND expires_at <= (SELECT {s}.store_clock())
                     ORDER BY expires_at LIMIT $1
                     FOR UPDATE SKIP LOCKED),
                 purged_reopenings AS (
                     DELETE FROM {s}.reopenings WHERE task_id = ANY (ARRAY(SELECT id FROM expired))),
                 purged_attempts AS (
                     DELETE FROM {s}.attempts WHERE task_id = ANY (ARRAY(SELECT id FROM expired))),
                 purged_handoffs AS (
                     DELETE FROM {s}.handoffs WHERE task_id = ANY (ARRAY(SELECT id FROM expired))),
                 purged_effects AS (
                     DELETE FROM {s}.effects WHERE task_id = ANY (ARRAY(SELECT id FROM expired)))
                 DELETE FROM {s}.tasks
                 WHERE id = ANY (ARRAY(SELECT id FROM expired))"
            )),
            // $1 limit. With each handoff its task's version (for the
            // message's stamp), read but not locked: claims go on meanwhile.
            claim_handoffs: Sql::from(format!(
                "SELECT h.id, h.task_id, (SELECT t.version FROM {s}.tasks AS t WHERE t.id = h.task_id)
                 FROM {s}.handoffs AS h WHERE h.published_at IS NULL
                 ORDER BY h.id LIMIT $1 FOR UPDATE OF h SKIP LOCKED"
            )),
            // $1 handoff ids.
            mark_published: Sql::from(format!(
                "UPDATE {s}.handoffs SET published_at = {s}.store_clock() WHERE id = ANY($1) AND published_at IS NULL"
            )),
            // $1 ids, $2 attempt ids (same order), $3 lease interval, $4 worker,
            // $5/$6 the stop reasons. `claim` for every row of the batch at
            // once: each row is taken or exhausted by the same per-row SET and
            // WHERE; rows not written come back as the statement's snapshot.
            claim_many: Sql::from(format!(
                "WITH {locked_all_attempt},
                req AS (SELECT r.rid, r.rattempt FROM unnest($1::uuid[], $2::uuid[]) AS r(rid, rattempt)),
                claimed AS (
                    UPDATE {s}.tasks AS t
                    {}
                    FROM req
                    WHERE t.id = req.rid
                      AND t.id = ANY(ARRAY(SELECT id FROM locked_all))
                      AND {claim_available} AND {unlimited}
                    RETURNING true AS written, {cols}, {s}.store_clock() AS store_now
                ),
                {}
                SELECT * FROM claimed
                UNION ALL
                SELECT false, {cols}, {s}.store_clock() FROM {s}.tasks
                WHERE id = ANY($1) AND id NOT IN (SELECT id FROM claimed)",
                claim_set("req.rattempt"),
                moved("locked_all")
            )),
            // $1 limit, $2 attempt ids (one per place in the answer), $3 lease
            // interval, $4 worker, $5/$6 the stop reasons, $7 operations, $8
            // scopes (empty: any). The store as the queue: the tasks that need
            // a worker, oldest due first, each branch an index range scan in due
            // order (`tasks_unclaimed`, `tasks_pending_backoff`,
            // `tasks_running_lease`) that locks its rows and skips the ones
            // another caller holds, so no two callers get one task and none
            // waits for another. Up to $1 per branch are locked, the $1 due
            // first are taken (the rest are let go when the statement ends),
            // each by `claim`'s own SET and WHERE: taken, or failed when its
            // budget is spent; the replaced attempt moves to the journal.
            //
            // While a task naming a limit is unfinished (`limited`: one step
            // into `tasks_limited_unfinished`), the statement takes nothing
            // and answers one row with a NULL id and `limited` true: the
            // caller then decides limits and fairness (`ops::limits`). Every
            // other answer's rows carry `limited` false.
            claim_next: Sql::from(format!(
                "WITH clock AS MATERIALIZED (
                    SELECT {s}.store_clock() AS now,
                           EXISTS (SELECT 1 FROM {s}.tasks AS l
                                   WHERE l.status IN ('pending', 'running')
                                     AND (l.concurrency_key IS NOT NULL OR l.rate_bucket IS NOT NULL)) AS limited),
                fresh AS MATERIALIZED (
                    SELECT id, version, {ATTEMPT_COLUMNS}, created_at AS due_at FROM {s}.tasks AS t
                    WHERE t.status = 'pending' AND t.version = 0 AND t.not_before IS NULL AND {wanted}
                      AND {unlimited} AND NOT (SELECT limited FROM clock)
                    ORDER BY t.created_at, t.id LIMIT $1
                    FOR NO KEY UPDATE SKIP LOCKED),
                waiting AS MATERIALIZED (
                    SELECT id, version, {ATTEMPT_COLUMNS}, not_before AS due_at FROM {s}.tasks AS t
                    WHERE t.status = 'pending' AND t.not_before IS NOT NULL
                      AND t.not_before <= (SELECT now FROM clock) AND {wanted}
                      AND {unlimited} AND NOT (SELECT limited FROM clock)
                    ORDER BY t.not_before LIMIT $1
                    FOR NO KEY UPDATE SKIP LOCKED),
                expired AS MATERIALIZED (
                    SELECT id, version, {ATTEMPT_COLUMNS}, lease_until AS due_at FROM {s}.tasks AS t
                    WHERE t.status = 'running' AND t.lease_until <= (SELECT now FROM clock) AND {wanted}
                      AND {unlimited} AND NOT (SELECT limited FROM clock)
                    ORDER BY t.lease_until LIMIT $1
                    FOR NO KEY UPDATE SKIP LOCKED),
                picked AS MATERIALIZED (
                    SELECT p.*, row_number() OVER (ORDER BY p.due_at, p.id) AS n
                    FROM (SELECT * FROM fresh UNION ALL SELECT * FROM waiting UNION ALL SELECT * FROM expired) AS p
                    ORDER BY p.due_at, p.id LIMIT $1),
                claimed AS (
                    UPDATE {s}.tasks AS t
                    {}
                    FROM picked AS p
                    WHERE t.id = p.id AND {claim_available}
                    RETURNING {t_cols}, p.n
                ),
                {}
                SELECT c.*, k.limited FROM (SELECT limited FROM clock) AS k
                LEFT JOIN claimed AS c ON true ORDER BY c.n",
                claim_set("($2::uuid[])[p.n]"),
                moved("picked"),
            )),
            // $1 ids, $2 versions, $4 attempt ids (same order), $3 extension. `renew` for
            // every lease of the batch, each row guarded on its own, every row
            // locked first in id order.
            renew_many: Sql::from(format!(
                "WITH {locked_all},
                req AS (SELECT r.rid, r.rversion, r.rattempt
                        FROM unnest($1::uuid[], $2::int8[], $4::uuid[]) AS r(rid, rversion, rattempt))
                UPDATE {s}.tasks AS t SET lease_until = {s}.store_clock() + $3
                FROM req
                WHERE t.id = req.rid AND t.id = ANY(ARRAY(SELECT id FROM locked_all))
                  AND t.version = req.rversion AND t.attempt_id = req.rattempt
                  AND t.status = 'running' AND t.lease_until > {s}.store_clock()
                RETURNING t.id, t.lease_until"
            )),
            complete_many: Sql::from(complete_many(true)),
            complete_many_current: Sql::from(complete_many(false)),
            // $1 ids, $2 versions (same order). The rows of a batch, the
            // store clock and each lease's recorded attempt (as
            // `read_lease`): what refused writes are classified from.
            read_many: Sql::from(format!(
                "SELECT {t_cols}, {s}.store_clock() AS store_now, {recorded_attempt} AS recorded_attempt
                 FROM unnest($1::uuid[], $2::int8[]) AS r(rid, rversion)
                 JOIN {s}.tasks AS t ON t.id = r.rid",
                recorded_attempt = recorded_attempt("r.rversion"),
            )),
            // $1 id, $2 by, $3 reason, $4 whether $5..$11 are a new policy
            // (max_attempts, initial_backoff_ns, max_backoff_ns, multiplier,
            // jitter, deadline_ns, on_ambiguous) or the stored one stays, $12
            // max_attempts over either (NULL: none). The retention restarts
            // as it was submitted: the window since the last reopening.
            // `rules::reopen` and `rules::reopened` in one statement: the row
            // locked first (its status then is the reopening's `from`), the
            // guard on the newest row, one clock reading for the new budget,
            // the deadline and the retention; the reopening record and a fresh
            // handoff (so the dispatcher publishes the task again) written by
            // the same statement. Intervals are whole microseconds (no days
            // part, so no time zone's daylight saving moves them).
            reopen: Sql::from(format!(
                "WITH locked AS MATERIALIZED (SELECT id, status FROM {s}.tasks WHERE id = $1 FOR NO KEY UPDATE),
                reopened AS (
                    UPDATE {s}.tasks AS t
                    SET (status, lease_until, not_before, finished_at, budget_base, budget_started_at,
                         expires_at, reopen_count, max_attempts, initial_backoff_ns, max_backoff_ns,
                         multiplier, jitter, deadline_ns, on_ambiguous, deadline_at) = (
                        SELECT 'pending', NULL::timestamptz, c.now, NULL::timestamptz, t.version, c.now,
                               c.now + interval '1 microsecond'
                                   * ((extract(epoch FROM t.expires_at) - extract(epoch FROM t.budget_started_at))
                                      * 1000000)::float8,
                               t.reopen_count + 1,
                               p.max_attempts, p.initial_backoff_ns, p.max_backoff_ns, p.multiplier, p.jitter,
                               p.deadline_ns, p.on_ambiguous,
                               c.now + interval '1 microsecond' * (p.deadline_ns / 1000)::float8
                        FROM (SELECT {s}.store_clock() AS now OFFSET 0) AS c,
                             (SELECT coalesce($12, CASE WHEN $4 THEN $5 ELSE t.max_attempts END) AS max_attempts,
                                     CASE WHEN $4 THEN $6 ELSE t.initial_backoff_ns END AS initial_backoff_ns,
                                     CASE WHEN $4 THEN $7 ELSE t.max_backoff_ns END AS max_backoff_ns,
                                     CASE WHEN $4 THEN $8 ELSE t.multiplier END AS multiplier,
                                     CASE WHEN $4 THEN $9 ELSE t.jitter END AS jitter,
                                     CASE WHEN $4 THEN $10 ELSE t.deadline_ns END AS deadline_ns,
                                     CASE WHEN $4 THEN $11 ELSE t.on_ambiguous END AS on_ambiguous) AS p
                    )
                    WHERE t.id = (SELECT id FROM locked) AND t.status IN ('failed', 'cancelled')
                    RETURNING {cols}, t.reopen_count, t.handoff
                ),
                recorded AS (
                    INSERT INTO {s}.reopenings (task_id, number, at, by, reason, from_status, version)
                    SELECT r.id, r.reopen_count, r.budget_started_at, $2, $3, (SELECT status FROM locked), r.version
                    FROM reopened AS r
                ),
                handoff AS (
                    INSERT INTO {s}.handoffs (task_id, created_at) SELECT id, budget_started_at FROM reopened
                    WHERE handoff
                )
                SELECT {cols} FROM reopened"
            )),
            // $1 ids. A fresh unpublished handoff for each task still pending
            // that goes out through the outbox.
            redispatch: Sql::from(format!(
                "INSERT INTO {s}.handoffs (task_id, created_at)
                 SELECT id, {s}.store_clock() FROM {s}.tasks WHERE id = ANY($1) AND status = 'pending' AND handoff"
            )),
            list: (0..ListShape::COUNT)
                .map(|i| Sql::from(list_sql(s, ListShape::from_index(i))))
                .collect(),
            // Every task is counted: one index-only range scan of
            // `tasks_status_id` per status, so every entry of that index is
            // read once (whatever the heap's size; the planner would pick a
            // sequential scan of a small heap for a plain GROUP BY).
            counts: Sql::from(format!(
                "SELECT st.status, (SELECT count(*) FROM {s}.tasks AS t WHERE t.status = st.status) AS n
                 FROM (VALUES ('pending'), ('running'), ('completed'), ('failed'), ('cancelled')) AS st(status)"
            )),
            // $1 scope: an index-only scan of that scope in `tasks_scope_id`.
            counts_scope: Sql::from(format!("SELECT status, count(*) AS n FROM {s}.tasks WHERE scope = $1 GROUP BY status")),
            // $1 cap. Each status counted up to the cap: one index-only range
            // scan of `tasks_status_id` per status, stopped after `cap` entries.
            counts_up_to: Sql::from(format!(
                "SELECT st.status, (SELECT count(*) FROM (SELECT 1 FROM {s}.tasks AS t WHERE t.status = st.status LIMIT $1) AS c) AS n
                 FROM (VALUES ('pending'), ('running'), ('completed'), ('failed'), ('cancelled')) AS st(status)"
            )),
            // $1 scope, $2 cap. The scope's newest `cap` tasks by status: one
            // index-only scan of `tasks_scope_id` (which includes the status),
            // stopped after `cap` entries; exact when the scope has fewer.
            counts_up_to_scope: Sql::from(format!(
                "SELECT status, count(*) AS n FROM (SELECT status FROM {s}.tasks WHERE scope = $1 ORDER BY id DESC LIMIT $2) AS c
                 GROUP BY status"
            )),
            // $1 id. The task and its attempts, reopenings, handoffs and effects in one
            // row (one snapshot): each child table as arrays, oldest first.
            story: Sql::from(format!(
                "SELECT {cols}, a.*, r.*, h.*, e.*
                 FROM {s}.tasks AS t
                 CROSS JOIN LATERAL (
                     SELECT array_agg(x.id ORDER BY x.number) AS a_id,
                            array_agg(x.number ORDER BY x.number) AS a_number,
                            array_agg(x.worker ORDER BY x.number) AS a_worker,
                            array_agg(x.started_at ORDER BY x.number) AS a_started_at,
                            array_agg(x.finished_at ORDER BY x.number) AS a_finished_at,
                            array_agg(x.outcome ORDER BY x.number) AS a_outcome,
                            array_agg(x.operation_id ORDER BY x.number) AS a_operation_id,
                            array_agg(x.error ORDER BY x.number) AS a_error
                     FROM {} AS x) AS a
                 CROSS JOIN LATERAL (
                     SELECT array_agg(x.number ORDER BY x.number) AS r_number,
                            array_agg(x.at ORDER BY x.number) AS r_at,
                            array_agg(x.by ORDER BY x.number) AS r_by,
                            array_agg(x.reason ORDER BY x.number) AS r_reason,
                            array_agg(x.from_status ORDER BY x.number) AS r_from,
                            array_agg(x.version ORDER BY x.number) AS r_version
                     FROM {s}.reopenings AS x WHERE x.task_id = t.id) AS r
                 CROSS JOIN LATERAL (
                     SELECT array_agg(x.created_at ORDER BY x.id) AS h_created_at,
                            array_agg(x.published_at ORDER BY x.id) AS h_published_at
                     FROM {s}.handoffs AS x WHERE x.task_id = t.id) AS h
                 CROSS JOIN LATERAL (
                     SELECT array_agg(x.name ORDER BY x.name) AS e_name,
                            array_agg(x.state ORDER BY x.name) AS e_state,
                            array_agg(x.version ORDER BY x.name) AS e_version,
                            array_agg(x.attempt ORDER BY x.name) AS e_attempt,
                            array_agg(x.reference ORDER BY x.name) AS e_reference,
                            array_agg(x.error ORDER BY x.name) AS e_error,
                            array_agg(x.ambiguous ORDER BY x.name) AS e_ambiguous,
                            array_agg(x.created_at ORDER BY x.name) AS e_created_at,
                            array_agg(x.intended_at ORDER BY x.name) AS e_intended_at,
                            array_agg(x.settled_at ORDER BY x.name) AS e_settled_at
                     FROM {s}.effects AS x WHERE x.task_id = t.id) AS e
                 WHERE t.id = $1",
                journal("t.id")
            )),
            // $1 older than (interval), $2 limit. Never-claimed pending tasks
            // from the partial index `tasks_unclaimed`, oldest first, whose
            // last publication (or submission, when never published) is older
            // than the cutoff: submitted and last reopened before it, and no handoff published
            // since (an anti-join on `handoffs_pkey`, keyed by task). The clock is read once
            // (an InitPlan).
            schema_version: Sql::from(format!(
                "SELECT max(version) FROM {s}.{} WHERE success",
                super::migrate::HISTORY_TABLE
            )),
            stranded: Sql::from(format!(
                "WITH clock AS MATERIALIZED (SELECT {s}.store_clock() - $1 AS cutoff)
                 SELECT {SUMMARY_COLUMNS} FROM {s}.tasks AS t
                 WHERE t.status = 'pending' AND t.version = 0
                   AND t.created_at < (SELECT cutoff FROM clock)
                   AND (t.not_before IS NULL OR t.not_before < (SELECT cutoff FROM clock))
                   AND NOT EXISTS (SELECT 1 FROM {s}.handoffs AS h
                                   WHERE h.task_id = t.id AND h.published_at >= (SELECT cutoff FROM clock))
                 ORDER BY t.created_at, t.id LIMIT $2"
            )),
            // Each operation's queue at the store's clock: `rules::due_since`
            // in SQL. Only the pending and running entries of
            // `tasks_status_id` are read, never the finished tasks kept for
            // their retention.
            depth: Sql::from(format!(
                "WITH clock AS MATERIALIZED (SELECT {s}.store_clock() AS now),
                      live AS (
                          SELECT t.operation, t.status,
                                 CASE WHEN t.status = 'pending' AND t.not_before IS NULL THEN t.created_at
                                      WHEN t.status = 'pending' AND t.not_before <= c.now THEN t.not_before
                                      WHEN t.status = 'running' AND t.lease_until <= c.now THEN t.lease_until
                                 END AS due_since
                          FROM {s}.tasks AS t, clock AS c
                          WHERE t.status IN ('pending', 'running'))
                 SELECT operation,
                        count(*) FILTER (WHERE due_since IS NOT NULL) AS due,
                        count(*) FILTER (WHERE due_since IS NULL AND status = 'pending') AS scheduled,
                        count(*) FILTER (WHERE due_since IS NULL AND status = 'running') AS running,
                        min(due_since) AS oldest_due_at
                 FROM live GROUP BY operation ORDER BY operation"
            )),
            limits: Limits::new(s, &wanted.replace("$7", "$2").replace("$8", "$3")),
        }
    }
}
