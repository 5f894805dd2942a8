-- taskfence SQLite 0001: tasks, attempts, reopenings, handoffs, effects.
--
-- Plain SQLite SQL: any tool can run it on an empty database file. The
-- embedded runner (`taskfence::sqlite::migrate`) runs it inside one
-- `BEGIN IMMEDIATE` transaction and records it in `taskfence_migrations`.
--
-- Instants are INTEGER nanoseconds since the Unix epoch, UTC (exact, and they
-- sort as numbers); ids are 16-byte UUID BLOBs (v7: they sort by creation).

CREATE TABLE tasks (
    id                 BLOB PRIMARY KEY NOT NULL CHECK (length(id) = 16),
    scope              TEXT NOT NULL,
    operation          TEXT NOT NULL,
    request_key        TEXT NOT NULL,
    input_hash         BLOB NOT NULL CHECK (length(input_hash) = 32),
    payload            BLOB NOT NULL,
    status             TEXT NOT NULL
                       CHECK (status IN ('pending', 'running', 'completed', 'failed', 'cancelled')),
    -- The fencing token: +1 on every claim, so it is also the number of attempts.
    version            INTEGER NOT NULL CHECK (version >= 0),
    -- The retry policy, stored with the task so redelivery never resets it.
    max_attempts       INTEGER NOT NULL CHECK (max_attempts >= 1),
    initial_backoff_ns INTEGER NOT NULL CHECK (initial_backoff_ns > 0),
    max_backoff_ns     INTEGER NOT NULL CHECK (max_backoff_ns > 0),
    multiplier         REAL NOT NULL,
    jitter             REAL NOT NULL,
    deadline_ns        INTEGER CHECK (deadline_ns > 0),
    on_ambiguous       TEXT NOT NULL CHECK (on_ambiguous IN ('retry', 'stop')),
    acceptance         TEXT NOT NULL CHECK (acceptance IN ('current_assignment', 'first_valid_answer')),
    budget_base        INTEGER NOT NULL,
    budget_started_at  INTEGER NOT NULL,
    lease_until        INTEGER,
    not_before         INTEGER,
    response           BLOB,
    last_error         TEXT,
    created_at         INTEGER NOT NULL,
    finished_at        INTEGER,
    expires_at         INTEGER NOT NULL,
    trace_context      TEXT,
    -- Whether submit, reopen and redispatch write a handoff for a dispatcher.
    handoff            INTEGER NOT NULL CHECK (handoff IN (0, 1)),
    CONSTRAINT tasks_request_key UNIQUE (scope, operation, request_key),
    CONSTRAINT tasks_response_iff_completed CHECK ((status = 'completed') = (response IS NOT NULL)),
    CONSTRAINT tasks_lease_iff_running CHECK ((status = 'running') = (lease_until IS NOT NULL))
);

-- Partial indexes: each holds only the rows a scan looks for, so `due`,
-- `claim_next`, `stranded` and `purge_expired` cost what is due, not the table.
CREATE INDEX tasks_running_lease ON tasks (lease_until) WHERE status = 'running';
CREATE INDEX tasks_pending_backoff ON tasks (not_before) WHERE status = 'pending' AND not_before IS NOT NULL;
CREATE INDEX tasks_unclaimed ON tasks (created_at, id) WHERE status = 'pending' AND version = 0;
CREATE INDEX tasks_terminal_expiry ON tasks (expires_at) WHERE status IN ('completed', 'failed', 'cancelled');
-- Listings: keyset pages in id order, per filter.
CREATE INDEX tasks_status_id ON tasks (status, id);
CREATE INDEX tasks_scope_id ON tasks (scope, id, status);
CREATE INDEX tasks_operation_id ON tasks (operation, id);

-- Every attempt of every task: the claim writes it, the attempt's end updates it.
CREATE TABLE attempts (
    task_id      BLOB NOT NULL,
    number       INTEGER NOT NULL CHECK (number >= 1),
    id           BLOB NOT NULL UNIQUE,
    worker       TEXT NOT NULL,
    started_at   INTEGER NOT NULL,
    finished_at  INTEGER,
    outcome      TEXT NOT NULL CHECK (outcome IN ('running', 'completed', 'failed_retryable',
                     'failed_permanent', 'failed_ambiguous', 'released', 'returned_unstarted', 'expired',
                     'cancelled', 'overtaken')),
    operation_id TEXT,
    error        TEXT,
    PRIMARY KEY (task_id, number)
) WITHOUT ROWID;

-- One row per operator's retry: who, why, when, from which status, at which version.
CREATE TABLE reopenings (
    task_id     BLOB NOT NULL,
    number      INTEGER NOT NULL CHECK (number >= 1),
    at          INTEGER NOT NULL,
    by          TEXT NOT NULL,
    reason      TEXT NOT NULL,
    from_status TEXT NOT NULL CHECK (from_status IN ('failed', 'cancelled')),
    version     INTEGER NOT NULL CHECK (version >= 0),
    PRIMARY KEY (task_id, number)
) WITHOUT ROWID;

-- The transactional outbox: written in the same transaction as its task.
CREATE TABLE handoffs (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id      BLOB NOT NULL,
    created_at   INTEGER NOT NULL,
    published_at INTEGER
);
CREATE INDEX handoffs_task ON handoffs (task_id, id);
CREATE INDEX handoffs_unpublished ON handoffs (id) WHERE published_at IS NULL;

-- The effect journal: one row per external effect of a task.
CREATE TABLE effects (
    task_id     BLOB NOT NULL,
    name        TEXT NOT NULL,
    state       TEXT NOT NULL CHECK (state IN ('intended', 'done', 'failed')),
    version     INTEGER NOT NULL,
    attempt     INTEGER NOT NULL,
    reference   TEXT,
    error       TEXT,
    ambiguous   INTEGER NOT NULL DEFAULT 0,
    created_at  INTEGER NOT NULL,
    intended_at INTEGER NOT NULL,
    settled_at  INTEGER,
    PRIMARY KEY (task_id, name)
) WITHOUT ROWID;
