//! The statements, one constant each. One file is one database: the table
//! names are fixed (no schema to render them for). Parameters are numbered
//! (`?1`…); each statement says what they are.

/// Every column of a task row, as `row::task` decodes them.
pub(crate) const TASK: &str = "SELECT * FROM tasks WHERE id = ?1";

/// Every column of the tasks whose ids are bound, as many as `{ids}`'s
/// placeholders (`?, ?, …`).
pub(crate) const TASKS: &str = "SELECT * FROM tasks WHERE id IN ({ids})";

/// ?1 scope, ?2 operation, ?3 request key.
pub(crate) const TASK_BY_KEY: &str =
    "SELECT * FROM tasks WHERE scope = ?1 AND operation = ?2 AND request_key = ?3";

/// Whether the task goes out through the outbox (submit's `handoff`).
pub(crate) const TASK_HANDOFF: &str = "SELECT handoff FROM tasks WHERE id = ?1";

/// Every column, in this order; the task's place in its concurrency key's
/// submission order (`key_order`) is one more than the key's last.
pub(crate) const INSERT_TASK: &str = "INSERT INTO tasks (
        id, scope, operation, request_key, input_hash, payload, status, version,
        max_attempts, initial_backoff_ns, max_backoff_ns, multiplier, jitter, deadline_ns, on_ambiguous,
        acceptance, budget_base, budget_started_at, lease_until, not_before, response, last_error,
        created_at, finished_at, expires_at, trace_context, handoff,
        concurrency_key, concurrency_limit, rate_bucket, key_order)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20,
            ?21, ?22, ?23, ?24, ?25, ?26, ?27, ?28, ?29, ?30,
            CASE WHEN ?28 IS NULL THEN NULL
                 ELSE (SELECT coalesce(max(key_order), 0) + 1 FROM tasks WHERE concurrency_key = ?28) END)";

/// ?1 id, then the columns a decision changes; ?18 the response (NULL:
/// unchanged — a response is written once, by the completion).
pub(crate) const SAVE_TASK: &str = "UPDATE tasks SET
        status = ?2, version = ?3, max_attempts = ?4, initial_backoff_ns = ?5, max_backoff_ns = ?6,
        multiplier = ?7, jitter = ?8, deadline_ns = ?9, on_ambiguous = ?10, budget_base = ?11,
        budget_started_at = ?12, lease_until = ?13, not_before = ?14, last_error = ?15,
        finished_at = ?16, expires_at = ?17, response = coalesce(?18, response)
    WHERE id = ?1";

/// Rows of (task id, number, attempt id, worker, started at), `{rows}`
/// replaced by their placeholders: the attempts started, running.
pub(crate) const INSERT_ATTEMPTS: &str =
    "INSERT INTO attempts (task_id, number, id, worker, started_at, outcome)
    SELECT column1, column2, column3, column4, column5, 'running' FROM (VALUES {rows})";

/// Rows of (task id, number, finished at, outcome, error): [`FINISH_ATTEMPT`] for many.
pub(crate) const FINISH_ATTEMPTS: &str = "UPDATE attempts
    SET finished_at = v.column3, outcome = v.column4, error = v.column5
    FROM (VALUES {rows}) AS v
    WHERE attempts.task_id = v.column1 AND attempts.number = v.column2 AND attempts.finished_at IS NULL";

/// Rows of (task id, number, finished at): the attempts whose answers were
/// saved, also when a takeover had closed them as expired.
pub(crate) const COMPLETE_ATTEMPTS: &str = "UPDATE attempts
    SET finished_at = v.column3, outcome = 'completed'
    FROM (VALUES {rows}) AS v
    WHERE attempts.task_id = v.column1 AND attempts.number = v.column2";

/// Rows of [`SAVE_TASK`]'s 18 parameters, in its order: [`SAVE_TASK`] for many.
pub(crate) const SAVE_TASKS: &str = "UPDATE tasks SET
        status = v.column2, version = v.column3, max_attempts = v.column4,
        initial_backoff_ns = v.column5, max_backoff_ns = v.column6, multiplier = v.column7,
        jitter = v.column8, deadline_ns = v.column9, on_ambiguous = v.column10,
        budget_base = v.column11, budget_started_at = v.column12, lease_until = v.column13,
        not_before = v.column14, last_error = v.column15, finished_at = v.column16,
        expires_at = v.column17, response = coalesce(v.column18, tasks.response)
    FROM (VALUES {rows}) AS v
    WHERE tasks.id = v.column1";

