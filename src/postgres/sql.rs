//! The SQL of every operation, rendered once per store for its schema.
//!
//! Each happy-path operation is one statement: a data-modifying CTE chain that
//! updates the task row, records the attempt and returns the new row. Times
//! come only from `<schema>.store_clock()` (`clock_timestamp()`), called in the
//! `WHERE` and `SET` of the row being written so that it is evaluated after
//! the row lock is held (see the [module documentation](super)).

/// The task columns, in the order [`super::row::task`] reads them by name.
const TASK_COLUMNS: &str = "id, scope, operation, request_key, input_hash, payload, status, version, \
     max_attempts, initial_backoff_ns, max_backoff_ns, multiplier, jitter, deadline_ns, on_ambiguous, \
     acceptance, lease_until, not_before, response, last_error, created_at, finished_at, expires_at, \
     budget_base, budget_started_at";

/// The statements of one store, for one schema.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) submit: String,
    pub(crate) get: String,
    pub(crate) read: String,
    pub(crate) find: String,
    pub(crate) claim: String,
    pub(crate) renew: String,
    pub(crate) complete: String,
    pub(crate) fail: String,
    pub(crate) release: String,
    pub(crate) cancel: String,
    pub(crate) record_operation: String,
    pub(crate) attempts: String,
    pub(crate) due: String,
    pub(crate) purge_expired: String,
    pub(crate) claim_handoffs: String,
    pub(crate) mark_published: String,
    pub(crate) claim_many: String,
    pub(crate) complete_many: String,
    pub(crate) read_many: String,
    pub(crate) retry: String,
    pub(crate) redispatch: String,
    /// [`list_sql`] for every [`ListShape`], by [`ListShape::index`].
    pub(crate) list: Vec<String>,
    pub(crate) counts: String,
    pub(crate) counts_scope: String,
    pub(crate) story: String,
    pub(crate) stranded: String,
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
        "SELECT {TASK_COLUMNS} FROM {s}.tasks WHERE {} ORDER BY id {order} LIMIT {limit}",
        conditions.join(" AND ")
    )
}

impl Statements {
    /// Every statement by operation name, for `EXPLAIN` and review.
    pub(crate) fn all(&self) -> Vec<(&'static str, &str)> {
        vec![
            ("submit", &self.submit),
            ("get", &self.get),
            ("read", &self.read),
            ("find", &self.find),
            ("claim", &self.claim),
            ("renew", &self.renew),
            ("complete", &self.complete),
            ("fail", &self.fail),
            ("release", &self.release),
            ("cancel", &self.cancel),
            ("record_operation", &self.record_operation),
            ("attempts", &self.attempts),
            ("due", &self.due),
            ("purge_expired", &self.purge_expired),
            ("claim_handoffs", &self.claim_handoffs),
            ("mark_published", &self.mark_published),
            ("claim_many", &self.claim_many),
            ("complete_many", &self.complete_many),
            ("read_many", &self.read_many),
            ("retry", &self.retry),
            ("redispatch", &self.redispatch),
            ("list", self.list_of(ListShape::default())),
            (
                "list_oldest",
                self.list_of(ListShape {
                    oldest_first: true,
                    ..ListShape::default()
                }),
            ),
            (
                "list_status",
                self.list_of(ListShape {
                    status: true,
                    ..ListShape::default()
                }),
            ),
            (
                "list_scope",
                self.list_of(ListShape {
                    scope: true,
                    ..ListShape::default()
                }),
            ),
            (
                "list_operation",
                self.list_of(ListShape {
                    operation: true,
                    ..ListShape::default()
                }),
            ),
            (
                "list_created",
                self.list_of(ListShape {
                    created_after: true,
                    created_before: true,
                    ..ListShape::default()
                }),
            ),
            ("counts", &self.counts),
            ("counts_scope", &self.counts_scope),
            ("story", &self.story),
            ("stranded", &self.stranded),
        ]
    }

    /// The listing statement of `shape`.
    pub(crate) fn list_of(&self, shape: ListShape) -> &str {
        &self.list[shape.index()]
    }

