-- The chat application's own tables, applied once by `sqlx::migrate!`
-- (src/db.rs) and recorded in `_sqlx_migrations`. Unqualified on purpose: they
-- and that history table are created in the first schema of the connection's
-- `search_path` (CHAT_API_SCHEMA, else `public`; each test uses a schema of its
-- own). taskfence's tables and history live in their own schema (`taskfence`),
-- written by PgStore with qualified names. Change the schema with a new file:
-- an applied migration must never be edited (sqlx checks its checksum).
--
-- No unique key here carries idempotency: the reply task's request key
-- (scope = user, operation = 'chat.reply', key = Idempotency-Key) is the
-- unique constraint, and these rows commit or roll back with the task.

-- What the user typed: one row per accepted press of Send.
CREATE TABLE messages (
    id              uuid PRIMARY KEY,
    user_id         text NOT NULL,
    conversation_id text NOT NULL,
    content         text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX messages_conversation ON messages (user_id, conversation_id, created_at);

-- Every reply task and the message it answers: the one Send created, and one
-- per Regenerate. Not a foreign key to taskfence's tasks: those are purged
-- after their retention window, the conversation is not.
CREATE TABLE reply_tasks (
    task_id    uuid PRIMARY KEY,
    message_id uuid NOT NULL REFERENCES messages (id),
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX reply_tasks_message ON reply_tasks (message_id);

-- The saved reply of a reply task. Written in the transaction that completes
-- the task (PgStore::complete_in), so it exists exactly when the task is
-- completed; the primary key makes a second reply for one task impossible.
CREATE TABLE replies (
    task_id  uuid PRIMARY KEY REFERENCES reply_tasks (task_id),
    content  text NOT NULL,
    attempt  integer NOT NULL CHECK (attempt >= 1),
    saved_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
