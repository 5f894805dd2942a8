-- taskfence 0002: the acceptance rule, stored with each task.
--
-- Run with `search_path` set to taskfence's schema, as 0001.
--
-- Which attempts may save the response, chosen at submission and never
-- changed: only the current assignment with a live lease (the default, and
-- what every task created before this migration keeps), or the first answer
-- from any attempt that held a lease.
ALTER TABLE tasks
    ADD COLUMN acceptance text NOT NULL DEFAULT 'current_assignment'
        CHECK (acceptance IN ('current_assignment', 'first_valid_answer'));

-- An attempt still holding its lease when an earlier attempt's answer was
-- saved (first-valid-answer tasks only) ends as `overtaken`.
ALTER TABLE attempts DROP CONSTRAINT attempts_outcome_check;
ALTER TABLE attempts ADD CONSTRAINT attempts_outcome_check
    CHECK (outcome IN ('running', 'completed', 'failed_retryable', 'failed_permanent',
                       'failed_ambiguous', 'released', 'expired', 'cancelled', 'overtaken'));
