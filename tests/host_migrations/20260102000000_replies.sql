CREATE TABLE replies (
    message_id bigint PRIMARY KEY REFERENCES messages (id),
    body       text NOT NULL
);
