//! The inspection suite (listings, counts, stories, stranded tasks) against `MemoryStore`.

taskfence::inspection_suite!(async { taskfence::testing::MemoryFixture::new() });
