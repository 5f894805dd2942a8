-- taskfence 0006: handoffs keyed by their task.
--
-- Run with `search_path` set to taskfence's schema, as 0001.
--
-- Every lookup of `handoffs` but the dispatcher's starts from a task
-- (`stranded`, `story`, `purge_expired`), and the dispatcher reads only
-- unpublished rows (`handoffs_unpublished`). One index keyed
-- `(task_id, id)` serves the first and keeps ids unique, where the primary
-- key on `id` and `handoffs_task (task_id)` were two entries per handoff.
ALTER TABLE handoffs DROP CONSTRAINT handoffs_pkey;
ALTER TABLE handoffs ADD CONSTRAINT handoffs_pkey PRIMARY KEY (task_id, id);
DROP INDEX handoffs_task;