/// ?1… pairs of (task id, number), `{rows}` replaced by their
/// placeholders: each task's row with `lease_attempt` as in
/// [`TASK_WITH_ATTEMPT`], and the number asked for as `lease_version`.
pub(crate) const TASKS_WITH_ATTEMPTS: &str = "SELECT tasks.*, v.column2 AS lease_version,
        (SELECT a.id FROM attempts a WHERE a.task_id = tasks.id AND a.number = v.column2) AS lease_attempt
    FROM (VALUES {rows}) AS v JOIN tasks ON tasks.id = v.column1";

/// ?1 task id, ?2 number: every column of the task row, and as
/// `lease_attempt` the id of the attempt that holds (or held) that version
/// (which a lease's attempt id must match:
/// [`rules::granted`](crate::backend::rules::granted)): a fenced write's one read.
pub(crate) const TASK_WITH_ATTEMPT: &str = "SELECT tasks.*,
        (SELECT a.id FROM attempts a WHERE a.task_id = tasks.id AND a.number = ?2) AS lease_attempt
    FROM tasks WHERE id = ?1";

/// ?1 task id, ?2 number, ?3 finished at, ?4 outcome, ?5 error: ends the
/// attempt if it is still open.
pub(crate) const FINISH_ATTEMPT: &str = "UPDATE attempts SET finished_at = ?3, outcome = ?4, error = ?5
    WHERE task_id = ?1 AND number = ?2 AND finished_at IS NULL";

/// ?1 task id, ?2 attempt id, ?3 the provider's operation id.
pub(crate) const RECORD_OPERATION: &str =
    "UPDATE attempts SET operation_id = ?3 WHERE task_id = ?1 AND id = ?2";

/// ?1 task id.
pub(crate) const ATTEMPTS: &str = "SELECT * FROM attempts WHERE task_id = ?1 ORDER BY number";

/// ?1 task id.
pub(crate) const REOPENINGS: &str = "SELECT * FROM reopenings WHERE task_id = ?1 ORDER BY number";

/// ?1 task id, ?2 at, ?3 by, ?4 reason, ?5 from status, ?6 version; numbered
/// after the task's last reopening. Returns the number.
pub(crate) const INSERT_REOPENING: &str =
    "INSERT INTO reopenings (task_id, number, at, by, reason, from_status, version)
    SELECT ?1, coalesce(max(number), 0) + 1, ?2, ?3, ?4, ?5, ?6 FROM reopenings WHERE task_id = ?1";

/// ?1 task id, ?2 created at.
pub(crate) const INSERT_HANDOFF: &str = "INSERT INTO handoffs (task_id, created_at) VALUES (?1, ?2)";

/// ?1 task id, ?2 now: a fresh handoff only for a task still pending that goes out through the outbox.
pub(crate) const REDISPATCH: &str = "INSERT INTO handoffs (task_id, created_at)
    SELECT id, ?2 FROM tasks WHERE id = ?1 AND status = 'pending' AND handoff = 1";

/// ?1 task id.
pub(crate) const HANDOFFS: &str =
    "SELECT created_at, published_at FROM handoffs WHERE task_id = ?1 ORDER BY id";

/// ?1 limit: the oldest unpublished handoffs, each with its task's version
/// (NULL for a stray handoff whose task is gone).
pub(crate) const TAKE_HANDOFFS: &str =
    "SELECT h.id, h.task_id, (SELECT t.version FROM tasks AS t WHERE t.id = h.task_id) AS version
    FROM handoffs AS h WHERE h.published_at IS NULL ORDER BY h.id LIMIT ?1";

/// ?1 handoff id, ?2 now.
pub(crate) const MARK_PUBLISHED: &str =
    "UPDATE handoffs SET published_at = ?2 WHERE id = ?1 AND published_at IS NULL";

/// ?1 task id, ?2 name.
pub(crate) const EFFECT: &str = "SELECT * FROM effects WHERE task_id = ?1 AND name = ?2";

/// ?1 task id: the journal by name.
pub(crate) const EFFECTS: &str = "SELECT * FROM effects WHERE task_id = ?1 ORDER BY name";

/// Every column of an effect record, replacing the one read under the same write lock.
pub(crate) const PUT_EFFECT: &str = "INSERT OR REPLACE INTO effects
        (task_id, name, state, version, attempt, reference, error, ambiguous, created_at, intended_at, settled_at)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)";

/// ?1 now, ?2 limit: expired leases and passed backoffs, by when they
/// became due; each branch a range scan of its partial index.
pub(crate) const DUE: &str = "SELECT id FROM (
        SELECT id, due_at FROM (SELECT id, lease_until AS due_at FROM tasks
            WHERE status = 'running' AND lease_until <= ?1 ORDER BY lease_until LIMIT ?2)
        UNION ALL
        SELECT id, due_at FROM (SELECT id, not_before AS due_at FROM tasks
            WHERE status = 'pending' AND not_before IS NOT NULL AND not_before <= ?1 ORDER BY not_before LIMIT ?2))
    ORDER BY due_at, id LIMIT ?2";

