-- taskfence 0003: what operators need — retry budgets, reopenings, and the
-- indexes of the listing, counting and stranded-task queries.
--
-- Run with `search_path` set to taskfence's schema, as 0001.

-- An operator's retry gives a failed or cancelled task a fresh budget: the
-- attempts counted against `max_attempts` are `version - budget_base`, the
-- deadline counts from `budget_started_at` (`deadline_at` is precomputed from
-- it). Every task created before this migration keeps its first budget:
-- `budget_started_at` NULL reads as `created_at`. `reopen_count` numbers the
-- reopenings under the task's row lock.
--
-- Constant defaults, no backfill and no CHECK: on a table of any size these
-- three columns are a catalog change, not a rewrite or a scan under the
-- migration's lock.
ALTER TABLE tasks
    ADD COLUMN budget_base bigint NOT NULL DEFAULT 0,
    ADD COLUMN budget_started_at timestamptz,
    ADD COLUMN reopen_count integer NOT NULL DEFAULT 0;

-- One row per retry: who, why, when, from which status, at which version.
CREATE TABLE reopenings (
    task_id     uuid NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    number      integer NOT NULL CHECK (number >= 1),
    at          timestamptz NOT NULL,
    by          text NOT NULL,
    reason      text NOT NULL,
    from_status text NOT NULL CHECK (from_status IN ('failed', 'cancelled')),
    version     bigint NOT NULL CHECK (version >= 0),
    PRIMARY KEY (task_id, number)
);

-- The indexes are built inside the migration's transaction, which blocks
-- writes to `tasks` while they build. On a large table, build them first with
-- `CREATE INDEX CONCURRENTLY` under the same names and definitions; then these
-- statements find them and do nothing.
--
-- Listings are keyset pages by id: each filter has an index in id order, so a
-- page reads about as many entries as it returns. The scope index carries the
-- status, so counting one scope is an index-only scan of that scope.
CREATE INDEX IF NOT EXISTS tasks_status_id ON tasks (status, id);
CREATE INDEX IF NOT EXISTS tasks_scope_id ON tasks (scope, id) INCLUDE (status);
-- Stranded candidates: pending tasks never claimed, oldest first. Partial: a
-- task leaves it at its first claim.
CREATE INDEX IF NOT EXISTS tasks_unclaimed ON tasks (created_at, id) WHERE status = 'pending' AND version = 0;
