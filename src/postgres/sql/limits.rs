//! The statements of concurrency keys and rate buckets (`ops::limits`).
//!
//! A claim of a task naming a limit runs in a transaction of its own (a
//! savepoint in the caller's): it takes its key's lock, then its bucket's
//! row lock, then reads the task and the store clock, decides with the
//! rules every backend shares, and writes the claim and the bucket's new
//! schedule. Every claim of a key takes the key's lock, so no two decide
//! on the same count of live leases; the lock is an advisory lock of the
//! transaction (nothing written, nothing to vacuum), keyed by a hash of
//! the schema and the key.

use super::Sql;

/// How many times its page `claim_next`'s scan reads of each kind of due
/// task naming no key (never claimed, backoff passed, lease expired) that
/// its limits allow, oldest first: it bounds the scan's cost whatever the
/// backlog of tasks without a key. Tasks naming a key are read key by key,
/// up to a page of each, so a key with a thousand due tasks never hides a
/// key with one.
const WINDOW: u32 = 8;

/// The limits' statements of one store, for one schema.
#[derive(Debug)]
pub(crate) struct Limits {
    /// $1 key. Waits for the key's lock, held to the transaction's end.
    pub(crate) lock_key: Sql,
    /// $1 bucket name. The bucket, its row locked to the transaction's end.
    pub(crate) lock_bucket: Sql,
    /// $1 key, $2 now. How many of the key's tasks hold a live lease at
    /// $2, and its first unfinished task by submission order.
    pub(crate) key_load: Sql,
    /// $1 key. The key's tasks holding a live lease on the store's clock,
    /// by submission order.
    pub(crate) key_running: Sql,
    /// $1 key. How many of the key's tasks are pending.
    pub(crate) key_waiting: Sql,
    /// $1 bucket name. Whether it is defined.
    pub(crate) bucket_defined: Sql,
    /// $1 name, $2 rate, $3 period, $4 burst, $5 interval, $6 tolerance
    /// (nanoseconds). Defines the bucket, or changes its definition and
    /// keeps its schedule.
    pub(crate) define_bucket: Sql,
    /// $1 name, $2 schedule (nanoseconds since the Unix epoch).
    pub(crate) set_schedule: Sql,
    /// Every bucket, by name.
    pub(crate) buckets: Sql,
    /// The store's clock.
    pub(crate) store_now: Sql,
    /// $1 page, $2 operations, $3 scopes (empty: any). `claim_next`'s scan
    /// while tasks naming limits are unfinished: the tasks (id and limits) that
    /// need a worker, less those their limits refuse now (their key has as
    /// many live leases as its limit, a limit-1 key's older task is
    /// unfinished, their bucket has no token): of each key with unfinished
    /// tasks (found one index step per key) up to a page of its due tasks by
    /// submission order, and of the tasks naming no key the oldest [`WINDOW`]
    /// pages of each kind; offered round-robin by key (`rules::fair_order`:
    /// each ranked by its turn within its key, then by how long it has been
    /// due). No row is locked: each is then claimed alone, under its locks.
    /// Its cost grows with the number of keys that have unfinished tasks,
    /// not with their backlogs.
    pub(crate) needing_worker: Sql,
}

