-- A host application's own migration, managed by `sqlx migrate` (table `_sqlx_migrations`).
CREATE TABLE messages (
    id      bigint PRIMARY KEY,
    body    text NOT NULL,
    task_id uuid
);
