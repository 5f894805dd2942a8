//! The inspection suite (listings, counts, stories, stranded tasks) against
//! `MemoryStore`.

taskfence::testing::inspection_suite!(async { taskfence::testing::MemoryFixture::new() });
