-- taskfence 0007: tasks that need no broker.
--
-- Run with `search_path` set to taskfence's schema, as 0001.
--
-- A task submitted for the store's own consumers (`claim_next`) needs no
-- handoff row: `handoff` says whether submit, reopen and redispatch write
-- one. Every existing task keeps its outbox (a constant default: no rewrite).
ALTER TABLE tasks ADD COLUMN handoff boolean NOT NULL DEFAULT true;
