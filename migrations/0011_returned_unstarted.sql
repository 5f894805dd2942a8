-- taskfence 0011: an attempt given back before its work began.
--
-- Run with `search_path` set to taskfence's schema, as 0001.
--
-- A claim whose work never began (a prefetched task at a consumer's stop)
-- can be given back as `returned_unstarted`: the release refunds it to the
-- retry budget (raising `budget_base` by one in the same write) and the
-- attempt journal records this outcome. The claim that takes the task next
-- moves that attempt into `attempts`, whose CHECK must allow it.
ALTER TABLE attempts DROP CONSTRAINT attempts_outcome_check;
ALTER TABLE attempts ADD CONSTRAINT attempts_outcome_check
    CHECK (outcome IN ('running', 'completed', 'failed_retryable', 'failed_permanent',
                       'failed_ambiguous', 'released', 'returned_unstarted', 'expired',
                       'cancelled', 'overtaken'));