/// The tasks that need a worker at ?1, oldest due first, up to ?2 per
/// branch (never claimed, backoff passed or released, lease expired); the
/// caller appends its operation and scope filters to each branch's `WHERE`
/// at `{filter}` and the final `ORDER BY … LIMIT`.
pub(crate) const NEEDING_WORKER: &str = "SELECT id, due_at FROM (
        SELECT id, due_at FROM (SELECT id, created_at AS due_at FROM tasks
            WHERE status = 'pending' AND version = 0 AND not_before IS NULL {filter}
            ORDER BY created_at, id LIMIT ?2)
        UNION ALL
        SELECT id, due_at FROM (SELECT id, not_before AS due_at FROM tasks
            WHERE status = 'pending' AND not_before IS NOT NULL AND not_before <= ?1 {filter}
            ORDER BY not_before LIMIT ?2)
        UNION ALL
        SELECT id, due_at FROM (SELECT id, lease_until AS due_at FROM tasks
            WHERE status = 'running' AND lease_until <= ?1 {filter}
            ORDER BY lease_until LIMIT ?2))
    ORDER BY due_at, id LIMIT ?2";

/// ?1 now, ?2 limit: terminal tasks past their retention, soonest expired first.
pub(crate) const EXPIRED: &str = "SELECT id FROM tasks
    WHERE status IN ('completed', 'failed', 'cancelled') AND expires_at <= ?1
    ORDER BY expires_at LIMIT ?2";

/// ?1 task id: a purged task's rows, children first.
pub(crate) const PURGE: [&str; 5] = [
    "DELETE FROM attempts WHERE task_id = ?1",
    "DELETE FROM reopenings WHERE task_id = ?1",
    "DELETE FROM handoffs WHERE task_id = ?1",
    "DELETE FROM effects WHERE task_id = ?1",
    "DELETE FROM tasks WHERE id = ?1",
];

/// The summary columns (a task's without payload and response).
pub(crate) const SUMMARY_COLUMNS: &str = "id, scope, operation, request_key, input_hash, status, version,
    max_attempts, initial_backoff_ns, max_backoff_ns, multiplier, jitter, deadline_ns, on_ambiguous,
    acceptance, budget_base, budget_started_at, lease_until, not_before, last_error, created_at,
    finished_at, expires_at, trace_context, concurrency_key, concurrency_limit, rate_bucket";

/// ?1 cutoff (now less `older_than`), ?2 limit: never-claimed pending tasks
/// submitted and last reopened before the cutoff, with no handoff published
/// since, oldest first.
pub(crate) const STRANDED: &str = "SELECT {cols} FROM tasks AS t
    WHERE t.status = 'pending' AND t.version = 0 AND t.created_at < ?1
      AND (t.not_before IS NULL OR t.not_before < ?1)
      AND NOT EXISTS (SELECT 1 FROM handoffs AS h WHERE h.task_id = t.id AND h.published_at >= ?1)
    ORDER BY t.created_at, t.id LIMIT ?2";

/// The pending and running tasks (`Inspect::depth`): `tasks_status_id`'s
/// entries of those two statuses, never the finished tasks kept for their
/// retention.
pub(crate) const LIVE: &str = "SELECT {cols} FROM tasks WHERE status IN ('pending', 'running')";

/// ?1 scope (NULL: every scope): tasks by status.
pub(crate) const COUNTS: &str =
    "SELECT status, count(*) AS n FROM tasks WHERE ?1 IS NULL OR scope = ?1 GROUP BY status";

/// ?1 status, ?2 scope (NULL: every scope), ?3 cap: one status counted up to the cap.
pub(crate) const COUNT_UP_TO: &str = "SELECT count(*) FROM (SELECT 1 FROM tasks
    WHERE status = ?1 AND (?2 IS NULL OR scope = ?2) LIMIT ?3)";

/// ?1 bucket name, ?2 its new schedule.
pub(crate) const SET_SCHEDULE: &str = "UPDATE buckets SET schedule = ?2 WHERE name = ?1";

/// ?1 name, ?2 rate, ?3 period, ?4 burst, ?5 interval, ?6 tolerance: a
/// bucket defined, or its definition changed with its schedule kept.
pub(crate) const DEFINE_BUCKET: &str =
    "INSERT INTO buckets (name, rate, period_ns, burst, interval_ns, tolerance_ns, schedule)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, NULL)
    ON CONFLICT (name) DO UPDATE SET rate = excluded.rate, period_ns = excluded.period_ns,
        burst = excluded.burst, interval_ns = excluded.interval_ns, tolerance_ns = excluded.tolerance_ns";

