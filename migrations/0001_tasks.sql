-- taskfence 0001: tasks, attempts, handoffs and the store clock.
--
-- Object names are unqualified on purpose: run this file with `search_path`
-- set to the schema that should hold them (default `taskfence`), e.g.
--
--     CREATE SCHEMA IF NOT EXISTS taskfence;
--     SET search_path TO taskfence;
--     \i 0001_tasks.sql
--
-- The embedded runner (`taskfence::postgres::migrate`) does exactly that inside
-- one transaction, under an advisory lock, and records the file in its own
-- `taskfence_migrations` table in the same schema.

-- Every statement reads time through this function: the store's clock.
-- `clock_timestamp()` (not `now()`): it is read when called, so a guard
-- evaluated after a row lock was granted sees the time after the wait.
-- VOLATILE keeps PostgreSQL from folding it into a single value per statement.
-- Test fixtures redefine it with an offset to move the clock without sleeping;
-- in production it is exactly `clock_timestamp()`.
CREATE FUNCTION store_clock() RETURNS timestamptz
    LANGUAGE sql VOLATILE PARALLEL SAFE
    AS $$ SELECT clock_timestamp() $$;

CREATE TABLE tasks (
    id                 uuid PRIMARY KEY,
    scope              text NOT NULL,
    operation          text NOT NULL,
    request_key        text NOT NULL,
    input_hash         bytea NOT NULL CHECK (octet_length(input_hash) = 32),
    payload            bytea NOT NULL,
    status             text NOT NULL
                       CHECK (status IN ('pending', 'running', 'completed', 'failed', 'cancelled')),
    -- The fencing token: +1 on every claim, so it is also the number of attempts.
    version            bigint NOT NULL DEFAULT 0 CHECK (version >= 0),
    -- The retry policy, stored with the task so redelivery never resets it.
    max_attempts       integer NOT NULL CHECK (max_attempts >= 1),
    initial_backoff_ns bigint NOT NULL CHECK (initial_backoff_ns > 0),
    max_backoff_ns     bigint NOT NULL CHECK (max_backoff_ns > 0),
    multiplier         double precision NOT NULL,
    jitter             double precision NOT NULL,
    deadline_ns        bigint CHECK (deadline_ns > 0),
    on_ambiguous       text NOT NULL CHECK (on_ambiguous IN ('retry', 'stop')),
    -- created_at + deadline, precomputed so claims compare it with the clock.
    deadline_at        timestamptz,
    lease_until        timestamptz,
    not_before         timestamptz,
    response           bytea,
    last_error         text,
    created_at         timestamptz NOT NULL,
    finished_at        timestamptz,
    expires_at         timestamptz NOT NULL,
    CONSTRAINT tasks_request_key UNIQUE (scope, operation, request_key),
    CONSTRAINT tasks_response_iff_completed CHECK ((status = 'completed') = (response IS NOT NULL)),
    CONSTRAINT tasks_lease_iff_running CHECK ((status = 'running') = (lease_until IS NOT NULL))
);

-- Partial indexes: each holds only the rows a scan is looking for, so the cost
-- of `due` and `purge_expired` follows the number of due rows, not the table.
CREATE INDEX tasks_running_lease ON tasks (lease_until) WHERE status = 'running';
CREATE INDEX tasks_pending_backoff ON tasks (not_before) WHERE status = 'pending' AND not_before IS NOT NULL;
CREATE INDEX tasks_terminal_expiry ON tasks (expires_at) WHERE status IN ('completed', 'failed', 'cancelled');

CREATE TABLE attempts (
    task_id      uuid NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    number       integer NOT NULL CHECK (number >= 1),
    id           uuid NOT NULL UNIQUE,
    worker       text NOT NULL,
    started_at   timestamptz NOT NULL,
    finished_at  timestamptz,
    outcome      text NOT NULL CHECK (outcome IN ('running', 'completed', 'failed_retryable',
                     'failed_permanent', 'failed_ambiguous', 'released', 'expired', 'cancelled')),
    operation_id text,
    error        text,
    PRIMARY KEY (task_id, number)
);

-- The transactional outbox: one row per submitted task, written by the same
-- statement as the task, published by the dispatcher.
CREATE TABLE handoffs (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id      uuid NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    created_at   timestamptz NOT NULL,
    published_at timestamptz
);

CREATE INDEX handoffs_unpublished ON handoffs (id) WHERE published_at IS NULL;
CREATE INDEX handoffs_task ON handoffs (task_id);
