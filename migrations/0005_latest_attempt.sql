-- taskfence 0005: each task's latest attempt in its row.
--
-- Run with `search_path` set to taskfence's schema, as 0001.
--
-- A task's latest attempt lives in its row: a claim starts it there, and
-- complete, fail, release and cancel end it there, in the same row write that
-- changes the task. `attempts` keeps the earlier ones: the claim that starts a
-- new attempt moves the previous one into it. A task that is claimed once and
-- completed writes no `attempts` row at all (it wrote one at the claim and
-- updated it at the end).
--
-- Nullable columns without defaults: catalog-only on a table of any size, and
-- no CHECK (the store's statements are the only writers). The running
-- attempts of the previous release move into their rows; the latest attempt
-- of every other task stays in `attempts`, where the statements find it
-- (a task whose row holds no attempt has its latest one in `attempts`, if
-- any). Stop the workers of the previous release before migrating.
ALTER TABLE tasks
    ADD COLUMN IF NOT EXISTS attempt_id uuid,
    ADD COLUMN IF NOT EXISTS attempt_worker text,
    ADD COLUMN IF NOT EXISTS attempt_started_at timestamptz,
    ADD COLUMN IF NOT EXISTS attempt_finished_at timestamptz,
    ADD COLUMN IF NOT EXISTS attempt_outcome text,
    ADD COLUMN IF NOT EXISTS attempt_operation_id text,
    ADD COLUMN IF NOT EXISTS attempt_error text;

UPDATE tasks AS t
SET attempt_id = a.id, attempt_worker = a.worker, attempt_started_at = a.started_at,
    attempt_outcome = 'running', attempt_operation_id = a.operation_id
FROM attempts AS a
WHERE a.task_id = t.id AND a.number = t.version AND a.finished_at IS NULL AND t.status = 'running';

DELETE FROM attempts AS a
USING tasks AS t
WHERE a.task_id = t.id AND a.id = t.attempt_id;
