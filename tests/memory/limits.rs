//! The limits suite (concurrency keys, rate buckets) on `MemoryStore`.

taskfence::testing::limits_suite!(async { taskfence::testing::MemoryFixture::new() });
