//! The dispatch suite (the outbox: the `handoffs` table) against `SqliteStore`.

taskfence::testing::dispatch_suite!(taskfence::testing::SqliteFixture::new());
