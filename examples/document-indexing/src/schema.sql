-- The application's own tables (not taskfence's). Names are unqualified: the
-- code runs this file with `search_path` set to the app's schema.

-- One row per document: which version readers see. `current_version` only
-- ever moves forward (the worker's `UPDATE … WHERE current_version < $v`).
CREATE TABLE IF NOT EXISTS documents (
    id              text PRIMARY KEY,
    current_version bigint NOT NULL DEFAULT 0 CHECK (current_version >= 0)
);

-- Every uploaded version, saved in the same transaction as its indexing task.
-- The content hash is the task's input hash: one version, one content, forever.
CREATE TABLE IF NOT EXISTS document_versions (
    document_id  text NOT NULL REFERENCES documents (id),
    version      bigint NOT NULL CHECK (version >= 1),
    content_hash bytea NOT NULL CHECK (octet_length(content_hash) = 32),
    body         text NOT NULL,
    PRIMARY KEY (document_id, version)
);

-- The effect a retry must not repeat: one entry per (document, version, chunk).
CREATE TABLE IF NOT EXISTS index_entries (
    document_id text NOT NULL,
    version     bigint NOT NULL,
    chunk       integer NOT NULL CHECK (chunk >= 0),
    body        text NOT NULL,
    PRIMARY KEY (document_id, version, chunk),
    FOREIGN KEY (document_id, version) REFERENCES document_versions (document_id, version)
);

-- What readers search: only the entries of each document's current version.
-- Entries of older versions (a late worker's, or superseded ones) stay stored
-- but are never visible.
CREATE OR REPLACE VIEW visible_entries AS
SELECT e.document_id, e.version, e.chunk, e.body
FROM index_entries e
JOIN documents d ON d.id = e.document_id AND d.current_version = e.version;