/// ?1 name.
pub(crate) const BUCKET: &str = "SELECT * FROM buckets WHERE name = ?1";

/// Every bucket, by name.
pub(crate) const BUCKETS: &str = "SELECT * FROM buckets ORDER BY name";

/// ?1 key, ?2 now: the key's tasks holding a live lease (its slots in
/// use), by submission order.
pub(crate) const KEY_RUNNING: &str = "SELECT id FROM tasks
    WHERE concurrency_key = ?1 AND status = 'running' AND lease_until > ?2 ORDER BY key_order";

/// ?1 key: the key's first unfinished task by submission order (NULL:
/// none). `INDEXED BY` its partial index, which holds unfinished tasks
/// only: the index of every task of the key (which the planner, without
/// statistics, may take) would step over its finished ones first.
pub(crate) const KEY_FIRST_UNFINISHED: &str = "SELECT id FROM tasks INDEXED BY tasks_key_unfinished
    WHERE concurrency_key = ?1 AND status IN ('pending', 'running') ORDER BY key_order LIMIT 1";

/// ?1 key: the key's pending tasks (due or backing off).
pub(crate) const KEY_WAITING: &str =
    "SELECT count(*) FROM tasks WHERE concurrency_key = ?1 AND status = 'pending'";

/// Whether any task naming a concurrency key is unfinished: if none is,
/// `claim_next`'s plain oldest-due-first scan is already the fair order.
/// One step into the keyed tasks' partial index (never a scan of the
/// unfinished tasks without a key).
pub(crate) const ANY_KEY_UNFINISHED: &str =
    "SELECT EXISTS (SELECT 1 FROM tasks INDEXED BY tasks_key_unfinished
    WHERE concurrency_key IS NOT NULL AND status IN ('pending', 'running'))";

/// The condition, appended to each of `claim_next`'s scans, that skips a
/// task whose rate bucket has no token at ?1: the bucket's schedule, less
/// its tolerance, is in the future ([`take_token`](crate::backend::rules::take_token)'s test).
pub(crate) const HAS_TOKEN: &str = " AND (tasks.rate_bucket IS NULL OR NOT EXISTS (SELECT 1 FROM buckets AS b
    WHERE b.name = tasks.rate_bucket AND b.schedule - b.tolerance_ns > ?1))";

/// `claim_next`'s scan when tasks naming concurrency keys are unfinished:
/// every task that needs a worker at ?1 (as in [`NEEDING_WORKER`], the
/// caller's filters at `{filter}`), less those its key refuses at ?1 (as
/// many of the key's tasks hold a live lease as the task's limit, or a
/// limit-1 key's older task is unfinished), offered round-robin by key
/// ([`fair_order`](crate::backend::rules::fair_order): each ranked by its
/// turn within its key, then by how long it has been due), up to ?2.
pub(crate) const NEEDING_WORKER_FAIR: &str = "SELECT id, due_at FROM (
        SELECT id, due_at,
            CASE WHEN concurrency_key IS NULL THEN 1
                 ELSE row_number() OVER (PARTITION BY concurrency_key ORDER BY due_at, id) END AS turn
        FROM (
            SELECT id, created_at AS due_at, concurrency_key, concurrency_limit, key_order FROM tasks
                WHERE status = 'pending' AND version = 0 AND not_before IS NULL {filter}
            UNION ALL
            SELECT id, not_before, concurrency_key, concurrency_limit, key_order FROM tasks
                WHERE status = 'pending' AND not_before IS NOT NULL AND not_before <= ?1 {filter}
            UNION ALL
            SELECT id, lease_until, concurrency_key, concurrency_limit, key_order FROM tasks
                WHERE status = 'running' AND lease_until <= ?1 {filter}) AS due
        WHERE due.concurrency_key IS NULL OR (
            (SELECT count(*) FROM tasks AS r WHERE r.concurrency_key = due.concurrency_key
                AND r.status = 'running' AND r.lease_until > ?1) < due.concurrency_limit
            AND (due.concurrency_limit > 1 OR due.key_order = (SELECT min(o.key_order) FROM tasks AS o INDEXED BY tasks_key_unfinished
                WHERE o.concurrency_key = due.concurrency_key AND o.status IN ('pending', 'running')))))
    ORDER BY turn, due_at, id LIMIT ?2";

/// The newest migration recorded (NULL: none).
pub(crate) const SCHEMA_VERSION: &str = "SELECT max(version) FROM taskfence_migrations";