    /// Renders every statement for the quoted schema name `s`.
    pub(crate) fn new(s: &str) -> Self {
        let cols = TASK_COLUMNS;
        // Lock the row first (an InitPlan that the write's `id = (SELECT id
        // FROM locked)` needs before it reads a row), so the guard and its
        // clock are evaluated after the lock is held — also when the previous
        // holder only locked the row and changed nothing (no recheck then).
        let locked =
            format!("locked AS MATERIALIZED (SELECT id FROM {s}.tasks WHERE id = $1 FOR NO KEY UPDATE)");
        // Fragments the single and the batch forms share, so both decide alike.
        // A claim's take-or-exhaust, from one clock reading after the lock
        // ($3 lease interval, $5/$6 the stop reasons):
        let claim_set = format!(
            "SET (version, status, lease_until, not_before, finished_at, last_error) = (
                        SELECT CASE WHEN d.take THEN t.version + 1 ELSE t.version END,
                               CASE WHEN d.take THEN 'running' ELSE 'failed' END,
                               CASE WHEN d.take THEN d.now + $3 END,
                               NULL::timestamptz,
                               CASE WHEN d.take THEN NULL ELSE d.now END,
                               CASE WHEN d.take THEN t.last_error
                                    WHEN t.version - t.budget_base >= t.max_attempts THEN $5 ELSE $6 END
                        FROM (SELECT c.now, t.version - t.budget_base < t.max_attempts
                                            AND (t.deadline_at IS NULL OR t.deadline_at > c.now) AS take
                              FROM (SELECT {s}.store_clock() AS now OFFSET 0) AS c) AS d
                    )"
        );
        // A row a claim may take: pending past its backoff, or its lease expired.
        let claim_available = format!(
            "((t.status = 'pending' AND (t.not_before IS NULL OR t.not_before <= {s}.store_clock()))
                        OR (t.status = 'running' AND t.lease_until <= {s}.store_clock()))"
        );
        // The previous attempt of a taken or exhausted row ends `expired`.
        let claim_expired = format!(
            "expired AS (
                    UPDATE {s}.attempts AS a SET finished_at = {s}.store_clock(), outcome = 'expired'
                    FROM claimed AS c
                    WHERE a.task_id = c.id AND a.finished_at IS NULL
                      AND a.number = CASE WHEN c.status = 'running' THEN c.version - 1 ELSE c.version END
                )"
        );
        // `rules::accept` for the lease version `v`: the current assignment
        // with a live lease, or, for a first-valid-answer task, any version
        // granted so far while the task is not terminal; never a second response.
        let accept = |v: &str| {
            format!(
                "response IS NULL
                      AND ((version = {v} AND status = 'running' AND lease_until > {s}.store_clock())
                        OR (acceptance = 'first_valid_answer' AND {v} BETWEEN budget_base + 1 AND version
                            AND status IN ('pending', 'running')))"
            )
        };
        let (accept_single, accept_many) = (accept("$2"), accept("req.rversion"));
        // The answering attempt (lease version `v`) ends `completed` (also if
        // closed as expired at a takeover); a still-running newer one `overtaken`.
        let finish = |v: &str| {
            format!(
                "finished AS (
                    UPDATE {s}.attempts AS a
                    SET finished_at = d.finished_at,
                        outcome = CASE WHEN a.number = {v} THEN 'completed' ELSE 'overtaken' END
                    FROM done AS d
                    WHERE a.task_id = d.id
                      AND (a.number = {v} OR (a.number = d.version AND a.finished_at IS NULL))
                )"
            )
        };
        let (finish_single, finish_many) = (finish("$2"), finish("d.rversion"));
        // The batch form: every row of the batch locked first, in id order (so
        // two batches sharing tasks never deadlock), before the write reads any
        // of them; `id = ANY(ARRAY(SELECT id FROM locked_all))` is an InitPlan,
        // as the single form's `= (SELECT id FROM locked)` is.
        let locked_all = format!(
            "locked_all AS MATERIALIZED (SELECT id FROM {s}.tasks WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE)"
        );
        Self {
            // $1 id, $2 scope, $3 operation, $4 key, $5 input hash, $6 payload,
            // $7..$13 policy, $14 deadline interval, $15 retention interval, $16 acceptance rule.
            // ON CONFLICT DO NOTHING never raises a unique violation; the second
            // branch returns the existing task (a racing insert that committed
            // after this statement's snapshot is read by the caller once more).
            submit: format!(
                "WITH created AS (
                    INSERT INTO {s}.tasks AS t (id, scope, operation, request_key, input_hash, payload, status,
                        version, max_attempts, initial_backoff_ns, max_backoff_ns, multiplier, jitter,
                        deadline_ns, on_ambiguous, deadline_at, created_at, expires_at, acceptance,
                        budget_started_at)
                    SELECT $1, $2, $3, $4, $5, $6, 'pending', 0, $7, $8, $9, $10, $11, $12, $13,
                           c.now + $14, c.now, c.now + $15, $16, c.now
                    FROM (SELECT {s}.store_clock() AS now OFFSET 0) AS c
                    ON CONFLICT (scope, operation, request_key) DO NOTHING
                    RETURNING {cols}
                ),
                handoff AS (
                    INSERT INTO {s}.handoffs (task_id, created_at) SELECT id, created_at FROM created
                )
                SELECT true AS created, {cols} FROM created
                UNION ALL
                SELECT false, {cols} FROM {s}.tasks
                WHERE scope = $2 AND operation = $3 AND request_key = $4
                  AND NOT EXISTS (SELECT 1 FROM created)"
            ),
            get: format!("SELECT {cols} FROM {s}.tasks WHERE id = $1"),
            // The row and the store clock in one read: what a refused write is classified from.
            read: format!("SELECT {cols}, {s}.store_clock() AS store_now FROM {s}.tasks WHERE id = $1"),
            find: format!(
                "SELECT {cols} FROM {s}.tasks WHERE scope = $1 AND operation = $2 AND request_key = $3"
            ),
            // $1 id, $2 attempt id, $3 lease interval, $4 worker, $5/$6 the stop reasons.
            // The WHERE takes the row only if it is available (pending past its
            // backoff, or running with an expired lease); the multi-column SET
            // reads the clock once, after the lock, and decides take or exhaust.
            // Not written: the statement's snapshot of the row, for the caller to classify.
            claim: format!(
                "WITH {locked},
                claimed AS (
                    UPDATE {s}.tasks AS t
                    {claim_set}
                    WHERE t.id = (SELECT id FROM locked)
                      AND {claim_available}
                    RETURNING {cols}
                ),
                {claim_expired},
                started AS (
                    INSERT INTO {s}.attempts (task_id, number, id, worker, started_at, outcome)
                    SELECT c.id, c.version, $2, $4, c.lease_until - $3, 'running'
                    FROM claimed AS c WHERE c.status = 'running'
                )
                SELECT true AS written, {cols}, {s}.store_clock() AS store_now FROM claimed
                UNION ALL
                SELECT false, {cols}, {s}.store_clock() FROM {s}.tasks
                WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM claimed)"
            ),
            // $1 id, $2 version, $3 extension.
            renew: format!(
                "WITH {locked}
                 UPDATE {s}.tasks SET lease_until = {s}.store_clock() + $3
                 WHERE id = (SELECT id FROM locked) AND version = $2 AND status = 'running' AND lease_until > {s}.store_clock()
                 RETURNING lease_until"
            ),
            // $1 id, $2 version, $3 response. The textbook guarded UPDATE, with the
            // attempt's outcome written by the same statement. The guard is
            // `rules::accept`: the current assignment with a live lease, or, for a
            // first-valid-answer task, any assignment granted so far while the
            // task is not terminal. An earlier attempt's saved answer ends the
            // current attempt as `overtaken`.
            complete: format!(
                "WITH {locked},
                done AS (
                    UPDATE {s}.tasks
                    SET status = 'completed', response = $3, lease_until = NULL, not_before = NULL,
                        finished_at = {s}.store_clock()
                    WHERE id = (SELECT id FROM locked)
                      AND {accept_single}
                    RETURNING {cols}
                ),
                {finish_single}
                SELECT {cols} FROM done"
            ),
            // $1 id, $2 version, $3 stop message (NULL: the policy allows a retry),
            // $4 failure message, $5 deadline-exhausted message, $6 retry delay, $7 attempt outcome.
            fail: format!(
                "WITH {locked},
                failed AS (
                    UPDATE {s}.tasks AS t
                    SET (status, lease_until, not_before, finished_at, last_error) = (
                        SELECT CASE WHEN d.stop THEN 'failed' ELSE 'pending' END,
                               NULL::timestamptz,
                               CASE WHEN NOT d.stop THEN d.retry_at END,
                               CASE WHEN d.stop THEN d.now END,
                               CASE WHEN $3::text IS NOT NULL THEN $3::text
                                    WHEN d.stop THEN $5 ELSE $4 END
                        FROM (SELECT c.now, c.now + $6 AS retry_at,
                                     $3::text IS NOT NULL
                                     OR (t.deadline_at IS NOT NULL AND c.now + $6 >= t.deadline_at) AS stop
                              FROM (SELECT {s}.store_clock() AS now OFFSET 0) AS c) AS d
                    )
                    WHERE t.id = (SELECT id FROM locked) AND t.version = $2 AND t.status = 'running'
                      AND t.lease_until > {s}.store_clock()
                    RETURNING {cols}
                ),
                finished AS (
                    UPDATE {s}.attempts AS a SET finished_at = {s}.store_clock(), outcome = $7, error = $4
                    FROM failed AS f WHERE a.task_id = f.id AND a.number = f.version
                )
                SELECT {cols} FROM failed"
            ),
            // $1 id, $2 version.
            release: format!(
                "WITH {locked},
                released AS (
                    UPDATE {s}.tasks SET status = 'pending', lease_until = NULL, not_before = NULL
                    WHERE id = (SELECT id FROM locked) AND version = $2 AND status = 'running' AND lease_until > {s}.store_clock()
                    RETURNING id, version
                ),
                finished AS (
                    UPDATE {s}.attempts AS a SET finished_at = {s}.store_clock(), outcome = 'released'
                    FROM released AS r WHERE a.task_id = r.id AND a.number = r.version
                )
                SELECT id FROM released"
            ),
            // $1 id, $2 reason.
            cancel: format!(
                "WITH cancelled AS (
                    UPDATE {s}.tasks
                    SET status = 'cancelled', lease_until = NULL, not_before = NULL,
                        finished_at = {s}.store_clock(), last_error = $2
                    WHERE id = $1 AND status IN ('pending', 'running')
                    RETURNING {cols}
                ),
                finished AS (
                    UPDATE {s}.attempts AS a SET finished_at = c.finished_at, outcome = 'cancelled'
                    FROM cancelled AS c
                    WHERE a.task_id = c.id AND a.number = c.version AND a.finished_at IS NULL
                )
                SELECT {cols} FROM cancelled"
            ),
            // $1 id, $2 version, $3 operation id. FOR SHARE holds the task row
            // (a concurrent completion or takeover waits) while the attempt is written.
            record_operation: format!(
                "WITH locked AS MATERIALIZED (SELECT id FROM {s}.tasks WHERE id = $1 FOR SHARE),
                holder AS (
                    SELECT id FROM {s}.tasks
                    WHERE id = (SELECT id FROM locked) AND version = $2 AND status = 'running' AND lease_until > {s}.store_clock()
                    FOR SHARE
                )
                UPDATE {s}.attempts AS a SET operation_id = $3
                FROM holder AS h WHERE a.task_id = h.id AND a.number = $2
                RETURNING a.number"
            ),
            attempts: format!(
                "SELECT id, task_id, number, worker, started_at, finished_at, outcome, operation_id, error
                 FROM {s}.attempts WHERE task_id = $1 ORDER BY number"
            ),
            // $1 limit. The clock is read once (an InitPlan), so it can bound
            // the partial-index range scans; each branch stops after $1 rows.
            due: format!(
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
            ),
            // $1 limit. The batch's attempts, handoffs and reopenings go in the
            // same statement (no foreign key cascades to attempts and handoffs:
            // migration 0004); the command tag counts the tasks.
            purge_expired: format!(
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
                     DELETE FROM {s}.handoffs WHERE task_id = ANY (ARRAY(SELECT id FROM expired)))
                 DELETE FROM {s}.tasks
                 WHERE id = ANY (ARRAY(SELECT id FROM expired))"
            ),
            // $1 limit.
            claim_handoffs: format!(
                "SELECT id, task_id FROM {s}.handoffs WHERE published_at IS NULL
                 ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED"
            ),
            // $1 handoff ids.
            mark_published: format!(
                "UPDATE {s}.handoffs SET published_at = {s}.store_clock() WHERE id = ANY($1)"
            ),
            // $1 ids, $2 attempt ids (same order), $3 lease interval, $4 worker,
            // $5/$6 the stop reasons. `claim` for every row of the batch at
            // once: each row is taken or exhausted by the same per-row SET and
            // WHERE; rows not written come back as the statement's snapshot.
            claim_many: format!(
                "WITH {locked_all},
                req AS (SELECT r.rid, r.rattempt FROM unnest($1::uuid[], $2::uuid[]) AS r(rid, rattempt)),
                claimed AS (
                    UPDATE {s}.tasks AS t
                    {claim_set}
                    FROM req
                    WHERE t.id = req.rid
                      AND t.id = ANY(ARRAY(SELECT id FROM locked_all))
                      AND {claim_available}
                    RETURNING {cols}, req.rattempt
                ),
                {claim_expired},
                started AS (
                    INSERT INTO {s}.attempts (task_id, number, id, worker, started_at, outcome)
                    SELECT c.id, c.version, c.rattempt, $4, c.lease_until - $3, 'running'
                    FROM claimed AS c WHERE c.status = 'running'
                )
                SELECT true AS written, {cols}, {s}.store_clock() AS store_now FROM claimed
                UNION ALL
                SELECT false, {cols}, {s}.store_clock() FROM {s}.tasks
                WHERE id = ANY($1) AND id NOT IN (SELECT id FROM claimed)"
            ),
            // $1 ids, $2 versions, $3 responses (same order). `complete` for
            // every lease of the batch, each row guarded on its own.
            complete_many: format!(
                "WITH {locked_all},
                req AS (SELECT r.rid, r.rversion, r.rresponse
                        FROM unnest($1::uuid[], $2::int8[], $3::bytea[]) AS r(rid, rversion, rresponse)),
                done AS (
                    UPDATE {s}.tasks
                    SET status = 'completed', response = req.rresponse, lease_until = NULL, not_before = NULL,
                        finished_at = {s}.store_clock()
                    FROM req
                    WHERE id = req.rid
                      AND id = ANY(ARRAY(SELECT id FROM locked_all))
                      AND {accept_many}
                    RETURNING {cols}, req.rversion
                ),
                {finish_many}
                SELECT {cols} FROM done"
            ),
            // The rows of a batch and the store clock: what refused writes are classified from.
            read_many: format!("SELECT {cols}, {s}.store_clock() AS store_now FROM {s}.tasks WHERE id = ANY($1)"),
            // $1 id, $2 by, $3 reason, $4 whether $5..$11 are a new policy
            // (max_attempts, initial_backoff_ns, max_backoff_ns, multiplier,
            // jitter, deadline_ns, on_ambiguous) or the stored one stays.
            // `rules::reopen` and `rules::reopened` in one statement: the row
            // locked first (its status then is the reopening's `from`), the
            // guard on the newest row, one clock reading for the new budget,
            // the deadline and the retention; the reopening record and a fresh
            // handoff (so the dispatcher publishes the task again) written by
            // the same statement. Intervals are whole microseconds (no days
            // part, so no time zone's daylight saving moves them).
            retry: format!(
                "WITH locked AS MATERIALIZED (SELECT id, status FROM {s}.tasks WHERE id = $1 FOR NO KEY UPDATE),
                reopened AS (
                    UPDATE {s}.tasks AS t
                    SET (status, lease_until, not_before, finished_at, budget_base, budget_started_at,
                         expires_at, reopen_count, max_attempts, initial_backoff_ns, max_backoff_ns,
                         multiplier, jitter, deadline_ns, on_ambiguous, deadline_at) = (
                        SELECT 'pending', NULL::timestamptz, c.now, NULL::timestamptz, t.version, c.now,
                               c.now + interval '1 microsecond'
                                   * ((extract(epoch FROM t.expires_at) - extract(epoch FROM t.created_at))
                                      * 1000000)::float8,
                               t.reopen_count + 1,
                               p.max_attempts, p.initial_backoff_ns, p.max_backoff_ns, p.multiplier, p.jitter,
                               p.deadline_ns, p.on_ambiguous,
                               c.now + interval '1 microsecond' * (p.deadline_ns / 1000)::float8
                        FROM (SELECT {s}.store_clock() AS now OFFSET 0) AS c,
                             (SELECT CASE WHEN $4 THEN $5 ELSE t.max_attempts END AS max_attempts,
                                     CASE WHEN $4 THEN $6 ELSE t.initial_backoff_ns END AS initial_backoff_ns,
                                     CASE WHEN $4 THEN $7 ELSE t.max_backoff_ns END AS max_backoff_ns,
                                     CASE WHEN $4 THEN $8 ELSE t.multiplier END AS multiplier,
                                     CASE WHEN $4 THEN $9 ELSE t.jitter END AS jitter,
                                     CASE WHEN $4 THEN $10 ELSE t.deadline_ns END AS deadline_ns,
                                     CASE WHEN $4 THEN $11 ELSE t.on_ambiguous END AS on_ambiguous) AS p
                    )
                    WHERE t.id = (SELECT id FROM locked) AND t.status IN ('failed', 'cancelled')
                    RETURNING {cols}, t.reopen_count
                ),
                recorded AS (
                    INSERT INTO {s}.reopenings (task_id, number, at, by, reason, from_status, version)
                    SELECT r.id, r.reopen_count, r.budget_started_at, $2, $3, (SELECT status FROM locked), r.version
                    FROM reopened AS r
                ),
                handoff AS (
                    INSERT INTO {s}.handoffs (task_id, created_at) SELECT id, budget_started_at FROM reopened
                )
                SELECT {cols} FROM reopened"
            ),
            // $1 ids. A fresh unpublished handoff for each task still pending.
            redispatch: format!(
                "INSERT INTO {s}.handoffs (task_id, created_at)
                 SELECT id, {s}.store_clock() FROM {s}.tasks WHERE id = ANY($1) AND status = 'pending'"
            ),
            list: (0..ListShape::COUNT)
                .map(|i| list_sql(s, ListShape::from_index(i)))
                .collect(),
            // Every task is counted: one index-only range scan of
            // `tasks_status_id` per status, so every entry of that index is
            // read once (whatever the heap's size; the planner would pick a
            // sequential scan of a small heap for a plain GROUP BY).
            counts: format!(
                "SELECT st.status, (SELECT count(*) FROM {s}.tasks AS t WHERE t.status = st.status) AS n
                 FROM (VALUES ('pending'), ('running'), ('completed'), ('failed'), ('cancelled')) AS st(status)"
            ),
            // $1 scope: an index-only scan of that scope in `tasks_scope_id`.
            counts_scope: format!("SELECT status, count(*) AS n FROM {s}.tasks WHERE scope = $1 GROUP BY status"),
            // $1 id. The task and its attempts, reopenings and handoffs in one
            // row (one snapshot): each child table as arrays, oldest first.
            story: format!(
                "SELECT {cols}, a.*, r.*, h.*
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
                     FROM {s}.attempts AS x WHERE x.task_id = t.id) AS a
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
                 WHERE t.id = $1"
            ),
            // $1 older than (interval), $2 limit. Never-claimed pending tasks
            // from the partial index `tasks_unclaimed`, oldest first, whose
            // last publication (or submission, when never published) is older
            // than the cutoff: submitted before it, and no handoff published
            // since (an anti-join on `handoffs_task`). The clock is read once
            // (an InitPlan).
            stranded: format!(
                "WITH clock AS MATERIALIZED (SELECT {s}.store_clock() - $1 AS cutoff)
                 SELECT {cols} FROM {s}.tasks AS t
                 WHERE t.status = 'pending' AND t.version = 0
                   AND t.created_at < (SELECT cutoff FROM clock)
                   AND NOT EXISTS (SELECT 1 FROM {s}.handoffs AS h
                                   WHERE h.task_id = t.id AND h.published_at >= (SELECT cutoff FROM clock))
                 ORDER BY t.created_at, t.id LIMIT $2"
            ),
        }
    }
}
