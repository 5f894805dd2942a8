-- taskfence SQLite 0002: concurrency keys and rate buckets.
--
-- Plain SQLite SQL, run after 0001 on the same file: an existing database
-- upgrades in place, its tasks kept (they name no limit: the new columns
-- are NULL).
--
-- A task's limits are columns of its own row, not a side table: every claim
-- reads the task's row anyway (so the limits come with that one read), and
-- the claim's question, "how many tasks of this key hold a live lease", is
-- about the status and lease of tasks rows: a partial index of `tasks`
-- answers it alone, where a side table would need a join per count.

-- The concurrency key and its limit (both NULL, or both set).
ALTER TABLE tasks ADD COLUMN concurrency_key TEXT;
ALTER TABLE tasks ADD COLUMN concurrency_limit INTEGER
    CHECK (concurrency_limit IS NULL OR concurrency_limit >= 1);
-- The task's place in its key's submission order: one more than the key's
-- last, given under the write lock, so two tasks submitted in one instant
-- still have an order (limit 1 runs them in it).
ALTER TABLE tasks ADD COLUMN key_order INTEGER;
-- The rate bucket each claim takes a token from.
ALTER TABLE tasks ADD COLUMN rate_bucket TEXT;

-- Live leases per key: the claim counts its key's running tasks whose lease
-- has not expired.
CREATE INDEX tasks_key_lease ON tasks (concurrency_key, lease_until)
    WHERE status = 'running' AND concurrency_key IS NOT NULL;
-- A limit-1 key's first unfinished task, by submission order.
CREATE INDEX tasks_key_unfinished ON tasks (concurrency_key, key_order)
    WHERE status IN ('pending', 'running') AND concurrency_key IS NOT NULL;
-- Every task of a key by submission order: the next submission's place,
-- and each place given once.
CREATE UNIQUE INDEX tasks_key_order ON tasks (concurrency_key, key_order)
    WHERE concurrency_key IS NOT NULL;

-- The rate buckets: the definition, and the one instant the generic cell
-- rate algorithm keeps (`schedule`, NULL before the first token). The
-- interval and tolerance are the definition's, stored so `claim_next` can
-- skip a bucket without a token in SQL.
CREATE TABLE buckets (
    name         TEXT PRIMARY KEY NOT NULL,
    rate         INTEGER NOT NULL CHECK (rate >= 1),
    period_ns    INTEGER NOT NULL CHECK (period_ns > 0),
    burst        INTEGER NOT NULL CHECK (burst >= 1),
    interval_ns  INTEGER NOT NULL CHECK (interval_ns > 0),
    tolerance_ns INTEGER NOT NULL CHECK (tolerance_ns >= 0),
    schedule     INTEGER
) WITHOUT ROWID;
