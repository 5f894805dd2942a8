-- taskfence 0004: no foreign keys from attempts and handoffs to tasks.
--
-- Run with `search_path` set to taskfence's schema, as 0001.
--
-- Each insert of an attempt (every claim) or a handoff (every submit) ran the
-- foreign-key check, a query of its own that reads the task row and locks it
-- FOR KEY SHARE. The rows it guarded against cannot arise: a handoff is
-- written by the statement that creates its task, an attempt by the statement
-- that claims it while holding its row lock, and `purge_expired` deletes a
-- task's attempts and handoff in the same statement as the task (what
-- ON DELETE CASCADE did). Delete tasks by hand only together with their rows
-- in `attempts` and `handoffs`.
ALTER TABLE attempts DROP CONSTRAINT attempts_task_id_fkey;
ALTER TABLE handoffs DROP CONSTRAINT handoffs_task_id_fkey;
