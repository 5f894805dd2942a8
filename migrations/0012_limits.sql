-- taskfence 0012: concurrency keys and rate buckets.
--
-- Run with `search_path` set to taskfence's schema, as 0001.
--
-- A task's limits are columns of its own row: every claim reads the row
-- anyway, and "how many tasks of this key hold a live lease" is a question
-- about the status and lease of `tasks` rows, which a partial index answers
-- alone. The columns are added without a default, so no row is rewritten;
-- every existing row names no limit (NULL). The CHECK is added NOT VALID:
-- it holds for every row written from now on, and every existing row has
-- NULL, so there is nothing to scan.
ALTER TABLE tasks
    ADD COLUMN concurrency_key text,
    ADD COLUMN concurrency_limit integer,
    -- The task's place in its key's submission order (from
    -- `tasks_key_order_seq`): a submission that returned before another
    -- began has the smaller place, so limit 1 runs a key's tasks in the
    -- order they were submitted.
    ADD COLUMN key_order bigint,
    ADD COLUMN rate_bucket text;
ALTER TABLE tasks ADD CONSTRAINT tasks_concurrency_check
    CHECK ((concurrency_key IS NULL) = (concurrency_limit IS NULL)
           AND (concurrency_key IS NULL) = (key_order IS NULL)
           AND (concurrency_limit IS NULL OR concurrency_limit >= 1)) NOT VALID;

-- Built inside the migration's transaction, which blocks writes to `tasks`
-- while they build (a scan of the table each). On a large table, build them
-- first with `CREATE INDEX CONCURRENTLY` under the same names and
-- definitions; then these statements find them and do nothing.
--
-- Only tasks naming a limit enter these indexes (a claim, a completion or
-- a retry of any other task inserts nothing into them).
--
-- Live leases per key: a claim counts its key's running tasks whose lease
-- has not expired.
CREATE INDEX IF NOT EXISTS tasks_key_lease ON tasks (concurrency_key, lease_until) WHERE status = 'running' AND concurrency_key IS NOT NULL;
-- Unfinished tasks naming a limit: whether `claim_next` must decide limits
-- at all (one step into it), and a limit-1 key's first unfinished task.
CREATE INDEX IF NOT EXISTS tasks_limited_unfinished ON tasks (concurrency_key, key_order) WHERE status IN ('pending', 'running') AND (concurrency_key IS NOT NULL OR rate_bucket IS NOT NULL);
-- Every task of a key by submission order: each place given once.
CREATE UNIQUE INDEX IF NOT EXISTS tasks_key_order ON tasks (concurrency_key, key_order) WHERE concurrency_key IS NOT NULL;

-- Places in the keys' submission orders: one sequence for every key (a
-- place is only ever compared with places of the same key), drawn without
-- a lock, so submissions naming one key never wait for each other.
CREATE SEQUENCE tasks_key_order_seq AS bigint;

-- The rate buckets: the definition, and the one instant the generic cell
-- rate algorithm keeps (`schedule_ns`, nanoseconds since the Unix epoch,
-- exact as every backend's arithmetic is; NULL before the first token).
-- The interval and tolerance are the definition's, stored so `claim_next`
-- can skip a bucket without a token in SQL.
CREATE TABLE buckets (
    name         text PRIMARY KEY,
    rate         bigint NOT NULL CHECK (rate >= 1),
    period_ns    bigint NOT NULL CHECK (period_ns > 0),
    burst        bigint NOT NULL CHECK (burst >= 1),
    interval_ns  bigint NOT NULL CHECK (interval_ns > 0),
    tolerance_ns bigint NOT NULL CHECK (tolerance_ns >= 0),
    schedule_ns  bigint
);

-- Whether a task's limits allow a claim at `at`: its key has fewer live
-- leases than its limit and, at limit 1, it is the key's first unfinished
-- task; its bucket has a token (the schedule, less the tolerance, is not in
-- the future). `claim_next` skips the tasks it refuses in its scan; a claim
-- decides again under the limits' locks. A function, not a subquery in the
-- scan, so the planner prices it per task named a limit at its declared
-- cost, and the scan's plan stays small whatever the backlog; its body runs
-- with this schema's `search_path`, as the migration sets it.
CREATE FUNCTION limits_allow(p_key text, p_limit integer, p_place bigint, p_bucket text, p_at timestamptz)
    RETURNS boolean
    LANGUAGE plpgsql STABLE PARALLEL SAFE COST 20
    SET search_path FROM CURRENT
    AS $$
BEGIN
    IF p_key IS NOT NULL THEN
        IF (SELECT count(*) FROM tasks AS r
            WHERE r.concurrency_key = p_key AND r.status = 'running' AND r.lease_until > p_at) >= p_limit THEN
            RETURN false;
        END IF;
        IF p_limit = 1 AND p_place IS DISTINCT FROM (
            SELECT min(o.key_order) FROM tasks AS o
            WHERE o.concurrency_key = p_key AND o.status IN ('pending', 'running')) THEN
            RETURN false;
        END IF;
    END IF;
    IF p_bucket IS NOT NULL THEN
        RETURN coalesce((SELECT b.schedule_ns - b.tolerance_ns FROM buckets AS b WHERE b.name = p_bucket), 0)
               <= (extract(epoch FROM p_at) * 1000000000)::bigint;
    END IF;
    RETURN true;
END
$$;