impl Limits {
    /// The statements for schema `s`; `wanted` is the condition on `t`
    /// that keeps the tasks of the operations ($2) and scopes ($3) asked for.
    pub(crate) fn new(s: &str, wanted: &str) -> Self {
        // What a task's limits allow at the scan's clock (`limits_allow`,
        // migration 0012); a task naming none is not asked.
        let allowed = format!(
            "((t.concurrency_key IS NULL AND t.rate_bucket IS NULL)
              OR {s}.limits_allow(t.concurrency_key, t.concurrency_limit, t.key_order, t.rate_bucket,
                                  (SELECT now FROM clock)))"
        );
        // One kind of due task naming no key (a bucket at most), oldest
        // first along its partial index, the ones their limits allow, up to
        // the window.
        let branch = |due_at: &str, condition: &str, order: &str| {
            format!(
                "(SELECT t.id, {due_at} AS due_at, t.concurrency_key, t.concurrency_limit, t.rate_bucket
                  FROM {s}.tasks AS t
                  WHERE {condition} AND t.concurrency_key IS NULL AND {wanted} AND {allowed}
                  ORDER BY {order} LIMIT $1 * {WINDOW})"
            )
        };
        // An unfinished task naming a limit: the predicate of
        // `tasks_limited_unfinished`, so the keys' scans read that index.
        let unfinished = "t.status IN ('pending', 'running') \
                          AND (t.concurrency_key IS NOT NULL OR t.rate_bucket IS NOT NULL)";
        Self {
            lock_key: Sql::from(format!(
                "SELECT pg_advisory_xact_lock(hashtextextended('taskfence {s} ' || $1::text, 0))"
            )),
            lock_bucket: Sql::from(format!(
                "SELECT name, rate, period_ns, burst, schedule_ns FROM {s}.buckets WHERE name = $1 FOR NO KEY UPDATE"
            )),
            key_load: Sql::from(format!(
                "SELECT (SELECT count(*) FROM {s}.tasks
                         WHERE concurrency_key = $1 AND status = 'running' AND lease_until > $2) AS running,
                        (SELECT id FROM {s}.tasks
                         WHERE concurrency_key = $1 AND status IN ('pending', 'running')
                         ORDER BY key_order LIMIT 1) AS first_unfinished"
            )),
            key_running: Sql::from(format!(
                "SELECT id FROM {s}.tasks
                 WHERE concurrency_key = $1 AND status = 'running' AND lease_until > {s}.store_clock()
                 ORDER BY key_order"
            )),
            key_waiting: Sql::from(format!(
                "SELECT count(*) FROM {s}.tasks WHERE concurrency_key = $1 AND status = 'pending'"
            )),
            bucket_defined: Sql::from(format!(
                "SELECT EXISTS (SELECT 1 FROM {s}.buckets WHERE name = $1)"
            )),
            define_bucket: Sql::from(format!(
                "INSERT INTO {s}.buckets (name, rate, period_ns, burst, interval_ns, tolerance_ns)
                 VALUES ($1, $2, $3, $4, $5, $6)
                 ON CONFLICT (name) DO UPDATE SET rate = EXCLUDED.rate, period_ns = EXCLUDED.period_ns,
                     burst = EXCLUDED.burst, interval_ns = EXCLUDED.interval_ns,
                     tolerance_ns = EXCLUDED.tolerance_ns"
            )),
            set_schedule: Sql::from(format!("UPDATE {s}.buckets SET schedule_ns = $2 WHERE name = $1")),
            buckets: Sql::from(format!(
                "SELECT name, rate, period_ns, burst, schedule_ns FROM {s}.buckets ORDER BY name"
            )),
            store_now: Sql::from(format!("SELECT {s}.store_clock() AS store_now")),
            needing_worker: Sql::from(format!(
                "WITH RECURSIVE clock AS MATERIALIZED (SELECT {s}.store_clock() AS now),
                keys AS (
                    (SELECT t.concurrency_key AS k FROM {s}.tasks AS t
                     WHERE {unfinished} AND t.concurrency_key IS NOT NULL
                     ORDER BY t.concurrency_key LIMIT 1)
                    UNION ALL
                    SELECT (SELECT t.concurrency_key FROM {s}.tasks AS t
                            WHERE {unfinished} AND t.concurrency_key > keys.k
                            ORDER BY t.concurrency_key LIMIT 1)
                    FROM keys WHERE keys.k IS NOT NULL),
                keyed AS (
                    SELECT d.* FROM keys, LATERAL (
                        SELECT t.id,
                               CASE WHEN t.status = 'running' THEN t.lease_until
                                    ELSE coalesce(t.not_before, t.created_at) END AS due_at,
                               t.concurrency_key, t.concurrency_limit, t.rate_bucket
                        FROM {s}.tasks AS t
                        WHERE t.concurrency_key = keys.k AND {unfinished}
                          AND ((t.status = 'pending' AND t.version = 0 AND t.not_before IS NULL)
                               OR (t.status = 'pending' AND t.not_before <= (SELECT now FROM clock))
                               OR (t.status = 'running' AND t.lease_until <= (SELECT now FROM clock)))
                          AND {wanted} AND {allowed}
                        ORDER BY t.key_order LIMIT $1) AS d
                    WHERE keys.k IS NOT NULL)
                SELECT id, concurrency_key, concurrency_limit, rate_bucket FROM (
                    SELECT due.*,
                           CASE WHEN due.concurrency_key IS NULL THEN 1
                                ELSE row_number() OVER (PARTITION BY due.concurrency_key
                                                        ORDER BY due.due_at, due.id) END AS turn
                    FROM (SELECT * FROM keyed UNION ALL {fresh} UNION ALL {waiting} UNION ALL {expired}) AS due
                ) AS ranked
                ORDER BY turn, due_at, id LIMIT $1",
                fresh = branch(
                    "t.created_at",
                    "t.status = 'pending' AND t.version = 0 AND t.not_before IS NULL",
                    "t.created_at, t.id"
                ),
                waiting = branch(
                    "t.not_before",
                    "t.status = 'pending' AND t.not_before IS NOT NULL AND t.not_before <= (SELECT now FROM clock)",
                    "t.not_before"
                ),
                expired = branch(
                    "t.lease_until",
                    "t.status = 'running' AND t.lease_until <= (SELECT now FROM clock)",
                    "t.lease_until"
                ),
            )),
        }
    }

    /// Every statement by name, for `EXPLAIN` and review.
    pub(crate) fn all(&self) -> Vec<(&'static str, &str)> {
        vec![
            ("lock_key", self.lock_key.as_str()),
            ("lock_bucket", self.lock_bucket.as_str()),
            ("key_load", self.key_load.as_str()),
            ("key_running", self.key_running.as_str()),
            ("key_waiting", self.key_waiting.as_str()),
            ("bucket_defined", self.bucket_defined.as_str()),
            ("define_bucket", self.define_bucket.as_str()),
            ("set_schedule", self.set_schedule.as_str()),
            ("buckets", self.buckets.as_str()),
            ("store_now", self.store_now.as_str()),
            ("needing_worker_limited", self.needing_worker.as_str()),
        ]
    }
}
