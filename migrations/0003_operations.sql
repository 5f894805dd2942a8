-- taskfence 0003: what operators need — retry budgets, reopenings, and the
-- indexes of the listing, counting and stranded-task queries.
--
-- Run with `search_path` set to taskfence's schema, as 0001.

-- An operator's retry gives a failed or cancelled task a fresh budget: the
-- attempts counted against `max_attempts` are `version - budget_base`, the
-- deadline counts from `budget_started_at` (`deadline_at` is precomputed from
-- it). Every task created before this migration keeps its first budget.
-- `reopen_count` numbers the reopenings under the task's row lock.
ALTER TABLE tasks
    ADD COLUMN budget_base bigint NOT NULL DEFAULT 0 CHECK (budget_base >= 0),
    ADD COLUMN budget_started_at timestamptz,
    ADD COLUMN reopen_count integer NOT NULL DEFAULT 0 CHECK (reopen_count >= 0);
UPDATE tasks SET budget_started_at = created_at;
ALTER TABLE tasks ALTER COLUMN budget_started_at SET NOT NULL;

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

-- Listings are keyset pages by id: each filter has an index in id order, so a
-- page reads about as many entries as it returns. The scope index carries the
-- status, so counting one scope is an index-only scan of that scope.
CREATE INDEX tasks_status_id ON tasks (status, id);
CREATE INDEX tasks_scope_id ON tasks (scope, id) INCLUDE (status);
-- Stranded candidates: pending tasks never claimed, oldest first. Partial: a
-- task leaves it at its first claim.
CREATE INDEX tasks_unclaimed ON tasks (created_at, id) WHERE status = 'pending' AND version = 0;
