-- taskfence 0009: the effect journal.
--
-- Run with `search_path` set to taskfence's schema, as 0001.
--
-- One row per external effect of a task (a notification, a charge): the
-- latest attempt's intent and, once known, its outcome. Written only by
-- fenced statements (the task's row is share-locked and checked in the same
-- statement), deleted by `purge_expired` with the task. No foreign key, as
-- `attempts` and `handoffs` (0004): the purge deletes children explicitly.
CREATE TABLE effects (
    task_id     uuid        NOT NULL,
    name        text        NOT NULL,
    state       text        NOT NULL,
    version     bigint      NOT NULL,
    attempt     integer     NOT NULL,
    reference   text,
    error       text,
    ambiguous   integer     NOT NULL DEFAULT 0,
    created_at  timestamptz NOT NULL,
    intended_at timestamptz NOT NULL,
    settled_at  timestamptz,
    PRIMARY KEY (task_id, name)
);
